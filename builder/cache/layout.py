"""What the cache's directory holds: each path the tool writes there, by kind, and what it never
wrote (`Kind.UNKNOWN`), which nothing here removes.

The layout: `blobs/xx/<sha256>/` (a wheel, a layer tar or its gzip, a distribution's bytecode, a
ztoc), records `<kind>/xx/<key>.json`, `locks/`, `runs/`, uv's own cache `uv/`, the registry's
blob memory and its lock, the mark (`CACHEDIR.TAG`), and the temporary files of writes in
progress. Anything else (a file, a symlink, a folder that holds no record) is not the tool's: a
cache directory given by mistake is recognised by it (builder.cache.mark), and a marked cache
reports it and keeps it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType

from builder.cache import BLOB_MEMORY, RUNS, UV, UV_LOCK

TAG = "CACHEDIR.TAG"  # the Cache Directory Tagging Specification's file name
TEMP_PREFIXES = (".partial-", ".gzip-", ".layer-", ".base-layer-", "bsi-base-")  # unfinished
_HEX2 = re.compile("[0-9a-f]{2}")
_HEX64 = re.compile("[0-9a-f]{64}")
_RECORD_KIND = re.compile("[a-z][a-z0-9-]*")  # a record kind's directory name
_RECORD_FAN = re.compile("[0-9a-z]{2}")  # a record's directory: its key's first two characters


class Kind(Enum):
    """What an entry holds, as `cache` reports sizes."""

    WHEELS = "wheels"  # distributions downloaded or built here (wheels, sdists)
    LAYERS = "layers"  # layer tars and their gzip blobs
    BYTECODE = "bytecode"  # each distribution's compiled .pyc
    SOCI = "soci"  # ztocs: the SOCI indexes' tables of contents
    RECORDS = "records"  # inspections, probes, resolutions, what built what
    UV = "uv"  # uv's own cache: the resolver's downloads and metadata
    UNFINISHED = "unfinished"  # temporary files of a write in progress (or of a run that died)
    OTHER = "other"  # the registry's blob memory, the locks, the runs
    UNKNOWN = "unknown"  # not written by the tool: reported, never removed


BLOB_KINDS = MappingProxyType(
    {
        "layer.tar": Kind.LAYERS,
        "layer.tar.gz": Kind.LAYERS,
        "bytecode.tar": Kind.BYTECODE,  # an older tool's uncompressed form
        "bytecode.tar.gz": Kind.BYTECODE,
        "ztoc": Kind.SOCI,
    }
)
KEPT = frozenset({Kind.OTHER, Kind.UNKNOWN})  # never removed by a prune


@dataclass(frozen=True)
class Entry:
    """One thing of the cache's directory: `path` whole."""

    path: Path
    kind: Kind
    size: int  # bytes of its files
    used: float  # its newest mtime: when a run last found or wrote it
    blob: str | None = None  # a blob's sha256: the key of its lock


def entries(root: Path) -> list[Entry]:
    """Every entry under `root` (a missing one holds none), unknown ones included; the mark is
    no entry. Symlinks under it are never followed: one is an unknown entry, wherever it is (the
    root itself may be one, to a cache on another disk)."""
    if not root.is_dir():
        return []
    found: list[Entry] = []
    for child in listing(root):
        found.extend(_root_entries(child))
    return found


def _root_entries(child: Path) -> Iterator[Entry]:
    name, directory = child.name, is_dir(child)
    if name == TAG and not directory:
        return
    if name.startswith(TEMP_PREFIXES) and not child.is_symlink():
        yield _entry(child, Kind.UNFINISHED)
    elif name == "blobs" and directory:
        yield from _blobs(child)
    elif name == UV and directory:
        yield _entry(child, Kind.UV, used=_mtime(child.parent / "locks" / UV_LOCK))
    elif (name in ("locks", RUNS) and directory) or (
        name in (BLOB_MEMORY, f".{BLOB_MEMORY}.lock") and _is_file(child)
    ):
        yield _entry(child, Kind.OTHER)
    elif directory and _RECORD_KIND.fullmatch(name):
        yield from _records(child)
    else:
        yield _entry(child, Kind.UNKNOWN)


def _blobs(blobs: Path) -> Iterator[Entry]:
    """Each blob's directory (`xx/<sha256>/`, its files), whole; anything else under `blobs/` is
    unknown."""
    for fan in listing(blobs):
        if not (is_dir(fan) and _HEX2.fullmatch(fan.name)):
            yield _entry(fan, Kind.UNKNOWN)
            continue
        for directory in listing(fan):
            if not (is_dir(directory) and _HEX64.fullmatch(directory.name)):
                yield _entry(directory, Kind.UNKNOWN)
                continue
            files = listing(directory)
            if not all(_is_file(path) for path in files):  # a blob's directory holds files only
                yield _entry(directory, Kind.UNKNOWN)
                continue
            names = [path.name for path in files if not path.name.startswith(".")]
            kind = BLOB_KINDS.get(names[0], Kind.WHEELS) if names else Kind.UNFINISHED
            size = sum(_size(path) for path in files)
            yield Entry(directory, kind, size, newest(directory), directory.name)


def _records(kind_dir: Path) -> Iterator[Entry]:
    """A record kind's records (`xx/<key>.json`), their writes in progress and an older tool's
    lock files; a folder with no record's directory in it is one unknown entry, whole."""
    children = listing(kind_dir)
    fans = [fan for fan in children if is_dir(fan) and _RECORD_FAN.fullmatch(fan.name)]
    if not fans:
        yield _entry(kind_dir, Kind.UNKNOWN)
        return
    for child in children:
        if child in fans:
            yield from (_entry(path, _record_kind(child.name, path)) for path in listing(child))
        else:
            yield _entry(child, Kind.UNKNOWN)


def _record_kind(fan: str, path: Path) -> Kind:
    name = path.name
    if not _is_file(path):
        return Kind.UNKNOWN
    if name.startswith(".partial-"):
        return Kind.UNFINISHED
    if name.startswith(fan) and name.endswith(".lock"):
        return Kind.OTHER  # an older tool's lock beside its record
    return Kind.RECORDS if name.startswith(fan) and name.endswith(".json") else Kind.UNKNOWN


def _entry(path: Path, kind: Kind, used: float | None = None) -> Entry:
    if is_dir(path):
        size = sum(_size(Path(top) / name) for top, _, names in os.walk(path) for name in names)
    else:
        size = _size(path)
    return Entry(path, kind, size, newest(path) if used is None else used)


def newest(path: Path) -> float:
    """The newest mtime of the files `path` is or holds: a file's is its last use (a blob's
    directory's own is only its making); an empty directory's own (0: gone)."""
    mtime = _mtime(path)
    if not is_dir(path):
        return mtime
    times = [_mtime(Path(top) / name) for top, _, names in os.walk(path) for name in names]
    return max(times, default=mtime)


def listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def is_dir(path: Path) -> bool:
    """A directory itself, not a symlink to one."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except FileNotFoundError:
        return 0.0


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except FileNotFoundError:
        return 0
