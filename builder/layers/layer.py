"""The layers of /app/deps-extra, written by the tool so the same wheels give the same bytes.

A BuildKit `COPY`/`RUN pip install` records the day's mtimes and the base's /app, so its diff ID
changes with every build and every platform upgrade. Here a group of locked wheels (one layer of
builder.layers.extras' stack) is unpacked the way `pip install --target --no-deps` lays them out
(purelib and platlib at the root, `.data/scripts` and console scripts in `bin/`, `.dist-info`
with INSTALLER and a rewritten RECORD; headers and data files are dropped as `--target` drops
them) straight into a tar: entries sorted, every mtime the wheels' SOURCE_DATE_EPOCH, owner 0:0,
modes normalized. The tar stays uncompressed in the cache (a plan, `docker load` and a hand
build's `ADD` take it as it is); builder.layers.gzipped compresses it only when it is pushed.
Members are inflated on threads ahead of the writer (zlib releases the GIL), a large one in
chunks while the writer hashes and writes the one before, so writing is not bound by one core
and memory stays bounded by a large library's size.

No `.pyc` goes in these layers: builder.layers.bytecode compiles them with the base's own
interpreter into layers of their own, so these stay base-independent.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import tarfile
import tempfile
import threading
import zipfile
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypedDict

from builder.cache import Cache
from builder.digest import HashingWriter, Sha256
from builder.errors import UserError, shown
from builder.inspect.members import UNREADABLE, unreadable
from builder.inspect.wheels import newest_date
from builder.layers.first_reads import (
    cached_first_reads,
    laid_out,
    wheel_first_reads,
)
from builder.layers.install_layout import (
    DIR_MODE,
    LAYER_FORMAT,
    LAYER_TAR,
    Entry,
    Expected,
    Member,
    install_entries,
    layer_mismatch,
    recorded_sha256,
)

ZIP_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can carry
CHUNK = 1 << 20
BLOCK = 512
RECORD = 20 * BLOCK  # tar pads its end to whole records
READ_AHEAD = 64 << 20  # uncompressed bytes inflated ahead of the writer
READERS = os.cpu_count() or 1
STREAMED = 8 << 20  # members larger than this stream through the writer in chunks
QUEUED = 8  # chunks of a streamed member inflated ahead of the writer
WHEELS_LAYER = "wheels-layer"  # the cache's records: a group of wheels -> its layer tar


class LayerFacts(TypedDict):
    """A layer tar's facts in report.json's `extras_layers` (docs/report.md)."""

    diff_id: str
    tar_size: int  # a push adds the gzip blob's "digest" and "size"
    source_date_epoch: int


@dataclass(frozen=True)
class Layer:
    """A layer tar in the cache, uncompressed (builder.layers.gzipped makes its registry blob)."""

    path: Path  # the tar
    diff_id: str  # sha256:… of the tar: its name in an image config
    size: int  # of the tar
    source_date_epoch: int

    def to_dict(self) -> LayerFacts:
        return LayerFacts(
            diff_id=self.diff_id, tar_size=self.size, source_date_epoch=self.source_date_epoch
        )


def lock_hash(lock_text: str) -> str:
    """A lock's fingerprint, with the layout version.

    Equal fingerprints mean the same extras layers: the build state records it, and a rebase
    whose lock has not changed reuses the layers the image has.
    """
    return hashlib.sha256(f"{LAYER_FORMAT}\n{lock_text}".encode()).hexdigest()


@dataclass(frozen=True)
class LayerWheels:
    """The wheels of one layer of the extras, and the files left to a later distribution.

    `shadowed`: paths (under the root) these wheels install that a later wheel of the set
    installs too. pip lets the later install win; with one layer per distribution the winner's
    layer may sit below, so the loser's layer leaves those files out and the image holds what
    one `pip install --target` of the set would.
    """

    wheels: tuple[tuple[str, Path], ...]  # (sha256, file), in lock order
    shadowed: frozenset[str] = frozenset()


def shadowed_files(wheels: Sequence[Path]) -> dict[Path, frozenset[str]]:
    """For each wheel, the files it installs that a later wheel (lock order) installs too.

    Directories are merged, never shadowed: a namespace package such as `google/` stays in
    every layer that has modules under it.
    """
    by_group = shadowed_by_group(wheels, range(len(wheels)))
    return {wheel: by_group[index] for index, wheel in enumerate(wheels)}


def shadowed_by_group(wheels: Sequence[Path], group_of: Sequence[int]) -> dict[int, frozenset[str]]:
    """For each layer (wheel i goes to layer `group_of[i]`), the files it must leave out.

    A file belongs to the layer of the last wheel (lock order) installing it, pip's winner;
    every other layer holding a wheel that installs it leaves it out. Within one layer the
    writer already lets the later wheel win.
    """
    installed: list[set[str]] = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            installed.append({e.path for e in install_entries(archive, 0, wheel.name)})
    winner: dict[str, int] = {}
    for index in reversed(range(len(wheels))):
        for path in installed[index]:
            winner.setdefault(path, group_of[index])
    shadowed: dict[int, set[str]] = {group: set() for group in group_of}
    for index, paths in enumerate(installed):
        group = group_of[index]
        shadowed[group] |= {path for path in paths if winner[path] != group}
    return {group: frozenset(paths) for group, paths in shadowed.items()}


def wheels_layer(group: LayerWheels, root: str, cache: Cache) -> Layer:
    """One layer of the extras: its wheels installed under `root`, cached by what decides it.

    Its bytes depend only on those wheels, the root, the layout version and what a later
    distribution shadows, so the same wheel gives the same layer in every set and on any base.
    """
    key = _layer_key([sha for sha, _ in group.wheels], group.shadowed, root)
    record = cache.get_record(WHEELS_LAYER, key)
    if record and (path := cache.checked_blob(record["diff_id"].split(":", 1)[1], LAYER_TAR)):
        return Layer(path, record["diff_id"], record["size"], record["sde"])
    files = [path for _, path in group.wheels]
    epoch = source_date_epoch(files)
    first = [path for sha, wheel in group.wheels for path in cached_first_reads(wheel, sha, cache)]
    layer = _store(
        cache, epoch, lambda out: write_tar(out, files, root, epoch, group.shadowed, first)
    )
    cache.put_record(
        WHEELS_LAYER, key, {"diff_id": layer.diff_id, "size": layer.size, "sde": epoch}
    )
    return layer


def adopt_layer(
    cache: Cache, wheels: Sequence[str], shadowed: Iterable[str], root: str, layer: Layer
) -> None:
    """Record `layer` (its tar already in the cache, checked against its diff ID: one pulled
    from a registry, builder.publish.cache_from) as the layer of `wheels` leaving out
    `shadowed`, so `wheels_layer` finds it instead of laying the wheels out."""
    record = {"diff_id": layer.diff_id, "size": layer.size, "sde": layer.source_date_epoch}
    cache.put_record(WHEELS_LAYER, _layer_key(wheels, frozenset(shadowed), root), record)


@dataclass(frozen=True)
class ExpectedLayer:
    """What `wheels_layer` writes of some wheels: every member by name, and their date."""

    members: dict[str, Expected]
    epoch: int


def expected_layer(wheels: Sequence[Path], root: str, shadowed: frozenset[str]) -> ExpectedLayer:
    """Every member `write_tar` writes of `wheels` under `root` leaving out `shadowed`, with
    its bytes' sha256, and the layer's date. Only the wheels' zip directories, RECORDs and
    generated files are read (a member its RECORD gives no sha256 is hashed from the zip), so
    it costs a fraction of laying out."""
    archives = [zipfile.ZipFile(wheel) for wheel in wheels]
    try:
        full, _ = _tree(archives, wheels, root.strip("/"), shadowed)
        members = {name: _expected(entry, archives) for name, entry in full.items()}
    finally:
        for archive in archives:
            archive.close()
    return ExpectedLayer(members, source_date_epoch(wheels))


def pulled_mismatch(layer: Layer, expected: ExpectedLayer) -> str | None:
    """Why `layer` (a tar from a registry) is not the layer `expected` describes; None when
    it holds exactly its members (builder.layers.install_layout.layer_mismatch)."""
    if layer.source_date_epoch != expected.epoch:
        return f"its date {layer.source_date_epoch} is not the wheels' {expected.epoch}"
    with tarfile.open(layer.path, "r:") as tar:
        members = [_member(tar, info) for info in tar]
    return layer_mismatch(expected.members, members, expected.epoch)


def _expected(entry: Entry, archives: Sequence[zipfile.ZipFile]) -> Expected:
    if entry.data is not None:
        return Expected(entry.mode, len(entry.data), Sha256.of(entry.data).hex)
    if entry.wheel < 0:
        return Expected(entry.mode, 0, None)
    sha = recorded_sha256(entry.recorded)
    if sha is None:  # RECORD gives no sha256 of it: its bytes say
        with archives[entry.wheel].open(entry.member) as member:
            sha = Sha256.read_from(member, CHUNK).hex
    return Expected(entry.mode, entry.size, sha)


def _member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> Member:
    sha = None
    if info.type == tarfile.REGTYPE:
        body = tar.extractfile(info)
        assert body is not None  # a regular file has a body
        sha = Sha256.read_from(body, CHUNK).hex
    owner = (info.uname, info.gname)
    return Member(
        info.name,
        info.type,
        info.mode,
        info.uid,
        info.gid,
        owner,
        info.mtime,
        info.size,
        sha,
        tuple({**tar.pax_headers, **info.pax_headers}),  # a global header counts too
    )


def _layer_key(wheels: Sequence[str], shadowed: frozenset[str], root: str) -> str:
    """What decides a layer's bytes, hashed: the format, the root, its wheels, what it leaves."""
    key_text = "\n".join([LAYER_FORMAT, root, *wheels, *sorted(shadowed)])
    return hashlib.sha256(key_text.encode()).hexdigest()


