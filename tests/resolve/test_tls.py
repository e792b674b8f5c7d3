"""One TLS context per trust store: an index over HTTPS is read with the environment's CA; and
one lookup of a host's addresses serves the run's connections to it."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import ipaddress
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.tlsengine import make_certs
from support.wheelindex import answer_listing

from builder.errors import UserError
from builder.resolve import index
from builder.resolve.index import index_files, open_request, tls_context

SHA = "a" * 64


class _Listing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answer_listing(self, "demo-1.0-py3-none-any.whl", SHA)

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


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every (host name, port) the resolver is asked for from now on (an address written as
    one asks no resolver); the run's memory emptied."""
    monkeypatch.setattr(index, "_addresses", {})
    asked: list[tuple[str, int]] = []
    real = socket.getaddrinfo

    def spied(host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(host)
            return real(host, port, *args, **kwargs)
        asked.append((host, port))
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", spied)
    return asked


def test_a_host_is_looked_up_once_for_the_runs_connections_and_verified_by_its_name(
    https_index: str, certs: Path, lookups: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request opens a connection; only the first asks the resolver (one that stalls 5 s
    a lookup cost the 40-library set 29 of its 30 s of downloads). The certificate is still
    checked against the host's name, not the address connected to."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certs / "ca.pem"))
    by_name = https_index.replace("127.0.0.1", "localhost")
    port = urllib.parse.urlsplit(by_name).port
    for _ in range(5):
        files = index_files([by_name], "demo")
        assert [f.filename for f in files] == ["demo-1.0-py3-none-any.whl"]
    assert lookups == [("localhost", port)]


def test_remembered_addresses_that_no_longer_answer_or_grew_old_are_looked_up_again(
    https_index: str, certs: Path, lookups: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certs / "ca.pem"))
    by_name = https_index.replace("127.0.0.1", "localhost")
    port = urllib.parse.urlsplit(by_name).port
    assert port is not None
    with open_request(urllib.request.Request(f"{by_name}/demo/")) as response:
        response.read()
    here = (socket.AF_INET, ("127.0.0.1", port))
    index._addresses[("localhost", port)] = (time.monotonic() - 1, (here,))  # grown old
    with open_request(urllib.request.Request(f"{by_name}/demo/")) as response:
        response.read()
    assert lookups == [("localhost", port)] * 2
    moved = (socket.AF_INET, ("127.0.0.2", port))  # loopback too, where nothing listens
    index._addresses[("localhost", port)] = (time.monotonic() + 60, (moved,))
    with pytest.raises(urllib.error.URLError):
        open_request(urllib.request.Request(f"{by_name}/demo/"), timeout=5)
    assert ("localhost", port) not in index._addresses  # the retry asks the resolver again
    with open_request(urllib.request.Request(f"{by_name}/demo/")) as response:
        response.read()
    assert lookups == [("localhost", port)] * 3


def test_an_address_that_does_not_answer_is_tried_after_the_one_that_did(
    https_index: str, certs: Path, lookups: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round-robin DNS no longer spreads the connections: a dead address first in the list
    would cost every connection its timeout for ADDRESS_TTL."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certs / "ca.pem"))
    by_name = https_index.replace("127.0.0.1", "localhost")
    port = urllib.parse.urlsplit(by_name).port
    assert port is not None
    dead, alive = (socket.AF_INET, ("127.0.0.2", port)), (socket.AF_INET, ("127.0.0.1", port))
    index._addresses[("localhost", port)] = (time.monotonic() + 60, (dead, alive))
    with open_request(urllib.request.Request(f"{by_name}/demo/")) as response:
        response.read()
    assert index._addresses[("localhost", port)][1] == (alive, dead)
    assert lookups == []


def at_once(count: int, job: Callable[[], object]) -> None:
    """`job` on `count` threads released together, as the run's downloads start."""
    barrier = threading.Barrier(count)

    def released() -> None:
        barrier.wait()
        job()

    threads = [threading.Thread(target=released) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_connections_that_start_together_ask_the_resolver_once(
    lookups: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The downloads start eight at a time: each asking a resolver that stalls would bring
    back the stall the memory is there to avoid."""
    monkeypatch.setattr(index, "_lookup_locks", {})
    spied = socket.getaddrinfo

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.2)  # a resolver taking its time: the others arrive meanwhile
        return spied(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    found: list[object] = []
    at_once(8, lambda: found.append(index._looked_up("localhost", 443)))
    assert lookups == [("localhost", 443)]
    assert len(found) == 8 and all(one == found[0] for one in found) and found[0]


def test_connections_that_waited_for_a_failed_lookup_share_its_failure(
    lookups: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resolver that is down: the connections queued behind its lookup fail with it, not
    each after a lookup of its own, one after another."""
    monkeypatch.setattr(index, "_lookup_locks", {})
    monkeypatch.setattr(index, "_lookup_failures", {})
    spied = socket.getaddrinfo

    def down(*args: Any, **kwargs: Any) -> Any:
        spied(*args, **kwargs)  # recorded by the spy
        time.sleep(0.2)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", down)
    failures: list[BaseException] = []

    def look() -> None:
        try:
            index._looked_up("localhost", 443)
        except OSError as error:
            failures.append(error)

    at_once(6, look)
    assert lookups == [("localhost", 443)]
    assert len(failures) == 6 and all(isinstance(f, socket.gaierror) for f in failures)
    monkeypatch.setattr(socket, "getaddrinfo", spied)
    assert index._looked_up("localhost", 443)  # a later connection asks again
    assert lookups == [("localhost", 443)] * 2


def test_a_connection_made_with_http_clients_default_timeout_is_made() -> None:
    """http.client passes a sentinel, not a number, when no timeout was asked for."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()
        default = http.client.HTTPConnection("127.0.0.1").timeout  # the sentinel itself
        with index._opened(socket.AF_INET, address, default, None) as opened:
            assert opened.getpeername() == address
            assert opened.gettimeout() == socket.getdefaulttimeout()
