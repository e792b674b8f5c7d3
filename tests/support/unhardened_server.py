"""The runtime contract served the way builder/runtime/server/ served it before issue 9.

A test fixture, not a server to ship: standard library only, run as a script exactly like the
real one (`python3 -I unhardened_server.py --host H --port 0 --workspace W`, printing
`listening on H:PORT`). It keeps the three behaviours the hardening checks exist to catch, as
the pre-hardening server (0bd0c22) had them, and nothing that would make them fail otherwise:

  race      a path is resolved (realpath, checked inside the workspace) and then opened,
            listed, deleted or written by name: a directory swapped for a symlink in between
            is followed out of the workspace
  detached  a command runs in a new session and only its process group is killed when it
            exits or times out: `setsid`, double-fork and start_new_session children survive
            (the reply does not wait for them: it lingers 2 s for their output at most)
  flood     output is captured whole and decoded with U+FFFD replacements: 10 MiB of 0xff is
            a 60 MiB JSON string, nothing is truncated
  starve    (as the server had it before issue 23) 256 connections in all, whoever holds them,
            each allowed 30 s for its request, and a 503 for every connection beyond: code in
            the sandbox that holds 256 half-sent requests refuses everyone else, GET / included
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

LINGER_SECONDS = 2.0  # how long a reply waits for pipes that detached children hold open
MAX_CONNECTIONS = 256
HEADER_TIMEOUT = 30.0  # seconds a connection may take to send its request
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{}"
)


class Refused(Exception):
    """A client error: its status and message become the JSON reply."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def resolve(root: str, raw: str) -> str:
    """The real path of `raw` under `root`, refused when it leaves it (then used by name)."""
    real = os.path.realpath(os.path.join(root, raw.lstrip("/")))
    if os.path.commonpath([root, real]) != root:
        raise Refused(403, "path resolves outside the workspace")
    return real


def run(argv: list[str], cwd: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run `argv`; kill its process group when it exits or times out; read what it wrote."""
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env=env, start_new_session=True,
        )  # fmt: skip
    except FileNotFoundError:
        return {"stdout": "", "stderr": f"{argv[0]}: not found\n", "exit_code": 127}
    captured = {"stdout": bytearray(), "stderr": bytearray()}
    readers = [
        threading.Thread(target=read_all, args=(stream, captured[name]), daemon=True)
        for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group only: another session escapes it
    proc.wait()
    for reader in readers:
        reader.join(LINGER_SECONDS)
    reply: dict[str, Any] = {
        name: bytes(data).decode("utf-8", "replace") for name, data in captured.items()
    }
    reply["exit_code"] = 124 if timed_out else proc.returncode % 256
    reply["timed_out"] = timed_out
    return reply


def read_all(stream: Any, into: bytearray) -> None:
    while chunk := stream.read1(1 << 16):
        into += chunk


class Handler(BaseHTTPRequestHandler):
    server: Server
    timeout = HEADER_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read replies, not the log."""

    def reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self, route: Any) -> None:
        try:
            route()
        except Refused as refused:
            self.reply(refused.status, json.dumps({"error": str(refused)}).encode())
        except FileNotFoundError:
            self.reply(404, b'{"error": "not found"}')
        except OSError as error:
            self.reply(400, json.dumps({"error": str(error)}).encode())

    def do_GET(self) -> None:
        self.answer(self.get)

    def do_POST(self) -> None:
        self.answer(self.post)

    def do_DELETE(self) -> None:
        self.answer(self.delete)

    def get(self) -> None:
        root, path = self.server.root, self.path
        if path == "/":
            return self.reply(200, b'{"status": "ok"}')
        route, _, raw = path[1:].partition("/")
        real = resolve(root, unquote(raw))
        if route == "download":
            with open(real, "rb") as handle:
                return self.reply(200, handle.read(), "application/octet-stream")
        if route == "exists":
            found = {"path": unquote(raw), "exists": os.path.exists(real)}
            return self.reply(200, json.dumps(found).encode())
        if route == "list":
            listing = [
                {"name": e.name, "size": e.stat().st_size, "mod_time": e.stat().st_mtime,
                 "type": "directory" if e.is_dir() else "file"}
                for e in os.scandir(real)
            ]  # fmt: skip
            return self.reply(200, json.dumps(listing).encode())
        raise Refused(404, "no such route")

    def post(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/execute":
            request = json.loads(body)
            command = request["command"]
            argv = shlex.split(command) if isinstance(command, str) else list(command)
            cwd = resolve(self.server.root, request["cwd"]) if request.get("cwd") else None
            env = {**os.environ, **(request.get("env") or {})}
            result = run(argv, cwd or self.server.root, env, request.get("timeout_seconds", 30))
            return self.reply(200, json.dumps(result).encode())
        if self.path == "/upload":
            boundary = self.headers["Content-Type"].partition("boundary=")[2].encode()
            part = body.split(b"--" + boundary)[1]
            head, _, data = part.partition(b"\r\n\r\n")
            name = head.partition(b'filename="')[2].partition(b'"')[0].decode()
            real = resolve(self.server.root, name)
            os.makedirs(os.path.dirname(real), exist_ok=True)
            with open(real, "wb") as handle:
                handle.write(data.removesuffix(b"\r\n"))
            return self.reply(200, json.dumps({"path": name, "size": len(data) - 2}).encode())
        raise Refused(404, "no such route")

    def delete(self) -> None:
        route, _, raw = self.path[1:].partition("/")
        if route != "files":
            raise Refused(404, "no such route")
        real = resolve(self.server.root, unquote(raw))
        if real == self.server.root:
            raise Refused(403, "cannot delete the workspace root")
        if os.path.isdir(real) and not os.path.islink(real):
            shutil.rmtree(real)
        else:
            os.unlink(real)
        self.reply(200, json.dumps({"path": unquote(raw), "deleted": True}).encode())


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], root: str, max_connections: int) -> None:
        super().__init__(address, Handler)
        self.root = os.path.realpath(root)
        self.connections = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, ``--max-connections`` at most, from any source; beyond:
        503 at once."""
        if not self.connections.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(BUSY)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8888)
    parser.add_argument("--workspace", required=True)
    # so many that the starve check's attack fits: bounded by nothing but the process limit
    parser.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS)
    args = parser.parse_args()
    os.makedirs(args.workspace, exist_ok=True)
    # PID 1 of a pid namespace ignores a SIGTERM it has no handler for; the tests stop it so
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    server = Server((args.host, args.port), args.workspace, args.max_connections)
    print(f"listening on {args.host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
