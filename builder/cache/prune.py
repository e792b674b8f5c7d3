"""What the cache holds, and trimming it: least recently used entries first, never one in use.

An entry is a blob's directory (`blobs/xx/<sha256>/`: a wheel, a layer tar or its gzip, a
distribution's bytecode, a ztoc), a record (`<kind>/xx/<key>.json`), or a file of the root (the
registry's blob memory). Its last use is its mtime: the cache touches every entry it finds
(builder.cache). Running runs are the flock-ed files under `runs/`: the oldest one's start,
less `CLOCK_SLACK`, is the horizon, and no entry touched since is removed, nor any temporary
file written since (a download in progress); with no run, the horizon is now. A blob's
directory is removed under the lock the cache takes to find or place that blob, after its mtime
is read again under it: a run finds a blob whole or not at all, and one it found stays. A
record is read in one go, so removing it needs no lock (a reader has its bytes, or a miss).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType

from builder.cache import RUNS, USE_LOCK, Cache

CLOCK_SLACK = 2.0  # seconds: a temporary file's time (the kernel's coarse clock) trails a run's
# start (time.time()) by up to a tick; entries are touched by time.time() (builder.cache.touch)
TEMP_PREFIXES = (".partial-", ".gzip-", ".layer-", ".base-layer-")  # unfinished writes
NOT_RECORDS = frozenset({"blobs", "locks", RUNS})  # the root's directories holding no records


class Kind(Enum):
    """What an entry holds, as `cache` reports sizes."""

    WHEELS = "wheels"  # distributions downloaded or built here (wheels, sdists)
    LAYERS = "layers"  # layer tars and their gzip blobs
    BYTECODE = "bytecode"  # each distribution's compiled .pyc
    SOCI = "soci"  # ztocs: the SOCI indexes' tables of contents
    RECORDS = "records"  # inspections, probes, resolutions, what built what
    UNFINISHED = "unfinished"  # temporary files of a write in progress (or of a run that died)
    OTHER = "other"  # the registry's blob memory, the locks


BLOB_KINDS = MappingProxyType(
    {
        "layer.tar": Kind.LAYERS,
        "layer.tar.gz": Kind.LAYERS,
        "bytecode.tar": Kind.BYTECODE,  # an older tool's uncompressed form
        "bytecode.tar.gz": Kind.BYTECODE,
        "ztoc": Kind.SOCI,
    }
)


@dataclass(frozen=True)
class Entry:
    """One thing a prune may remove: `path` whole."""

    path: Path
    kind: Kind
    size: int  # bytes of its files
    used: float  # its newest mtime: when a run last found or wrote it
    blob: str | None = None  # a blob's sha256: the key of its lock


@dataclass(frozen=True)
class Usage:
    """The cache's size by kind, and where it is."""

    root: Path
    sizes: dict[Kind, int]
    counts: dict[Kind, int]
    running: int  # runs using the cache now

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "location": str(self.root),
            "total": self.total,
            "running": self.running,
            "kinds": {
                kind.value: {"size": self.sizes[kind], "entries": self.counts[kind]}
                for kind in Kind
            },
        }


@dataclass(frozen=True)
class Pruned:
    """What a prune removed, and what it had to keep."""

    removed: int  # entries
    freed: int  # bytes
    left: int  # the cache's bytes after it
    held: int = 0  # entries it would have removed but a running run used since its start
    running: int = 0  # runs using the cache meanwhile
    kinds: dict[Kind, int] = field(default_factory=dict)  # bytes freed by kind


def usage(cache: Cache) -> Usage:
    """The cache's size by kind (a missing cache is an empty one)."""
    sizes = dict.fromkeys(Kind, 0)
    counts = dict.fromkeys(Kind, 0)
    for entry in entries(cache):
        sizes[entry.kind] += entry.size
        counts[entry.kind] += 1
    return Usage(cache.root.absolute(), sizes, counts, len(running_starts(cache)))


def entries(cache: Cache) -> list[Entry]:
    """Every entry of the cache, temporaries and the root's own files included."""
    root = cache.root
    if not root.is_dir():
        return []
    found = list(_blobs(root / "blobs"))
    for child in _listing(root):
        if child.name.startswith(TEMP_PREFIXES):
            found.append(_entry(child, Kind.UNFINISHED))
        elif child.is_dir() and child.name not in NOT_RECORDS:
            found.extend(_entry(path, Kind.RECORDS) for path in _records(child))
        elif child.is_file() or child.name in ("locks", RUNS):
            found.append(_entry(child, Kind.OTHER))
    return found


