"""Start-up: the flags, the home, the limits as one config, signals, the reaper thread."""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import threading
import time

from .app import SandboxServer
from .config import Config
from .execution.stopping import block_stop_signals, wait_for_stop
from .files.home import prepare_home
from .flags import parse_args

REAP_SECONDS = 1.0


def reap_forever(server: SandboxServer) -> None:
    """Background loop of the PID-1 orphan reaper."""
    while True:
        time.sleep(REAP_SECONDS)
        server.reap_orphans()


def stop_when_told(server: SandboxServer) -> None:
    """Background thread: shut down on the first stop signal from outside (``execution.stopping``);
    ``shutdown()`` waits for ``serve_forever()``, so it cannot run in the main thread."""
    wait_for_stop(server.supervisor.sent_from_below)
    server.shutdown()


def config_from(args: argparse.Namespace) -> Config:
    """The limits and defaults the flags fix, the umask's file mode among them (a default
    timeout above the cap is the cap; a negative queue is none)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return Config(
        workspace=args.workspace,
        max_upload=args.max_upload,
        max_output=args.max_output,
        default_timeout=min(args.default_timeout, args.max_timeout),
        max_timeout=args.max_timeout,
        file_mode=0o666 & ~umask,
        max_reply=args.max_reply,
        max_executes=args.max_executes,
        max_queued=max(args.max_queued, 0),
        max_connections=args.max_connections,
        max_connections_per_source=args.max_connections_per_source,
        max_executes_per_source=args.max_executes_per_source,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        spool_dir=args.spool_dir,
    )


def raise_open_files_limit() -> None:
    """The soft limit on open files up to the hard one: deep trees are deleted one descriptor
    per level (``files.paths.remove_tree``)."""
    with contextlib.suppress(ValueError, OSError):
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.workspace, exist_ok=True)
    told = prepare_home(os.environ, args.home_seed, args.home_fallback)
    print(told, file=sys.stderr, flush=True)
    config = config_from(args)
    raise_open_files_limit()
    block_stop_signals()
    server = SandboxServer((args.host, args.port), config)
    threading.Thread(target=stop_when_told, args=(server,), daemon=True).start()
    # As PID 1 or as subreaper the server inherits every orphan: reap their zombies.
    threading.Thread(target=reap_forever, args=(server,), daemon=True).start()
    # getsockname() gives the bound address with the host as str (server_address is typed as
    # possibly bytes); port 0 resolves to the real port here.
    host, port = server.socket.getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.kill_all()
        server.server_close()
    return 0
