"""A loopback HTTP server that plays a registry (or anything else) for the fast tests.

`Server` answers each request with `route(method, path)` and logs what it was sent; `Content`
is a route serving manifests and blobs, for tests that hand the tool a hostile or broken
registry without the real one.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Callable

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"

Reply = tuple[int, dict[str, str], bytes]


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Server:
    """A loopback HTTP server answering with `route(method, path)`; it logs each request."""

    def __init__(self, route: Callable[[str, str], Reply]) -> None:
        self.seen: list[tuple[str, str, str]] = []  # (method, path, Authorization)
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                seen.append((self.command, self.path, self.headers.get("Authorization", "")))
                status, headers, body = route(self.command, self.path)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = answer

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Content:
    """Manifests (by tag `1` and by digest) and blobs a loopback registry serves."""

    def __init__(self) -> None:
        self.manifests: dict[str, tuple[str, bytes]] = {}
        self.blobs: dict[str, bytes] = {}

    def manifest(self, document: dict, tag: str | None = None) -> str:
        body = json.dumps(document).encode()
        media = document.get("mediaType", MANIFEST)
        self.manifests[sha256_digest(body)] = (media, body)
        if tag:
            self.manifests[tag] = (media, body)
        return sha256_digest(body)

    def blob(self, data: bytes) -> str:
        self.blobs[sha256_digest(data)] = data
        return sha256_digest(data)

    def route(self, method: str, path: str) -> Reply:
        kind, _, reference = path.rpartition("/")
        if kind.endswith("/manifests") and reference in self.manifests:
            media, body = self.manifests[reference]
            return 200, {"Content-Type": media, "Docker-Content-Digest": sha256_digest(body)}, body
        if kind.endswith("/blobs") and reference in self.blobs:
            return 200, {}, self.blobs[reference]
        return 404, {}, b""
