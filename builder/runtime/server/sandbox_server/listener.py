"""The accept path: one thread per connection, at most ``--max-connections`` at once."""

from __future__ import annotations

import contextlib
import socket
import threading
from http.server import ThreadingHTTPServer
from socketserver import BaseRequestHandler
from typing import Any

from .config import Config


class Listener(ThreadingHTTPServer):
    """Threaded server, bounded in connections; beyond the bound a connection is refused at
    once, before a thread is started for it."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(
        self, address: tuple[str, int], handler: type[BaseRequestHandler], config: Config
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self.config = config
        self._connections = threading.BoundedSemaphore(config.max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, at most ``max_connections``; beyond: an immediate 503."""
        if not self._connections.acquire(blocking=False):
            body = b'{"error": "too many connections; retry later"}'
            head = (
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
            )
            with contextlib.suppress(OSError):
                request.settimeout(0.5)
                request.sendall(head.encode() + body)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()
