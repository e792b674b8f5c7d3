"""Bounds on concurrent work: how many commands run and wait at once, in all and per source.

A source over its share (``--max-executes-per-source`` running or waiting) gets an immediate
503 with ``Retry-After`` while other sources are served; past the global bounds
(``--max-executes`` running, ``--max-queued`` waiting) every source gets a 429."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from ..errors import ApiError
from .sources import Shares

QUEUE_WAIT_SECONDS = 30.0


class Slots:
    """Bounds concurrent executes: ``size`` run, ``queue`` more wait; others get a 429. One
    source runs and waits for ``per_source`` at most; beyond: 503."""

    def __init__(self, size: int, queue: int, per_source: int) -> None:
        self._free = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self.size = size
        self.queue = queue
        self._shares = Shares(per_source)

    def has_room(self) -> bool:
        """Whether a new command would run or wait rather than be refused."""
        with self._lock:
            return self._running < self.size or self._waiting < self.queue

    @contextlib.contextmanager
    def hold(self, source: str) -> Iterator[None]:
        """A slot for one command of ``source`` for the ``with`` block (waiting if need be)."""
        if not self._shares.take(source):
            message = "this client has too many commands running or waiting; retry later"
            raise ApiError(503, message, {"Retry-After": "1"})
        try:
            with self._slot():
                yield
        finally:
            self._shares.give_back(source)

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        busy = ApiError(429, "too many commands running; retry later", {"Retry-After": "1"})
        if not self._free.acquire(blocking=False):
            with self._lock:
                if self._waiting >= self.queue:
                    raise busy
                self._waiting += 1
            try:
                acquired = self._free.acquire(timeout=QUEUE_WAIT_SECONDS)
            finally:
                with self._lock:
                    self._waiting -= 1
            if not acquired:
                raise busy
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
            self._free.release()
