"""One TLS context per trust store: an index over HTTPS is read with the environment's CA."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.tlsengine import make_certs

from builder.errors import UserError
from builder.resolve.index import index_files, tls_context

SHA = "a" * 64


class _Listing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(
            {"files": [{"filename": "demo-1.0-py3-none-any.whl", "url": "demo-1.0-py3-none-any.whl",
                        "hashes": {"sha256": SHA}}]}
        ).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("tls") / "certs")


@pytest.fixture
def https_index(certs: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Listing)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs / "server-cert.pem", certs / "server-key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def test_one_context_serves_every_request_of_a_trust_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = tls_context()
    assert tls_context() is first
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname


def test_an_index_is_trusted_through_the_environments_ca_and_only_then(
    https_index: str, certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(UserError, match=r"unreachable .*CERTIFICATE_VERIFY_FAILED"):
        index_files([https_index], "demo")  # the system's trust store does not hold the test CA
    default = tls_context()
    monkeypatch.setenv("SSL_CERT_FILE", str(certs / "ca.pem"))
    assert tls_context() is not default  # another trust store, another context
    files = index_files([https_index], "demo")
    assert [(f.filename, f.sha256) for f in files] == [("demo-1.0-py3-none-any.whl", SHA)]