def source_date_epoch(wheels: Iterable[Path]) -> int:
    """The newest timestamp inside the locked wheels: a date the lock itself fixes."""
    newest = ZIP_EPOCH
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            newest = max(newest, newest_date(archive.infolist()))
    return newest


def write_tar(
    out: IO[bytes] | Any,
    wheels: Sequence[Path],
    root: str,
    epoch: int,
    shadowed: frozenset[str] = frozenset(),
    first: Sequence[str] | None = None,
) -> None:
    """Write the sorted, normalized tar of `wheels` installed under `root` to `out`.

    `shadowed` files (a later distribution of the set installs them) are left out. `first`:
    the wheels' first reads (paths under `root`) when known, else read from the wheels.
    """
    root = root.strip("/")
    archives = [zipfile.ZipFile(wheel) for wheel in wheels]
    try:
        full, directories = _tree(archives, wheels, root, shadowed)
        if first is None:
            first = [path for wheel in wheels for path in wheel_first_reads(Path(wheel))]
        leading = [f"{root}/{path}" for path in first]
        names = laid_out(sorted(full), directories, leading)  # a lazy node's first import: first
        written = 0
        with (
            ThreadPoolExecutor(max_workers=READERS) as pool,
            closing(_read_ahead(pool, archives, [full[name] for name in names])) as bodies,
        ):
            for name, body in zip(names, bodies, strict=True):
                entry = full[name]
                info = tarfile.TarInfo(name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
                info.mode = entry.mode
                if body is None:
                    info.type = tarfile.DIRTYPE
                else:
                    info.size = len(entry.data) if entry.data is not None else entry.size
                header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
                out.write(header)
                for piece in body or ():
                    out.write(piece)
                padding = b"\0" * (-info.size % BLOCK)
                out.write(padding)
                written += len(header) + info.size + len(padding)
        end = 2 * BLOCK
        out.write(b"\0" * (end + (-(written + end) % RECORD)))
    finally:
        for archive in archives:
            archive.close()


def _tree(
    archives: Sequence[zipfile.ZipFile], wheels: Sequence[Path], root: str, shadowed: frozenset[str]
) -> tuple[dict[str, Entry], set[str]]:
    """Every tar member of `wheels` installed under `root` (directories included) by its name,
    and the directories' names; a path that is a file and another's directory is refused."""
    entries: dict[str, Entry] = {}
    for index, archive in enumerate(archives):
        for entry in install_entries(archive, index, Path(wheels[index]).name):
            if entry.path not in shadowed:  # a later wheel wins, as with pip (lock order)
                entries[entry.path] = entry
    parts = root.split("/")
    directories = {"/".join(parts[: i + 1]) for i in range(len(parts))}
    for path in list(entries):
        pieces = path.split("/")[:-1]
        directories |= {f"{root}/" + "/".join(pieces[: i + 1]) for i in range(len(pieces))}
    full = {f"{root}/{path}": entry for path, entry in entries.items()}
    if clash := min(directories & full.keys(), default=None):  # docker load fails on it
        name, under = next((n, e) for n, e in sorted(full.items()) if n.startswith(f"{clash}/"))
        raise UserError(
            f"{full[clash].wheel_name}: {shown(clash.removeprefix(f'{root}/'))} is a file, and"
            f" {under.wheel_name} has {shown(name.removeprefix(f'{root}/'))} under it"
        )
    for directory in directories:
        full.setdefault(directory, Entry(directory, DIR_MODE))
    return full, directories


def _read_ahead(
    pool: ThreadPoolExecutor, archives: Sequence[zipfile.ZipFile], entries: Sequence[Entry]
) -> Generator[Sequence[bytes] | Iterator[bytes] | None, None, None]:
    """Each entry's bytes in order (None for a directory), inflated on the pool's threads.

    A small member is inflated whole, up to READ_AHEAD bytes ahead of the writer; a large one
    (a 300 MB library) streams through a short queue of chunks, so the writer hashes and
    writes it while it is still being inflated, and memory stays bounded.
    """
    pending: deque[tuple[Future[bytes] | _Streamed | None, Entry]] = deque()
    streams: list[_Streamed] = []
    ahead, position = 0, 0
    try:
        while position < len(entries) or pending:
            while position < len(entries) and (ahead < READ_AHEAD or not pending):
                entry = entries[position]
                position += 1
                if entry.data is not None or entry.wheel < 0:
                    pending.append((None, entry))
                elif entry.size > STREAMED:
                    streams.append(_Streamed(archives[entry.wheel], entry))
                    pool.submit(streams[-1].produce)
                    pending.append((streams[-1], entry))
                else:
                    pending.append((pool.submit(archives[entry.wheel].read, entry.member), entry))
                ahead += min(entry.size, STREAMED)
            source, entry = pending.popleft()
            ahead -= min(entry.size, STREAMED)
            if isinstance(source, _Streamed):
                yield source.chunks()
            elif source is not None:
                yield (_sized(entry, _inflated(entry, source)),)
            else:
                yield None if entry.data is None else (entry.data,)
    finally:  # the writer stopped (an error, or done): no producer may stay blocked
        for stream in streams:
            stream.cancel()


def _inflated(entry: Entry, source: Future[bytes]) -> bytes:
    """A member's bytes inflated on the pool; one line naming it when they do not inflate."""
    try:
        return source.result()
    except UNREADABLE as error:
        raise unreadable(entry.wheel_name, entry.member, error) from None


def _sized(entry: Entry, data: bytes, found: int | None = None) -> bytes:
    """The tar header was written from the zip's size: the member must inflate to exactly it."""
    found = len(data) if found is None else found
    if found != entry.size:
        raise UserError(
            f"{entry.wheel_name}: {entry.member} inflates to {found} bytes,"
            f" not the {entry.size} its zip entry declares"
        )
    return data


class _Streamed:
    """One large member inflated on a pool thread into a bounded queue the writer drains."""

    def __init__(self, archive: zipfile.ZipFile, entry: Entry) -> None:
        self.archive, self.entry = archive, entry
        self.queue: queue.Queue[bytes | BaseException | None] = queue.Queue(QUEUED)
        self.cancelled = threading.Event()

    def produce(self) -> None:
        try:
            with self.archive.open(self.entry.member) as member:
                while data := member.read(CHUNK):
                    if not self._put(data):
                        return
            self._put(None)
        except BaseException as error:  # handed to the writer, which raises it
            self._put(error)

    def _put(self, item: bytes | BaseException | None) -> bool:
        """Queue `item` unless the writer has stopped; a full queue never blocks for good."""
        while not self.cancelled.is_set():
            with suppress(queue.Full):
                self.queue.put(item, timeout=0.1)
                return True
        return False

    def chunks(self) -> Iterator[bytes]:
        found = 0
        while (item := self.queue.get()) is not None:
            if isinstance(item, UNREADABLE):
                raise unreadable(self.entry.wheel_name, self.entry.member, item) from None
            if isinstance(item, BaseException):
                raise item
            found += len(item)
            yield item
        _sized(self.entry, b"", found)

    def cancel(self) -> None:
        self.cancelled.set()


def _store(cache: Cache, epoch: int, write: Callable[[IO[bytes]], object]) -> Layer:
    """Write the layer tar `write` writes into the cache, named by its diff ID."""
    temp, diff_id = written(cache, write)
    return keep(temp, diff_id, cache, epoch)


def written(cache: Cache, write: Callable[[IO[bytes]], object]) -> tuple[Path, str]:
    """A temporary file in the cache holding what `write` writes, and its sha256."""
    cache.root.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".layer-", dir=cache.root)
    try:
        with os.fdopen(fd, "wb") as raw:
            plain = HashingWriter(raw)
            write(plain)  # type: ignore[arg-type]
    except BaseException:
        os.unlink(temp)
        raise
    return Path(temp), plain.sha256.hex


def keep(temp: Path, diff_id: str, cache: Cache, epoch: int) -> Layer:
    """Move a written tar to its place in the cache (read by builders: mode 0644)."""
    size = temp.stat().st_size
    final = cache.place(temp, diff_id, LAYER_TAR)
    return Layer(final, f"sha256:{diff_id}", size, epoch)


class ChunkStream(io.RawIOBase):
    """A raw stream over an iterator of byte chunks, for tarfile's streaming mode."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks, self.current, self.offset = iter(chunks), b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.offset >= len(self.current):  # an empty chunk is skipped, not the end
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.current, self.offset = chunk, 0
        count = min(len(buffer), len(self.current) - self.offset)
        buffer[:count] = self.current[self.offset : self.offset + count]
        self.offset += count
        return count
