"""An index's credentials stay with its host: a redirect to another host (a CDN, a bucket) or
from https to plain http drops them; one on the same host keeps them."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from builder.resolve.index import _same_origin, index_files

SHA = "b" * 64
TOKEN = "s3cret-token"


class _Recording(http.server.BaseHTTPRequestHandler):
    """Records each request's path and Authorization; redirects as its server's `moves` say,
    else serves a listing."""

    def do_GET(self) -> None:
        server = self.server
        server.seen.append((self.path, self.headers.get("Authorization")))  # type: ignore[attr-defined]
        target = server.moves.get(self.path)  # type: ignore[attr-defined]
        if target is not None:
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"files": [{"filename": "demo-1.0-py3-none-any.whl",
                                      "url": "demo-1.0-py3-none-any.whl",
                                      "hashes": {"sha256": SHA}}]}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[http.server.ThreadingHTTPServer, http.server.ThreadingHTTPServer]]:
    """The index (reached as 127.0.0.1) and another host (reached as localhost)."""
    made = []
    for _ in range(2):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
        server.seen, server.moves = [], {}  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made.append(server)
    yield made[0], made[1]
    for server in made:
        server.shutdown()
        server.server_close()


def test_a_redirect_to_another_host_carries_no_credential_and_one_on_the_same_host_does(
    servers: tuple[http.server.ThreadingHTTPServer, http.server.ThreadingHTTPServer],
) -> None:
    index, other = servers
    there = f"http://localhost:{other.server_address[1]}/files/demo/"
    index.moves.update({"/simple/demo/": "/moved/demo/", "/moved/demo/": there})  # type: ignore[attr-defined]
    url = f"http://ci:{TOKEN}@127.0.0.1:{index.server_address[1]}/simple"
    files = index_files([url], "demo")
    assert [f.filename for f in files] == ["demo-1.0-py3-none-any.whl"]
    sent = "Basic " + base64.b64encode(f"ci:{TOKEN}".encode()).decode()
    assert index.seen == [("/simple/demo/", sent), ("/moved/demo/", sent)]  # type: ignore[attr-defined]
    assert other.seen == [("/files/demo/", None)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("before", "after", "kept"),
    [
        ("https://pypi.example/simple/x", "https://pypi.example/simple/x/", True),
        ("https://pypi.example/simple/x", "https://pypi.example:443/files/x", True),
        ("http://pypi.example:80/simple/x", "http://pypi.example/files/x", True),
        ("https://pypi.example/simple/x", "http://pypi.example/simple/x/", False),  # downgraded
        ("https://pypi.example/simple/x", "https://cdn.example/files/x", False),
        ("https://pypi.example/simple/x", "https://pypi.example:8443/files/x", False),
        ("https://pypi.example/simple/x", "https://pypi.example.evil/x", False),
    ],
)
def test_which_redirects_keep_the_credentials(before: str, after: str, kept: bool) -> None:
    assert _same_origin(before, after) is kept
