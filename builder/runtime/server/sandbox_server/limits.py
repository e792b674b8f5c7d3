"""Bounds on concurrent work: how many commands run and wait at once."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from .errors import ApiError

QUEUE_WAIT_SECONDS = 30.0


class Slots:
    """Bounds concurrent executes: ``size`` run, ``queue`` more wait; others get a 429."""

    def __init__(self, size: int, queue: int) -> None:
        self._free = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._waiting = 0
        self.queue = queue

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
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
        try:
            yield
        finally:
            self._free.release()
