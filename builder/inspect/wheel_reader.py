"""One wheel file → its `WheelInspection`, cached by sha256, read in worker processes.

Wheels can be hundreds of megabytes, so members are streamed: four bytes decide whether a member
is ELF, and only ELF members are copied (chunked) to a temporary file for pyelftools. The result is
a JSON record keyed by the wheel's sha256, so a wheel is read at most once per schema version.
The I/O edge of builder.inspect.wheels, whose decisions it feeds.
"""

from __future__ import annotations

import contextlib
import email.parser
import functools
import gc
import heapq
import multiprocessing
import os
import shutil
import stat
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import cast

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.cache import CHUNK, Cache
from builder.errors import UserError
from builder.inspect.elf import ElfFile, UnreadableElf, is_elf, read_elf
from builder.inspect.loads import LoadSite, scan_sources, worth_reading
from builder.inspect.members import (
    UNPACKED_MAX,
    check_unpacked_size,
    checked_members,
    dist_infos,
    scripts,
)
from builder.inspect.programs import scan_sources as scan_programs
from builder.inspect.wheels import (
    RECORD_KIND,
    SCHEMA,
    WheelInspection,
    WheelRecord,
    derive_top_level,
    install_path,
    newest_date,
    parse_filename,
    public_first,
)

SOURCE_LIMIT = 4 << 20  # a .py file bigger than this is generated data, not a loader
TOP_LEVEL_LIMIT = 1 << 16  # top_level.txt is a few names; never trust it to be small
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)
_WORKERS = multiprocessing.get_context("forkserver")
_WORKERS.set_forkserver_preload([__name__])  # each worker forks with this module imported


def _top_level(
    zf: zipfile.ZipFile, members: Sequence[str], tree_paths: Sequence[str]
) -> tuple[str, ...]:
    """top_level.txt's names that really exist in the tree; else names derived from the tree."""
    derived = derive_top_level(tree_paths)
    listing = [m for m in members if m.count("/") == 1 and m.endswith(".dist-info/top_level.txt")]
    if not listing:
        return derived
    with zf.open(listing[0]) as handle:
        text = handle.read(TOP_LEVEL_LIMIT).decode("utf-8", "replace")
    present = {path.partition("/")[0] for path in tree_paths} | set(derived)
    declared = [line.strip() for line in text.splitlines()]
    named = [name for name in declared if name.isidentifier() and name in present]
    return public_first(named) if named else derived


def _read_member_elf(zf: zipfile.ZipFile, info: zipfile.ZipInfo, tree_path: str) -> ElfFile | None:
    with zf.open(info) as member:
        head = member.read(4)
        if not is_elf(head):
            return None
        with tempfile.NamedTemporaryFile(prefix="bsi-elf-") as temp:
            temp.write(head)
            shutil.copyfileobj(member, temp, CHUNK)
            temp.flush()
            temp.seek(0)
            return read_elf(temp, tree_path)


def _read_sources(
    zf: zipfile.ZipFile, sources: Mapping[str, zipfile.ZipInfo]
) -> tuple[list[LoadSite], list[LoadSite]]:
    """Load sites and program sites of the wheel's Python files (`sources`: tree path →
    member). Each scan reads the files again rather than holding a big wheel's sources.

    The cycle collector is off meanwhile: the scans hold many syntax trees (millions of
    objects, none in a cycle, so reference counting frees them), and its passes over them
    were 10-25 % of a large wheel's inspection (sympy 2.1 s, 1.6 s without).
    """

    def read(tree_path: str) -> bytes:
        info = sources[tree_path]
        return b"" if info.file_size > SOURCE_LIMIT else zf.read(info)

    collecting = gc.isenabled()
    gc.disable()
    try:
        return scan_sources(sources, read), scan_programs(sources, read)
    finally:
        if collecting:
            gc.enable()


def directory_facts(path: Path) -> tuple[int, int, int]:
    """What `read_wheel` records of a wheel from its file and zip directory alone: its size,
    its installed size and its newest date (an inspection record from elsewhere must agree)."""
    with zipfile.ZipFile(path) as zf:
        infos = checked_members(zf, path.name)
        return path.stat().st_size, sum(i.file_size for i in infos), newest_date(infos)


