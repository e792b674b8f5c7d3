"""The accept path: one thread per connection, bounded in all and per source.

At most ``--max-connections`` connections are served at once, and at most
``--max-connections-per-source`` from one source (``sources``: this host's own addresses are
one source, so code in the sandbox cannot take the platform's share). A connection over either
bound gets no thread: it goes to the ``gate``, which answers ``GET /`` with the server's health
and anything else with an immediate 503. So does a connection for which no thread can be
started (the sandbox's code has used up the user's or the container's process limit, which
threads count against); health then says so for ``THREADLESS_SECONDS``, or until a thread
starts again.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from socketserver import BaseRequestHandler
from typing import Any

from ..config import Config
from ..health import health_payload
from .gate import Answer, Gate
from .sources import Shares, Sources

ALL = ""  # the one source of the global connection count
THREADLESS_SECONDS = 1.0  # health is not ok this long after a thread could not be started


class Listener(ThreadingHTTPServer):
    """Threaded server, bounded in connections; beyond a bound, the gate answers."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(
        self, address: tuple[str, int], handler: type[BaseRequestHandler], config: Config
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self.config = config
        self.sources = Sources()
        self._connections = Shares(config.max_connections)
        self._per_source = Shares(config.max_connections_per_source)
        self.gate = Gate(self.health)
        self._threadless_until = 0.0

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection if both bounds allow it, else the gate."""
        try:
            source = self.sources.of(client_address, request.getsockname())
        except OSError:  # the connection is already gone
            self.shutdown_request(request)
            return
        if not self._connections.take(ALL):
            self.gate.admit(request, source)
            return
        if not self._per_source.take(source):
            self._connections.give_back(ALL)
            self.gate.admit(request, source)
            return
        thread = threading.Thread(
            target=self.serve_connection, args=(request, client_address, source), daemon=True
        )
        try:
            thread.start()
        except BaseException as exc:
            self._per_source.give_back(source)
            self._connections.give_back(ALL)
            if not isinstance(exc, RuntimeError):
                raise
            self._threadless_until = time.monotonic() + THREADLESS_SECONDS
            self.gate.admit(request, source)  # "can't start new thread": the gate answers
            return
        self._threadless_until = 0.0

    def serve_connection(self, request: Any, client_address: Any, source: str) -> None:
        """The connection's thread (``ThreadingMixIn.process_request_thread``, plus the
        bounds given back, before the socket is closed: a client that sees it closed finds its
        share free)."""
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._per_source.give_back(source)
            self._connections.give_back(ALL)
            self.shutdown_request(request)

    def unready(self, holding: int = 0) -> str | None:
        """Why a new command could not be run now (None: it could); ``holding``: connections
        the asker holds itself. The application adds its own reasons to the listener's."""
        if self._connections.held(ALL) - holding >= self._connections.limit:
            return "every connection slot is taken"
        if time.monotonic() < self._threadless_until:
            return "no thread can be started (the process limit is reached)"
        return None

    def health(self) -> Answer:
        """``GET /``'s answer from the gate, as a handler gives it: ok only when a new command
        could still run."""
        reason = self.unready()
        body = json.dumps(health_payload(reason)).encode()
        if reason is None:
            return 200, "OK", body, ()
        return 503, "Service Unavailable", body, (("Retry-After", "1"),)
