"""Chunked request bodies: what the upstream SDK sends when it streams a file object.

Uploads accept `Transfer-Encoding: chunked` under the same limits as a sized body (max upload,
body deadline); other transfer codings, and a chunked body together with a Content-Length (the
request-smuggling shape), are refused; malformed framing gets a 400, never a 500 or a hang.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sandboxserver import ServerProcess, multipart

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workspace = tmp_path_factory.mktemp("chunked") / "workspace"
    process = ServerProcess(workspace, "--max-upload", str(LIMIT), "--body-timeout", "2")
    yield process
    assert process.stop() == 0


def chunked(body: bytes, size: int = 1000, extension: bytes = b"") -> bytes:
    """`body` in chunks of `size` bytes, the last-chunk and a trailer."""
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    framed = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in pieces)
    return framed + b"0\r\nX-Trailer: yes\r\n\r\n"


def upload_head(content_type: str, extra: bytes = b"") -> bytes:
    return (
        b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: " + content_type.encode() + b"\r\n" + extra + b"\r\n"
    )


def responses(data: bytes, count: int, port: int) -> list[tuple[int, bytes]]:
    """Send `data` on one connection and read `count` responses (status, body) from it."""
    found = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        stream = sock.makefile("rb")
        for _ in range(count):
            status = int(stream.readline().split()[1])
            length = 0
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            found.append((status, stream.read(length)))
    return found


def test_a_chunked_upload_round_trips_and_keeps_the_connection(server: ServerProcess) -> None:
    content = os.urandom(20_000) + b"\r\n0\r\n\r\n"  # framing-like bytes inside the data
    body, content_type = multipart("dir/streamed.bin", content)
    request = upload_head(content_type) + chunked(body, 777, b";ext=1")
    (status, reply), (health, _) = responses(
        request + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 2, server.port
    )
    assert status == 200, reply
    assert json.loads(reply) == {"path": "dir/streamed.bin", "size": len(content)}
    assert (server.workspace / "dir" / "streamed.bin").read_bytes() == content
    assert health == 200


def test_a_chunked_upload_over_the_limit_is_refused_and_leaves_nothing(
    server: ServerProcess,
) -> None:
    body, content_type = multipart("too-big.bin", b"x" * (LIMIT + 1))
    [(status, reply)] = responses(upload_head(content_type) + chunked(body, 4096), 1, server.port)
    assert status == 413, reply
    assert not [p for p in server.workspace.iterdir() if p.name.startswith((".upload-", "too-"))]


@pytest.mark.parametrize(
    ("framing", "expected"),
    [
        (b"zz\r\nabc\r\n0\r\n\r\n", 400),  # not a hex size
        (b"3\r\nabcdef\r\n0\r\n\r\n", 400),  # longer than its size
        (b"-3\r\nabc\r\n0\r\n\r\n", 400),
        (b"f" * 5000 + b"\r\n", 400),  # a size line without end
        (b"3\r\nab", 400),  # ends early
        (b"0\r\n" + b"X: y\r\n" * 100 + b"\r\n", 400),  # too many trailers
    ],
)
def test_malformed_chunked_framing_is_a_400(
    server: ServerProcess, framing: bytes, expected: int
) -> None:
    response = server.raw(upload_head("multipart/form-data; boundary=zz") + framing)
    assert response.split(b" ", 2)[1] == str(expected).encode(), response[:300]
    assert server.request("GET", "/")[0] == 200


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (b"Transfer-Encoding: gzip, chunked\r\n", 501),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", 400),
        (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", 501),
    ],
)
def test_other_codings_and_smuggling_shapes_are_refused(
    server: ServerProcess, headers: bytes, expected: int
) -> None:
    request = b"POST /upload HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n0\r\n\r\n"
    response = server.raw(request)
    assert response.split(b" ", 2)[1] == str(expected).encode(), response[:300]


def test_a_stalled_chunked_body_meets_the_body_deadline(server: ServerProcess) -> None:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(upload_head("multipart/form-data; boundary=zz") + b"10\r\n--zz\r\n")
        response = sock.recv(65536)  # and nothing more is ever sent
    assert response.startswith(b"HTTP/1.1 408"), response[:200]
    assert time.monotonic() - started < 10
    assert not [p for p in Path(server.workspace).iterdir() if p.name.startswith(".upload-")]


def test_execute_still_needs_a_content_length(server: ServerProcess) -> None:
    payload = json.dumps({"command": "true"}).encode()
    request = b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    [(status, reply)] = responses(request + chunked(payload), 1, server.port)
    assert status == 411, reply
