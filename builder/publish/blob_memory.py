"""Which repositories of which registry hold which blobs: what the tool pushed, or saw there.

builder.oci.remote.write asks a `BlobMemory` where a blob the target lacks may be mounted from
(another template's repository on the same registry holds numpy's layer, say) and tells it,
after a successful write, every blob the target now holds. This is its file-backed memory: one
JSON file in the tool's cache directory, so the next run, or another template's, knows it too.

The file is only a hint. A lost, corrupt or stale file costs uploads or a refused mount (which
falls back to the upload), never a push, so it is read forgivingly and written atomically.
Several runs may push at once (a fleet rebuild): each change is a read-modify-write under an
exclusive lock on a file beside it, so no run's blobs are dropped by another's write.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from builder.cache import BLOB_MEMORY, Cache

FILE = BLOB_MEMORY
MAX_DIGESTS = 20_000  # per registry: the most recently pushed kept (a few MiB of JSON at most)
MAX_HOLDERS = 8  # repositories remembered per blob, the most recent first

Registries = dict[str, dict[str, list[str]]]  # registry -> digest -> repositories
_THREADS = threading.Lock()  # flock is per open file; threads of one run take turns here


class FileBlobMemory:
    """A `builder.oci.remote.BlobMemory` kept in a JSON file (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.known = _load(path)

    def holders(self, registry: str, digest: str) -> list[str]:
        return list(self.known.get(registry, {}).get(digest, ()))

    def remember(self, registry: str, repository: str, digests: Iterable[str]) -> None:
        wanted = list(digests)

        def add(known: Registries) -> None:
            blobs = known.setdefault(registry, {})
            for digest in wanted:
                others = [r for r in blobs.pop(digest, []) if r != repository]
                blobs[digest] = [repository, *others][:MAX_HOLDERS]  # re-inserted: newest last
            for digest in list(blobs)[: max(0, len(blobs) - MAX_DIGESTS)]:
                del blobs[digest]

        self._change(add)

    def forget(self, registry: str, repository: str, digest: str) -> None:
        def drop(known: Registries) -> None:
            blobs = known.get(registry, {})
            left = [r for r in blobs.get(digest, []) if r != repository]
            if left:
                blobs[digest] = left
            else:
                blobs.pop(digest, None)

        self._change(drop)

    def _change(self, change: Callable[[Registries], None]) -> None:
        """Apply `change` to the file as it is now (another run may have written it).

        A file that cannot be written (a read-only cache) only loses the hint: the push that
        asked has succeeded, and must not fail for it.
        """
        try:
            with _locked(self.path):
                known = _load(self.path)
                change(known)
                _save(self.path, known)
        except OSError:
            return
        self.known = known


def blob_memory(cache: Cache) -> FileBlobMemory:
    """The memory of the cache directory `cache` lives in."""
    return FileBlobMemory(cache.root / FILE)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THREADS, open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _load(path: Path) -> Registries:
    """The file's registries; anything malformed is dropped (a hint, not a record)."""
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        registry: {
            digest: [r for r in holders if isinstance(r, str)]
            for digest, holders in blobs.items()
            if isinstance(digest, str) and isinstance(holders, list)
        }
        for registry, blobs in data.items()
        if isinstance(registry, str) and isinstance(blobs, dict)
    }


def _save(path: Path, known: Registries) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(known, handle)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
