"""Start-up: flags (each defaulting to a ``SANDBOX_*`` variable), signals, the reaper thread."""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import threading
import time

from .app import SandboxServer
from .config import MIB, Config
from .execution.stopping import block_stop_signals, wait_for_stop
from .files.home import prepare_home

REAP_SECONDS = 1.0


def reap_forever(server: SandboxServer) -> None:
    """Background loop of the PID-1 orphan reaper."""
    while True:
        time.sleep(REAP_SECONDS)
        server.reap_orphans()


def env_default(name: str, fallback: str) -> str:
    """Flags default to SANDBOX_* environment variables, so images can configure without argv."""
    return os.environ.get(name, fallback)


def stop_when_told(server: SandboxServer) -> None:
    """Background thread: shut down on the first stop signal from outside (``execution.stopping``);
    ``shutdown()`` waits for ``serve_forever()``, so it cannot run in the main thread."""
    wait_for_stop(server.supervisor.sent_from_below)
    server.shutdown()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Sandbox runtime HTTP server.")
    parser.add_argument("--host", default=env_default("SANDBOX_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=env_default("SANDBOX_PORT", "8888"))
    parser.add_argument("--workspace", default=env_default("SANDBOX_WORKSPACE", "/workspace"))
    parser.add_argument(
        "--max-upload",
        type=int,
        default=env_default("SANDBOX_MAX_UPLOAD", str(100 * MIB)),
        help="largest accepted upload body in bytes (larger: 413)",
    )
    parser.add_argument(
        "--max-output",
        type=int,
        default=env_default("SANDBOX_MAX_OUTPUT", str(10 * MIB)),
        help="bytes kept per output stream of a command; the rest is dropped",
    )
    parser.add_argument(
        "--default-timeout",
        type=float,
        default=env_default("SANDBOX_DEFAULT_TIMEOUT", "300"),
        help="seconds a command may run when the request names no timeout_seconds",
    )
    parser.add_argument(
        "--max-timeout",
        type=float,
        default=env_default("SANDBOX_MAX_TIMEOUT", "3600"),
        help="cap on timeout_seconds",
    )
    for flag, kind, default, text in (
        ("max-reply", int, str(32 * MIB), "encoded bytes of one /execute reply (half per stream)"),
        ("max-executes", int, "32", "commands running at once"),
        ("max-queued", int, "64", "executes waiting for a slot; beyond that: 429"),
        ("max-connections", int, "256", "connections served at once; beyond: 503 (GET / answered)"),
        (
            "max-connections-per-source",
            int,
            "64",
            "connections one client address holds at once (this host's own are one); beyond: 503",
        ),
        (
            "max-executes-per-source",
            int,
            "16",
            "commands one client address runs or queues at once; beyond that: 503",
        ),
        ("header-timeout", float, "30", "seconds to receive a request's line and headers"),
        ("body-timeout", float, "600", "seconds to receive a request's body"),
    ):
        name = "SANDBOX_" + flag.upper().replace("-", "_")
        parser.add_argument(f"--{flag}", type=kind, default=env_default(name, default), help=text)
    parser.add_argument(
        "--home-seed",
        default=env_default("SANDBOX_HOME_SEED", "/opt/sandbox/home"),
        help="caches built into the image, copied into $HOME at start (see files/home.py)",
    )
    parser.add_argument(
        "--home-fallback",
        default=env_default("SANDBOX_HOME_FALLBACK", "/dev/shm/home"),
        help="the commands' home when $HOME cannot be made (no writable /tmp); empty: none",
    )
    parser.add_argument(
        "--spool-dir",
        default=os.environ.get("SANDBOX_SPOOL_DIR"),
        help="where command output is spooled (default: $TMPDIR, /tmp, /var/tmp, else memory)",
    )
    args = parser.parse_args(argv)
    for name in (
        "max_upload",
        "max_output",
        "default_timeout",
        "max_timeout",
        "max_reply",
        "max_executes",
        "max_connections",
        "max_connections_per_source",
        "max_executes_per_source",
        "header_timeout",
        "body_timeout",
    ):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.workspace, exist_ok=True)
    told = prepare_home(os.environ, args.home_seed, args.home_fallback)
    print(told, file=sys.stderr, flush=True)
    umask = os.umask(0o022)
    os.umask(umask)
    config = Config(
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
    with contextlib.suppress(ValueError, OSError):  # deep trees are deleted one fd per level
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
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