def read_wheel(path: Path, sha256: str) -> WheelInspection:
    """Inspect a wheel file without the cache (always opens the zip)."""
    name, version, tags = parse_filename(path.name)
    elf_files = []
    sources: dict[str, zipfile.ZipInfo] = {}
    member = path.name
    try:
        with zipfile.ZipFile(path) as zf:
            infos = checked_members(zf, path.name)  # a run checked them as the download ended
            members = [info.filename for info in infos]
            tree_paths = []
            for info in infos:
                member = f"{path.name}: {info.filename}"
                tree_path = install_path(info.filename)
                if tree_path is None or info.is_dir():
                    continue
                tree_paths.append(tree_path)
                if tree_path.endswith(".py"):
                    sources[tree_path] = info
                elif info.file_size >= 4:
                    elf = _read_member_elf(zf, info, tree_path)
                    if elf is not None:
                        elf_files.append(elf)
            member = f"{path.name}: Python sources"
            loads, programs = _read_sources(zf, sources)
            member = path.name
            top_level = _top_level(zf, members, tree_paths)
            requires = _requires(zf, members)
            installed_size = sum(info.file_size for info in infos)
            newest = newest_date(infos)
    except UnreadableElf as exc:
        raise UserError(f"{member}: unreadable ELF file ({exc})") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise UserError(f"{member}: not a readable wheel ({exc})") from None
    return WheelInspection(
        filename=path.name,
        sha256=sha256,
        name=name,
        version=version,
        tags=tags,
        top_level=top_level,
        elf_files=tuple(sorted(elf_files, key=lambda elf: elf.path)),
        loads=tuple(sorted(loads, key=lambda site: (site.path, site.line))),
        programs=tuple(programs),
        modules=sum(map(worth_reading, sources)),
        size=path.stat().st_size,
        installed_size=installed_size,
        newest=newest,
        requires=requires,
    )


def _requires(zf: zipfile.ZipFile, members: Sequence[str]) -> tuple[str, ...]:
    """The distribution names METADATA's Requires-Dist lines name, sorted; a line that does
    not parse is left out (the resolver already read the same metadata)."""
    listing = [m for m in members if m.count("/") == 1 and m.endswith(".dist-info/METADATA")]
    if not listing:
        return ()
    with zf.open(listing[0]) as handle:
        metadata = email.parser.BytesParser().parse(handle, headersonly=True)
    names = set()
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            names.add(canonicalize_name(Requirement(str(line)).name))
        except InvalidRequirement:
            continue
    return tuple(sorted(names))


def check_wheel(wheel: Path, limit: int = UNPACKED_MAX) -> None:
    """Every check above on the wheel at `wheel`, reading only its zip directory and its
    entry_points.txt: what a download is held to before anything unpacks it."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            infos = checked_members(archive, wheel.name)
            check_unpacked_size(infos, wheel, limit)
            for dist_info in dist_infos(info.filename for info in infos):
                scripts(archive, dist_info, wheel.name)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise UserError(f"{wheel.name}: not a readable wheel ({error})") from None


def check_housed(wheel: Path, limit: int = UNPACKED_MAX) -> None:
    """A wheelhouse's wheel, before the resolver unpacks it to read its metadata: only its
    unpacked size, and only when its zip directory reads. It may be none of the run's: its
    names are checked with the rest when a run downloads it, and an unreadable one is the
    resolver's to refuse when it is a candidate; one that is no regular file (a FIFO, a
    device) is refused, as the resolver would wait on it forever."""
    try:
        descriptor = os.open(wheel, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO: no wait
    except OSError:
        return
    with open(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):  # the resolver would wait on it
            raise UserError(f"{wheel}: not a regular file; a wheelhouse holds wheel files")
        try:
            with zipfile.ZipFile(file) as archive:
                infos = archive.infolist()
        except (zipfile.BadZipFile, OSError, EOFError):
            return
    check_unpacked_size(infos, wheel, limit)


def member_bytes(wheel: Path, member: str) -> bytes | None:
    """The bytes of the wheel's member `member` (a path in the zip), None if it has none."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                return None
            return archive.read(member)
    except (OSError, zipfile.BadZipFile) as error:
        raise UserError(f"{wheel.name}: cannot read {member} ({error})") from None


