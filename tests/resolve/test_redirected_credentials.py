"""An index's credentials stay with its origin: a redirect to another host (a CDN, a bucket), to
another port or from https to plain http drops them, and so does a file listed there; one on the
same origin, or its upgrade from http to https, keeps them. A proxy's never follow a redirect."""

from __future__ import annotations

import base64
import http.server
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from support.wheelindex import answer_listing

from builder.resolve.index import _CredentialsStay, _same_origin, authorization, index_files

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
        answer_listing(self, "demo-1.0-py3-none-any.whl", SHA)

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
        ("https://PyPI.example/simple/x", "https://pypi.example/files/x", True),  # case
        ("http://pypi.example/simple/x", "https://pypi.example/simple/x/", True),  # upgraded
        ("http://pypi.example:8080/simple/x", "https://pypi.example/simple/x/", False),
        ("http://[::1]:8080/simple/x", "http://[::1]:8080/files/x", True),
        ("http://[::1]:8080/simple/x", "http://[::2]:8080/files/x", False),
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


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_file_is_sent_an_indexs_credentials_only_at_the_indexs_origin() -> None:
    """A page may list its files anywhere: an https index's credentials never go over plain
    http, nor to another port; the file's own credentials win."""
    index = f"https://ci:{TOKEN}@pypi.example/simple"
    assert authorization("https://pypi.example/files/a.whl", [index]) == basic("ci", TOKEN)
    assert authorization("http://pypi.example/files/a.whl", [index]) is None
    assert authorization("https://pypi.example:8443/files/a.whl", [index]) is None
    assert authorization("https://cdn.example/files/a.whl", [index]) is None
    own = "https://me:mine@pypi.example/files/a.whl"
    assert authorization(own, [index]) == basic("me", "mine")


def test_a_redirect_never_carries_the_proxys_credentials() -> None:
    """urllib's ProxyHandler sets Proxy-Authorization as a plain header, which a redirect
    copies: to a host reached without the proxy (NO_PROXY) it would go in the clear. The
    handler adds it again to each request that goes through the proxy."""
    request = urllib.request.Request("http://pypi.example/simple/x/")
    request.add_header("Authorization", basic("ci", TOKEN))
    request.add_header("Proxy-Authorization", basic("proxy", "psecret"))
    same, other = "http://pypi.example/files/x.whl", "http://127.0.0.1/x.whl"  # made absolute
    for target, authorized in ((same, True), (other, False)):
        made = _CredentialsStay().redirect_request(request, None, 302, "Found", {}, target)
        assert made is not None
        assert not made.has_header("Proxy-authorization")
        assert made.has_header("Authorization") is authorized
