"""What the cache holds, and trimming it: least recently used entries first, never one in use.

An entry is one of the layout's (builder.cache.layout): a blob's directory, a record, uv's
cache, a file of the root (the registry's blob memory). What the tool did not write is reported
and never removed, not even by `clean`. An entry's last use is its mtime: the cache touches every
entry it finds (builder.cache); uv's cache is last used when its lock was last taken. Running
runs are the flock-ed files under `runs/`: the oldest one's start, less `CLOCK_SLACK`, is the
horizon, and no entry touched since is removed, nor any temporary
file written since (a download in progress); with no run, the horizon is now. A blob's
directory is removed under the lock the cache takes to find or place that blob, after its mtime
is read again under it: a run finds a blob whole or not at all, and one it found stays. A
record is read in one go, so removing it needs no lock (a reader has its bytes, or a miss).
uv's cache is removed whole, only while no uv process of a run holds it (Cache.uv_cache).
"""

from __future__ import annotations

import fcntl
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from builder.cache import BLOB_MEMORY, RUNS, USE_LOCK, UV_LOCK, Cache
from builder.cache.layout import KEPT, Entry, Kind, entries, is_dir, listing, newest

CLOCK_SLACK = 2.0  # seconds: a temporary file's time (the kernel's coarse clock) trails a run's
# start (time.time()) by up to a tick; entries are touched by time.time() (builder.cache.touch)


@dataclass(frozen=True)
class Usage:
    """The cache's size by kind, and where it is."""

    root: Path
    sizes: dict[Kind, int]
    counts: dict[Kind, int]
    running: int  # runs using the cache now
    unknown: tuple[Path, ...] = ()  # what the tool did not write (in the cache): kept

    @property
    def total(self) -> int:
        """The cache's own bytes (what is unknown is not the cache's)."""
        return sum(size for kind, size in self.sizes.items() if kind is not Kind.UNKNOWN)

    def to_dict(self) -> dict[str, object]:
        return {
            "location": str(self.root),
            "total": self.total,
            "running": self.running,
            "unknown": [str(path) for path in self.unknown],
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
    unknown: tuple[Path, ...] = ()  # what the tool did not write (in the cache): kept


def usage(cache: Cache) -> Usage:
    """The cache's size by kind (a missing cache is an empty one)."""
    sizes = dict.fromkeys(Kind, 0)
    counts = dict.fromkeys(Kind, 0)
    found = entries(cache.root)
    for entry in found:
        sizes[entry.kind] += entry.size
        counts[entry.kind] += 1
    running = len(running_starts(cache))
    return Usage(cache.root.absolute(), sizes, counts, running, _unknown(found, cache.root))


def running_starts(cache: Cache) -> list[float]:
    """When each run using the cache now started; a run's file whose lock is free is of a run
    that died, and is removed."""
    starts = []
    for path in listing(cache.root / RUNS):
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
    started, nor the root's own files, nor anything the tool did not write. Unfinished writes of
    runs that ended go too."""
    now = time.time()
    starts = running_starts(cache)
    horizon = min([now, *(start - CLOCK_SLACK for start in starts)])
    found = entries(cache.root)
    total = sum(entry.size for entry in found if entry.kind is not Kind.UNKNOWN)
    removable = sorted((e for e in found if e.kind not in KEPT), key=lambda e: e.used)
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
    return Pruned(removed, freed, total, held, len(starts), kinds, _unknown(found, cache.root))


def clean(cache: Cache) -> Pruned:
    """Remove everything of the tool's a running run does not hold, the registry's blob memory
    too; the locks, the runs' files, the mark and what the tool did not write stay."""
    pruned = prune(cache, keep=0)
    memory = cache.root / BLOB_MEMORY
    freed = memory.lstat().st_size if memory.is_file() and not memory.is_symlink() else 0
    if freed:
        memory.unlink(missing_ok=True)
    return Pruned(
        pruned.removed,
        pruned.freed + freed,
        pruned.left - freed,
        pruned.held,
        pruned.running,
        pruned.kinds,
        pruned.unknown,
    )


def _remove(cache: Cache, entry: Entry, horizon: float) -> bool:
    """Remove `entry` unless a run touched it since `horizon`; a blob under its lock, uv's cache
    only while no uv holds it."""
    if entry.kind is Kind.UV:
        return _remove_uv(cache, entry.path, horizon)
    if entry.blob is None:
        if newest(entry.path) >= horizon:
            return False
        _delete(entry.path)
        return True
    with cache.exclusive(USE_LOCK, entry.blob):
        if newest(entry.path) >= horizon:
            return False
        _delete(entry.path)
    return True


def _remove_uv(cache: Cache, path: Path, horizon: float) -> bool:
    """Remove uv's cache whole under its lock taken exclusively, without waiting: a uv that
    runs (or a run that took the lock since `horizon`) keeps it."""
    lock = cache.root / "locks" / UV_LOCK
    lock.parent.mkdir(parents=True, exist_ok=True)
    used = lock.exists()  # a lock made here now says nothing of a use
    with lock.open("a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if used and lock.stat().st_mtime >= horizon:
            return False
        _delete(path)
    return True


def _delete(path: Path) -> None:
    """Remove `path` whole: never through a symlink (the layout has none)."""
    if is_dir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _unknown(found: list[Entry], root: Path) -> tuple[Path, ...]:
    """What the tool did not write, by its path in the cache."""
    return tuple(entry.path.relative_to(root) for entry in found if entry.kind is Kind.UNKNOWN)


def _start(text: str) -> float:
    """A run's start as its file says it; unreadable: 0, so it holds everything (the safe side)."""
    try:
        return float(text)
    except ValueError:
        return 0.0