def running_starts(cache: Cache) -> list[float]:
    """When each run using the cache now started; a run's file whose lock is free is of a run
    that died, and is removed."""
    starts = []
    for path in _listing(cache.root / RUNS):
        if path.name.startswith("."):
            continue  # a run registering: its file is renamed here once locked
        try:
            handle = path.open("r")
        except FileNotFoundError:
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                starts.append(_start(handle.read()))
                continue
            path.unlink(missing_ok=True)
    return starts


def prune(cache: Cache, keep: int | None, older_than: float | None = None) -> Pruned:
    """Remove least recently used entries first: every one unused for `older_than` seconds,
    then more until the cache holds at most `keep` bytes; never one a running run used since it
    started, nor the root's own files. Unfinished writes of runs that ended go too."""
    now = time.time()
    starts = running_starts(cache)
    horizon = min([now, *(start - CLOCK_SLACK for start in starts)])
    found = entries(cache)
    total = sum(entry.size for entry in found)
    removable = sorted((e for e in found if e.kind is not Kind.OTHER), key=lambda e: e.used)
    removed, freed, held = 0, 0, 0
    kinds: dict[Kind, int] = {}
    for entry in removable:
        old = older_than is not None and entry.used < now - older_than
        due = old or (keep is not None and total > keep) or entry.kind is Kind.UNFINISHED
        if not due:
            continue
        since = horizon if entry.kind is not Kind.UNFINISHED else min(horizon, now - CLOCK_SLACK)
        if entry.used >= since or not _remove(cache, entry, since):
            held += entry.kind is not Kind.UNFINISHED
            continue
        removed, freed, total = removed + 1, freed + entry.size, total - entry.size
        kinds[entry.kind] = kinds.get(entry.kind, 0) + entry.size
    return Pruned(removed, freed, total, held, len(starts), kinds)


def clean(cache: Cache) -> Pruned:
    """Remove everything a running run does not hold, the registry's blob memory too."""
    pruned = prune(cache, keep=0)
    freed = 0
    for entry in entries(cache):
        path = entry.path
        if entry.kind is Kind.OTHER and path.is_file() and not path.name.startswith("."):
            path.unlink(missing_ok=True)  # a lock file (a dot file) stays: a holder may use it
            freed += entry.size
    return Pruned(
        pruned.removed,
        pruned.freed + freed,
        pruned.left - freed,
        pruned.held,
        pruned.running,
        pruned.kinds,
    )


def _remove(cache: Cache, entry: Entry, horizon: float) -> bool:
    """Remove `entry` unless a run touched it since `horizon`; a blob under its lock."""
    if entry.blob is None:
        if _newest(entry.path) >= horizon:
            return False
        _delete(entry.path)
        return True
    with cache.exclusive(USE_LOCK, entry.blob):
        if _newest(entry.path) >= horizon:
            return False
        _delete(entry.path)
    return True


def _blobs(blobs: Path) -> Iterator[Entry]:
    for fan in _listing(blobs):
        for directory in _listing(fan):
            files = [path for path in _listing(directory) if path.is_file()]
            names = [path.name for path in files if not path.name.startswith(".")]
            kind = BLOB_KINDS.get(names[0], Kind.WHEELS) if names else Kind.UNFINISHED
            size = sum(_size(path) for path in files)
            yield Entry(directory, kind, size, _newest(directory), directory.name)


def _records(kind_dir: Path) -> Iterator[Path]:
    for fan in _listing(kind_dir):
        yield from (path for path in _listing(fan) if path.is_file())


def _entry(path: Path, kind: Kind) -> Entry:
    if path.is_dir():
        size = sum(_size(Path(top) / name) for top, _, names in os.walk(path) for name in names)
    else:
        size = _size(path)
    return Entry(path, kind, size, _newest(path))


def _newest(path: Path) -> float:
    """The newest mtime of the files `path` is or holds: a file's is its last use (a blob's
    directory's own is only its making); an empty directory's own (0: gone)."""
    try:
        newest = path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
    if not path.is_dir():
        return newest
    times = []
    for top, _, names in os.walk(path):
        for name in names:
            try:
                times.append(os.stat(os.path.join(top, name)).st_mtime)
            except FileNotFoundError:
                continue
    return max(times, default=newest)


def _delete(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _start(text: str) -> float:
    """A run's start as its file says it; unreadable: 0, so it holds everything (the safe side)."""
    try:
        return float(text)
    except ValueError:
        return 0.0
