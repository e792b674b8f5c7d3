"""HTTP/1.1 request framing, apart from what the requests mean (see ``app`` for that).

:class:`FramedHandler` reads a request's line and headers within ``--header-timeout`` and its
body within ``--body-timeout``, learns the body's length (Content-Length, or a chunked body,
refusing both at once: that is how requests are smuggled), answers ``Expect: 100-continue`` only
for bodies it will take, drains a small unread body or closes the connection (lingering so the
client still reads the answer), and answers every error, http.server's own included, as JSON.
The application subclasses it and says which handler a method and path get (``_route``).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from ..admission.listener import Listener
from ..config import CHUNK, MIB
from ..errors import ApiError

MAX_JSON_BODY = 16 * MIB
DRAIN_LIMIT = 1 * MIB
LINGER_SECONDS = 2.0
ASCII_DIGITS = re.compile(r"[0-9]+")
CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")
BODY_LINE = 4096  # longest chunk-size or trailer line of a chunked body
MAX_TRAILERS = 64
UNTIL_LAST_CHUNK = sys.maxsize  # body bytes left of a chunked body: unknown until its end


def parse_length(value: str) -> int:
    """A Content-Length: ASCII digits only (``str.isdigit`` also takes '²'), at most 18 of them
    (``int`` refuses over 4,300), else a 400 / 413 rather than a crash."""
    value = value.strip()
    if not ASCII_DIGITS.fullmatch(value):
        raise ApiError(400, "invalid Content-Length")
    if len(value.lstrip("0")) > 18:
        raise ApiError(413, "Content-Length too large")
    return int(value.lstrip("0") or "0")  # int() counts leading zeros against its limit


class DeadlineReader(io.RawIOBase):
    """The socket as a raw stream whose reads also stop at a per-request deadline, so a client
    that trickles bytes cannot hold a connection (and its thread) for ever."""

    def __init__(self, sock: socket.socket, idle: float) -> None:
        super().__init__()
        self.sock = sock
        self.idle = idle
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        timeout = self.idle
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request deadline passed")
            timeout = min(timeout, left)
        self.sock.settimeout(timeout)
        return self.sock.recv_into(buffer)


class FramedHandler(BaseHTTPRequestHandler):
    """One request's framing: route, then answer JSON; client mistakes never become tracebacks."""

    server: Listener
    protocol_version = "HTTP/1.1"
    server_version = "sandbox-runtime/1"
    timeout = 120  # idle seconds per socket read: a stalled client cannot hold a thread forever
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms stalls

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def __getattr__(self, name: str) -> Callable[[], None]:
        """Any other method (PUT, BREW, ...) is routed too, so it gets 404/405 rather than 501."""
        if name.startswith("do_"):
            return lambda: self._dispatch(name[3:])
        raise AttributeError(name)

    def setup(self) -> None:
        super().setup()
        self._reader = DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader, 65536)

    def handle_one_request(self) -> None:
        """Headers must arrive within ``header_timeout`` of the request's start."""
        self._reader.deadline = time.monotonic() + self.server.config.header_timeout
        super().handle_one_request()

    def parse_request(self) -> bool:
        """Refuse HTTP/0.9 (no status line, no headers): every answer here has a status."""
        try:
            if not super().parse_request():
                return False
        except (OSError, TimeoutError):
            raise
        except Exception:  # the stdlib's header parser decodes e.g. ``boundary*=`` itself
            self.send_error(400, "malformed request headers")
            return False
        if self.request_version == "HTTP/0.9":
            self.send_error(400, "HTTP/0.9 is not supported")
            return False
        return True

    # --- plumbing -------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._body_left = 0
        self._chunked = False
        self._chunk_left = 0
        self._received = 0
        self._started = False
        try:
            self._frame_body()
            handler = self._route(method)
            handler()
        except ApiError as exc:
            self._error(exc)
        except TimeoutError:
            self.close_connection = True
            if not self._started:
                self._error(ApiError(408, "request not received in time"))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:
            sys.stderr.write(f"internal error on {method} {self.path!r}:\n{traceback.format_exc()}")
            self.close_connection = True
            if not self._started:
                self._error(ApiError(500, "internal server error"))

    def _error(self, exc: ApiError) -> None:
        try:
            self._send_json(exc.status, {"error": exc.message}, exc.headers)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True

    def _frame_body(self) -> None:
        """Learn how many body bytes follow: a Content-Length, or a chunked body (what clients
        streaming a file object send), bounded like an upload and by the same deadline.
        Both at once, or another transfer coding, is refused: that is how requests are
        smuggled past proxies."""
        encodings = self.headers.get_all("Transfer-Encoding") or []
        length = self.headers.get("Content-Length")
        if encodings:
            self._body_left = UNTIL_LAST_CHUNK  # unread: closing lingers so the error arrives
            if [e.strip().lower() for e in encodings] != ["chunked"]:
                self.close_connection = True
                raise ApiError(501, "only the chunked transfer coding is supported")
            if length is not None:
                self.close_connection = True
                raise ApiError(400, "both Content-Length and Transfer-Encoding")
            self._chunked = True
        elif length is None:
            return
        else:
            try:
                self._body_left = parse_length(length)
            except ApiError:
                self.close_connection = True
                raise
        self._reader.deadline = time.monotonic() + self.server.config.body_timeout

    def _read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body (fewer at its end), never past Content-Length."""
        if self._chunked:
            return self._read_chunked(size)
        size = min(size, self._body_left)
        if size <= 0:
            return b""
        data = self.rfile.read1(size)
        if not data:
            self.close_connection = True
            raise ApiError(400, "request body ended early")
        self._body_left -= len(data)
        return data

    def _read_chunked(self, size: int) -> bytes:
        """Up to ``size`` bytes of a chunked body (b"" after its last chunk); past
        ``max_upload`` bytes in all: 413."""
        if not self._chunk_left:
            line = self._body_line().split(b";", 1)[0].strip(b" \t")
            if not CHUNK_SIZE.fullmatch(line):
                raise self._malformed("malformed chunk size")
            self._chunk_left = int(line, 16)
            if not self._chunk_left:
                for _ in range(MAX_TRAILERS):
                    if not self._body_line():
                        self._body_left = 0
                        return b""
                raise self._malformed("too many trailer lines")
        data = self.rfile.read1(min(size, self._chunk_left))
        if not data:
            raise self._malformed("request body ended early")
        self._chunk_left -= len(data)
        self._received += len(data)
        limit = self.server.config.max_upload
        if self._received > limit:
            self.close_connection = True
            raise ApiError(413, f"upload larger than {limit} bytes")
        if not self._chunk_left and self._body_line():
            raise self._malformed("chunk longer than its size")
        return data

    def _body_line(self) -> bytes:
        """One CRLF-ended line of a chunked body's framing, without its line end."""
        line = self.rfile.readline(BODY_LINE + 1)
        if not line.endswith(b"\n"):
            raise self._malformed("malformed chunked body")
        return line.rstrip(b"\r\n")

    def _malformed(self, message: str) -> ApiError:
        self.close_connection = True
        return ApiError(400, message)

    def _route(self, method: str) -> Callable[[], None]:
        """The application's handler for this request's method and path (ApiError: none)."""
        raise NotImplementedError

    def _refuses_body(self, length: int) -> bool:
        """Whether the application will refuse a body of ``length`` bytes without reading it."""
        return False

    def _begin(self, status: int, headers: dict[str, str]) -> None:
        """Status line and headers; any unread body is drained or the connection is closed."""
        if self._body_left:
            if (self._chunked or self._body_left <= DRAIN_LIMIT) and not self.close_connection:
                with contextlib.suppress(ApiError, OSError):
                    drained = 0
                    while self._body_left and drained <= DRAIN_LIMIT:
                        drained += len(self._read(CHUNK))
            if self._body_left:
                self.close_connection = True
        self._started = True
        self.connection.settimeout(self.timeout)  # reads may have left a short deadline
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        fields = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        self._begin(status, fields | (headers or {}))
        if self.command != "HEAD":
            self.wfile.write(body)
        self._linger()

    def _send_stream(self, length: int, chunks: Iterator[bytes]) -> None:
        """A 200 JSON reply whose body is written piece by piece (it may be tens of MiB)."""
        self._begin(200, {"Content-Type": "application/json", "Content-Length": str(length)})
        if self.command == "HEAD":
            return
        pending: list[bytes] = []
        size = 0
        for piece in chunks:
            pending.append(piece)
            size += len(piece)
            if size >= CHUNK:
                self.wfile.write(b"".join(pending))
                pending, size = [], 0
        if pending:
            self.wfile.write(b"".join(pending))

    def _linger(self) -> None:
        """Closing with unread input makes the kernel reset the connection and the client may
        lose the response (e.g. a 413): half-close, then read and drop for a short while."""
        if not self._body_left or not self.close_connection:
            return
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_WR)
        self.connection.settimeout(LINGER_SECONDS)
        end = time.monotonic() + LINGER_SECONDS
        try:
            while time.monotonic() < end and self.connection.recv(CHUNK):
                pass
        except OSError:
            pass

    def handle_expect_100(self) -> bool:
        """Do not invite a body that will be refused (curl sends Expect for big uploads)."""
        try:
            length = parse_length(self.headers.get("Content-Length", "0"))
        except ApiError:
            return True  # no "100 Continue": the handler answers 400 straight away
        if self._refuses_body(length):
            return True  # likewise (e.g. a 413)
        return super().handle_expect_100()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol-level errors from http.server (bad request line, 501, 414) as JSON too."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # unparsable request line: answer in HTTP/1.0
            self.request_version = "HTTP/1.0"
        body = json.dumps({"error": message or HTTPStatus(code).phrase}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_json(self) -> dict[str, Any]:
        if self.headers.get("Content-Length") is None:
            raise ApiError(411, "a JSON body with Content-Length is required")
        if self._body_left > MAX_JSON_BODY:
            raise ApiError(413, f"JSON body larger than {MAX_JSON_BODY} bytes")
        data = bytearray()
        while self._body_left:
            data += self._read(CHUNK)
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):
            raise ApiError(400, "body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "body must be a JSON object")
        return body
