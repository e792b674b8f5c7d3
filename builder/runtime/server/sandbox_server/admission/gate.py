"""Connections over a limit, answered from the accept path: health honestly, the rest 503.

A connection that finds its source's share or every connection slot taken gets no handler
thread. The gate, one thread with a selector, gives it ``GATE_SECONDS`` to send its request
head: ``GET /`` (or ``HEAD /``) is answered with the server's health, as a handler would, so a
liveness probe is answered within its deadline even while the limits are reached; anything else,
or nothing in time, gets ``503`` with ``Retry-After``. Each answer closes the connection,
lingering briefly so that the client reads it rather than a reset. The gate is bounded too: at
most ``GATE_PER_SOURCE`` waiting connections per source and ``GATE_SIZE`` in all; beyond that a
connection gets its 503 at once.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

GATE_SECONDS = 0.5  # for a request head to arrive: probes send theirs with the connection
GATE_LINGER_SECONDS = 1.0  # reading and dropping after an answer, before closing
GATE_SIZE = 512
GATE_PER_SOURCE = 32
MAX_HEAD = 8192
BUSY = b'{"error": "too many connections; retry later"}'

# (status, reason phrase, JSON body, extra headers) of an answer
Answer = tuple[int, str, bytes, tuple[tuple[str, str], ...]]


def http_answer(answer: Answer, with_body: bool = True) -> bytes:
    """A whole ``Connection: close`` response."""
    status, phrase, body, headers = answer
    lines = [f"HTTP/1.1 {status} {phrase}", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers)]
    lines += ["Connection: close", "", ""]
    return "\r\n".join(lines).encode() + (body if with_body else b"")


BUSY_ANSWER = http_answer((503, "Service Unavailable", BUSY, (("Retry-After", "1"),)))


def refuse_now(conn: socket.socket) -> None:
    """The 503 without waiting for a request (the gate is full), then close."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(BUSY_ANSWER)
    with contextlib.suppress(OSError):
        conn.close()


@dataclass
class Waiting:
    """One connection in the gate: its source, what it sent so far, and until when it waits."""

    source: str
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    answered: bool = False


class Gate:
    """The accept path's answers for connections over a limit (see the module docstring)."""

    def __init__(self, health: Callable[[], Answer]) -> None:
        self._health = health
        self._lock = threading.Lock()
        self._arrivals: list[tuple[socket.socket, str]] = []
        self._counts: dict[str, int] = {}
        self._total = 0
        self._waiting: dict[socket.socket, Waiting] = {}
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        threading.Thread(target=self._serve, name="gate", daemon=True).start()

    def admit(self, conn: socket.socket, source: str) -> None:
        """Take a connection over a limit (from the accept loop; never blocks)."""
        with self._lock:
            if self._total >= GATE_SIZE or self._counts.get(source, 0) >= GATE_PER_SOURCE:
                refuse = True
            else:
                refuse = False
                self._total += 1
                self._counts[source] = self._counts.get(source, 0) + 1
                self._arrivals.append((conn, source))
        if refuse:
            refuse_now(conn)
            return
        with contextlib.suppress(OSError):  # a full wake buffer already wakes the thread
            self._wake_write.send(b"\0")

    def _serve(self) -> None:
        while True:
            try:
                self._turn()
            except Exception:  # the gate must outlive any one connection's surprise
                sys.stderr.write(f"gate error:\n{traceback.format_exc()}")

    def _turn(self) -> None:
        """Wait for input or the next deadline, then act on both."""
        now = time.monotonic()
        soonest = min((w.deadline for w in self._waiting.values()), default=now + 60)
        for key, _ in self._selector.select(max(soonest - now, 0.0)):
            if key.fileobj is self._wake_read:
                self._take_arrivals()
            else:
                self._read(key.fileobj)  # type: ignore[arg-type]
        now = time.monotonic()
        for conn, waiting in list(self._waiting.items()):
            if now >= waiting.deadline:
                if waiting.answered:
                    self._close(conn)
                else:
                    self._answer(conn, waiting, BUSY_ANSWER)

    def _take_arrivals(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_read.recv(4096):
                pass
        with self._lock:
            arrivals, self._arrivals = self._arrivals, []
        deadline = time.monotonic() + GATE_SECONDS
        for conn, source in arrivals:
            try:
                conn.setblocking(False)
                self._selector.register(conn, selectors.EVENT_READ)
            except (OSError, ValueError):
                self._forget(source)
                with contextlib.suppress(OSError):
                    conn.close()
                continue
            self._waiting[conn] = Waiting(source, deadline)

    def _read(self, conn: socket.socket) -> None:
        waiting = self._waiting[conn]
        try:
            data = conn.recv(MAX_HEAD)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the client is gone (or finished reading the answer)
            self._close(conn)
        elif not waiting.answered:
            waiting.head += data
            if b"\r\n\r\n" in waiting.head or len(waiting.head) > MAX_HEAD:
                self._answer(conn, waiting, self._answer_for(bytes(waiting.head)))

    def _answer_for(self, head: bytes) -> bytes:
        method, _, rest = head.partition(b" ")
        target = rest.partition(b" ")[0].partition(b"?")[0]
        if method in (b"GET", b"HEAD") and target == b"/":
            return http_answer(self._health(), with_body=method == b"GET")
        return BUSY_ANSWER

    def _answer(self, conn: socket.socket, waiting: Waiting, response: bytes) -> None:
        """Send the whole answer (it fits any socket buffer), then linger until the client
        closes or ``GATE_LINGER_SECONDS`` pass."""
        try:
            conn.send(response)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        waiting.answered = True
        waiting.deadline = time.monotonic() + GATE_LINGER_SECONDS

    def _close(self, conn: socket.socket) -> None:
        waiting = self._waiting.pop(conn)
        self._forget(waiting.source)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        with contextlib.suppress(OSError):
            conn.close()

    def _forget(self, source: str) -> None:
        with self._lock:
            self._total -= 1
            left = self._counts.get(source, 0) - 1
            if left > 0:
                self._counts[source] = left
            else:
                self._counts.pop(source, None)
