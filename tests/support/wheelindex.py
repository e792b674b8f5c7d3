"""A loopback PEP 503 index serving one project's wheels, optionally behind Basic credentials,
for tests. Links are percent-encoded as PyTorch's index writes them (`torch-2.9.0%2Bcpu-…`)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, unquote


class OneWheelIndex(http.server.BaseHTTPRequestHandler):
    """`/simple/<project>/` lists the wheels with their sha256; `/files/<name>` serves one."""

    listed: dict[str, tuple[Path, ...]]  # project -> the files its page lists
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
        served = {wheel.name: wheel for files in self.listed.values() for wheel in files}
        path = unquote(self.path)
        project = path.rstrip("/").removeprefix("/simple/")
        if path.startswith("/simple/") and project in self.listed:
            digests = {
                wheel.name: hashlib.sha256(wheel.read_bytes()).hexdigest()
                for wheel in self.listed[project]
            }
            body = "".join(
                f'<a href="/files/{quote(name)}#sha256={sha}">{name}</a>\n'
                for name, sha in digests.items()
            ).encode()
            kind = "text/html"
        elif path.startswith("/files/") and path[7:] in served:
            body, kind = served[path[7:]].read_bytes(), "application/octet-stream"
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
    more: tuple[Path, ...] = (),
    others: dict[str, Path] | None = None,
    kind: type[OneWheelIndex] = OneWheelIndex,
) -> Iterator[int]:
    """Serve `wheel` (and `more` files of the same project) as `project` on a free loopback
    port, and each of `others` (project -> its one file) beside it; yields the port.

    `failing`: the first that many requests are answered 503; `seen` receives every request;
    `kind`: the handler, OneWheelIndex or one that answers some requests otherwise.
    """
    handler = type(
        "Handler",
        (kind,),
        {
            "listed": {project: (wheel, *more), **{p: (f,) for p, f in (others or {}).items()}},
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


def answer_listing(handler: http.server.BaseHTTPRequestHandler, filename: str, sha256: str) -> None:
    """Answer `handler`'s request with a PEP 691 page listing one file, by a relative URL."""
    body = json.dumps(
        {"files": [{"filename": filename, "url": filename, "hashes": {"sha256": sha256}}]}
    ).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