def cached_inspection(cache: Cache, filename: str, sha256: str) -> WheelInspection | None:
    """The stored inspection, unless it is missing, of another schema or another filename."""
    record = cache.get_record(RECORD_KIND, sha256)
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        return None
    if record.get("filename") != filename:  # tags and names come from the filename
        return None
    try:
        return WheelInspection.from_dict(cast(WheelRecord, record))  # of this schema: its shape
    except (KeyError, TypeError, ValueError):
        return None


def inspect_wheel(path: Path, sha256: str, cache: Cache) -> WheelInspection:
    """Inspect a wheel, reading the zip only if no record exists for its sha256."""
    found = cached_inspection(cache, path.name, sha256)
    if found is not None:
        return found
    inspection = read_wheel(path, sha256)
    cache.put_record(RECORD_KIND, sha256, inspection.to_dict())
    return inspection


def inspect_as_ready(
    ready: Iterable[tuple[Path, str]],
    cache: Cache,
    workers: int = DEFAULT_WORKERS,
    done: Callable[[str], None] | None = None,
) -> dict[str, WheelInspection]:
    """sha256 -> inspection of each (path, sha256) `ready` yields, e.g. as its download ends.

    Each uncached wheel goes to a worker process as it arrives, so inspection overlaps the
    downloads; the largest waiting goes first (_LargestFirst). pyelftools is pure Python and
    CPU bound (threads would serialize on the GIL); the workers come from a forkserver, not a
    fork of this process, whose download and layer threads may hold locks a forked child would
    inherit held. The pool starts with the first uncached wheel: a set inspected before starts
    no process (the pool's semaphores alone start multiprocessing's resource tracker, an
    interpreter of its own). `done(sha256)` is called as each inspection ends (a timeline).
    """
    found: dict[str, WheelInspection] = {}
    with contextlib.ExitStack() as stack:
        queue: _LargestFirst | None = None
        for path, sha256 in ready:
            cached = cached_inspection(cache, path.name, sha256)
            if cached is not None:
                found[sha256] = cached
                if done is not None:
                    done(sha256)
                continue
            if queue is None:
                pool = ProcessPoolExecutor(max_workers=workers, mp_context=_WORKERS)
                queue = _LargestFirst(stack.enter_context(pool), workers, cache, done)
            queue.add(path, sha256)
        pending = queue.results if queue is not None else {}
        return found | {sha256: future.result() for sha256, future in pending.items()}


class _LargestFirst:
    """Wheels inspected by `workers` processes, the largest waiting one first.

    A set's downloads end close together, the largest last; taken in arrival order, scipy's
    and sympy's inspections (seconds each) started last and ended alone on one core.
    """

    def __init__(
        self,
        pool: ProcessPoolExecutor,
        workers: int,
        cache: Cache,
        done: Callable[[str], None] | None,
    ) -> None:
        self.pool, self.workers, self.cache, self.done = pool, workers, cache, done
        self.lock = threading.RLock()  # a job that ended at once calls back on this thread
        self.waiting: list[tuple[int, str, Path]] = []  # a heap: (-wheel bytes, sha256, path)
        self.running = 0
        self.results: dict[str, Future[WheelInspection]] = {}

    def add(self, path: Path, sha256: str) -> None:
        with self.lock:
            if sha256 in self.results:
                return
            self.results[sha256] = Future()
            heapq.heappush(self.waiting, (-path.stat().st_size, sha256, path))
            self._start()

    def _start(self) -> None:
        with self.lock:
            while self.running < self.workers and self.waiting:
                _, sha256, path = heapq.heappop(self.waiting)
                try:
                    job = self.pool.submit(inspect_wheel, path, sha256, self.cache)
                except Exception as error:  # a broken pool (a worker died): none will start
                    for _, waiting, _ in [(0, sha256, path), *self.waiting]:
                        self.results[waiting].set_exception(error)
                    self.waiting.clear()
                    return
                self.running += 1
                job.add_done_callback(functools.partial(self._ended, sha256))

    def _ended(self, sha256: str, job: Future[WheelInspection]) -> None:
        error = job.exception()
        if error is not None:
            self.results[sha256].set_exception(error)
        else:
            self.results[sha256].set_result(job.result())
        if self.done is not None:
            self.done(sha256)
        with self.lock:
            self.running -= 1
            self._start()  # after a failure too: every result is waited for, as before
