"""A loopback PEP 503 index serving one wheel, optionally behind Basic credentials, for tests."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OneWheelIndex(http.server.BaseHTTPRequestHandler):
    """`/simple/<project>/` lists the wheel with its sha256; `/files/<name>` serves it."""

    wheel: Path
    project: str
    credentials: str | None = None  # "user:password" that Basic auth must present
    failing: list[int]  # [n]: the next n requests are answered 503 (an index's bad day)
    seen: list[str]  # "METHOD path status" of every request, in order

    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            fail = self.failing[0] > 0
            self.failing[0] -= fail
        if fail:
            self._answer(503)
            return
        if self.credentials is not None:
            expected = "Basic " + base64.b64encode(self.credentials.encode()).decode()
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="private"')
                self.end_headers()
                return
        name = self.wheel.name
        if self.path.rstrip("/") == f"/simple/{self.project}":
            sha = hashlib.sha256(self.wheel.read_bytes()).hexdigest()
            body, kind = f'<a href="/files/{name}#sha256={sha}">{name}</a>'.encode(), "text/html"
        elif self.path == f"/files/{name}":
            body, kind = self.wheel.read_bytes(), "application/octet-stream"
        else:
            self._answer(404)
            return
        self.seen.append(f"{self.command} {self.path} 200")
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_HEAD = do_GET

    def _answer(self, status: int) -> None:
        self.seen.append(f"{self.command} {self.path} {status}")
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_wheel(
    wheel: Path,
    project: str,
    credentials: str | None = None,
    failing: int = 0,
    seen: list[str] | None = None,
) -> Iterator[int]:
    """Serve `wheel` as `project` on a free loopback port; yields the port.

    `failing`: the first that many requests are answered 503; `seen` receives every request.
    """
    handler = type(
        "Handler",
        (OneWheelIndex,),
        {
            "wheel": wheel,
            "project": project,
            "credentials": credentials,
            "failing": [failing],
            "seen": [] if seen is None else seen,
        },
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
