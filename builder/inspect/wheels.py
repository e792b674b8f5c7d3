"""One wheel → the facts planning needs (tags, top-level names, ELF files), cached by sha256.

Wheels can be hundreds of megabytes, so members are streamed: four bytes decide whether a member
is ELF, and only ELF members are copied (chunked) to a temporary file for pyelftools. The result is
a JSON record keyed by the wheel's sha256, so a wheel is read at most once per schema version.
"""

from __future__ import annotations

import calendar
import contextlib
import email.parser
import functools
import gc
import heapq
import multiprocessing
import os
import shutil
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from builder.cache import CHUNK, Cache
from builder.errors import UserError
from builder.inspect.elf import ElfFile, ElfRecord, UnreadableElf, is_elf, read_elf
from builder.inspect.loads import LoadRecord, LoadSite, scan_sources, worth_reading
from builder.inspect.members import checked_members
from builder.inspect.programs import scan_sources as scan_programs

RECORD_KIND = "inspect"
SCHEMA = 11  # bump whenever WheelInspection or the way it is derived changes
LIBRARY_SCHEMES = ("purelib", "platlib")  # .data schemes that pip --target puts at the root
MODULE_SUFFIXES = (".py", ".pyc", ".so")
SOURCE_LIMIT = 4 << 20  # a .py file bigger than this is generated data, not a loader
TOP_LEVEL_LIMIT = 1 << 16  # top_level.txt is a few names; never trust it to be small
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)
_WORKERS = multiprocessing.get_context("forkserver")
_WORKERS.set_forkserver_preload([__name__])  # each worker forks with this module imported


class WheelRecord(TypedDict):
    """A `WheelInspection` as the inspection cache holds it (JSON), keyed by the wheel's sha256."""

    schema: int
    filename: str
    sha256: str
    name: str
    version: str
    tags: list[str]
    top_level: list[str]
    elf_files: list[ElfRecord]
    loads: list[LoadRecord]
    programs: list[LoadRecord]
    modules: int
    size: int
    installed_size: int
    newest: int
    requires: list[str]


@dataclass(frozen=True)
class WheelInspection:
    """What a wheel installs and what its ELF files need."""

    filename: str
    sha256: str
    name: str  # PEP 503 normalized
    version: str
    tags: tuple[str, ...]  # expanded from the compressed tag set, sorted
    top_level: tuple[str, ...]  # importable top-level names, public names first
    elf_files: tuple[ElfFile, ...]  # sorted by install path
    loads: tuple[LoadSite, ...] = ()  # run-time library loads in its Python code, by path
    programs: tuple[LoadSite, ...] = ()  # programs its Python code runs (inspect.programs)
    modules: int = 0  # Python modules the sandbox may run (not tests): what `programs` are of
    size: int = 0  # the wheel file, bytes
    installed_size: int = 0  # every member unpacked, bytes
    newest: int = 0  # the newest member date, UTC seconds (newest_date): SOURCE_DATE_EPOCH's
    # Names its METADATA requires (Requires-Dist), markers and extras aside: who may import whom,
    # as much as the metadata says (what --override may drop without orphaning a linked library)
    requires: tuple[str, ...] = ()

    @property
    def is_pure(self) -> bool:
        return not self.elf_files

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    def to_dict(self) -> WheelRecord:
        return {
            "schema": SCHEMA,
            "filename": self.filename,
            "sha256": self.sha256,
            "name": self.name,
            "version": self.version,
            "tags": list(self.tags),
            "top_level": list(self.top_level),
            "elf_files": [elf.to_dict() for elf in self.elf_files],
            "loads": [site.to_dict() for site in self.loads],
            "programs": [site.to_dict() for site in self.programs],
            "modules": self.modules,
            "size": self.size,
            "installed_size": self.installed_size,
            "newest": self.newest,
            "requires": list(self.requires),
        }

    @classmethod
    def from_dict(cls, data: WheelRecord) -> WheelInspection:
        return cls(
            filename=data["filename"],
            sha256=data["sha256"],
            name=data["name"],
            version=data["version"],
            tags=tuple(data["tags"]),
            top_level=tuple(data["top_level"]),
            elf_files=tuple(ElfFile.from_dict(elf) for elf in data["elf_files"]),
            loads=tuple(LoadSite.from_dict(site) for site in data["loads"]),
            programs=tuple(LoadSite.from_dict(site) for site in data["programs"]),
            modules=int(data["modules"]),
            size=data["size"],
            installed_size=data["installed_size"],
            newest=int(data["newest"]),  # a damaged record fails here and is read again
            requires=tuple(data["requires"]),
        )


def newest_date(infos: Iterable[zipfile.ZipInfo]) -> int:
    """The newest member date of a zip, in seconds; read as UTC (a zip's dates name no zone),
    so the same wheel gives the same date on every machine. 0 for an empty zip."""
    return max((calendar.timegm((*info.date_time, 0, 0, 0)) for info in infos), default=0)


def install_path(member: str) -> str | None:
    """Where a wheel member lands under `pip install --target`, or None if not in the tree.

    `<dist>-<ver>.data/purelib|platlib/` go to the root; the other .data schemes (scripts,
    headers, data) go elsewhere and are never loaded as libraries from the tree.
    """
    first, _, rest = member.partition("/")
    if not first.endswith(".data"):
        return member
    scheme, _, inner = rest.partition("/")
    return inner if scheme in LIBRARY_SCHEMES and inner else None


def _excluded_dir(name: str) -> bool:
    return name == "__pycache__" or name.endswith((".dist-info", ".data", ".libs", ".egg-info"))


def _public_first(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(names), key=lambda name: (name.startswith("_"), name)))


def derive_top_level(tree_paths: Iterable[str]) -> tuple[str, ...]:
    """Top-level packages (dirs holding Python or extension files) and modules of a tree."""
    names = set()
    for path in tree_paths:
        first, sep, rest = path.partition("/")
        if sep:
            if first.isidentifier() and not _excluded_dir(first) and rest.endswith(MODULE_SUFFIXES):
                names.add(first)
        elif first.endswith(MODULE_SUFFIXES):
            # foo.py, foo.cpython-313-x86_64-linux-gnu.so, foo.abi3.so: module names hold no dot
            module = first.partition(".")[0]
            if module.isidentifier():
                names.add(module)
    return _public_first(names)


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
    return _public_first(named) if named else derived


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


def _parse_filename(filename: str) -> tuple[str, str, tuple[str, ...]]:
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise UserError(f"{filename}: not a valid wheel filename ({exc})") from None
    return name, str(version), tuple(sorted(str(tag) for tag in tags))


def read_wheel(path: Path, sha256: str) -> WheelInspection:
    """Inspect a wheel file without the cache (always opens the zip)."""
    name, version, tags = _parse_filename(path.name)
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
