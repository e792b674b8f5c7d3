"""Bytecode for the extras: compiled by the base's own CPython, natively, byte for byte the same.

uid 65532 cannot write `__pycache__` in a read-only layer, so a module shipped without its
`.pyc` is compiled from source on every interpreter start, in every sandbox command. pip
compiles when it installs; the tool writes the extras itself, so it compiles them here:

- **With the target's interpreter.** The base image's `python3` runs in a throwaway container
  (no network, uid 65532) on the engine's own arch: the marshal format is machine-independent
  and a `.pyc` name carries only the CPython version, so one compile serves amd64 and arm64 and
  nothing runs under emulation. The interpreter's identity (`sys.version`, magic number, and the
  sha256 of the executable and of the libpython it loaded) keys every result, so a base with a
  byte-identical interpreter reuses them.
- **Reproducibly.** `--invalidation-mode unchecked-hash` (PEP 552): a timestamp `.pyc` is
  valid only while the source's mtime and size match what it recorded, so it would tie the
  bytecode to the mtimes of wherever it was compiled; an unchecked hash-based one records the
  source's hash and is never re-validated against sources a read-only layer cannot change.
  Output still varies with what one interpreter compiled before (CPython gh-129724: a file
  holding `{"foo", 2, 3}` compiles differently after one that imports `foo`; gh-78274:
  marshal's reference flags follow reference counts), so each distribution is compiled by a
  fresh interpreter, its files in sorted order, one after another, with `PYTHONHASHSEED=0` so
  that nothing hash-ordered can vary; distributions run side by side, one per core.
- **Where pip would.** Every `.py` a wheel installs outside `bin/` (what `pip install --target`
  compiles), named in tracebacks by its installed path (`dfile`). A file that does not compile
  (a Python 2 test fixture) is skipped, as pip skips it, and counted.

Each distribution's bytecode is cached by (wheel sha256, interpreter, root); a layer is
assembled from those parts in lock order (a later wheel's file wins, as in the deps layer).
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import io
import json
import os
import posixpath
import socket
import tarfile
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypedDict

import docker
import docker.errors

from builder.cache import Cache
from builder.contract import SANDBOX_USER
from builder.engines.connection import demultiplexed
from builder.errors import UserError
from builder.inspect.members import UNREADABLE, unreadable
from builder.layers.first_reads import LAYOUT_FORMAT, cached_first_reads, laid_out
from builder.layers.gzipped import packed
from builder.layers.install_layout import LAYER_TAR, install_entries
from builder.layers.layer import Layer, keep, written

BYTECODE_FORMAT = "bytecode/2"  # bump when the compile recipe or the tar layout changes
COMPILED_FILE = "bytecode.tar.gz"  # a distribution's .pyc, gzipped in the cache (gzipped.packed)
COMPILED = "bytecode"  # the cache's records: a wheel compiled by an interpreter -> its tar
LAYER_KEY = f"{BYTECODE_FORMAT}\n{LAYOUT_FORMAT}"  # a bytecode layer's: its order is the layout's
# Distributions compiled at once, each a fresh interpreter: one per core, as uv compiles. The
# compiling engine is always one reached over a unix socket (Engines.compiling_client), so its
# cores are this machine's. A distribution's bytes do not depend on what runs beside it.
COMPILERS = os.cpu_count() or 1
DIR_MODE = 0o755
FILE_MODE = 0o644

# Runs in the base's interpreter: who it is. The libpython it mapped counts as much as the
# executable (a shared build keeps the compiler there).
IDENTITY_SCRIPT = """
import hashlib, importlib.util, json, os, sys
def sha(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
libs = sorted({line.split()[-1] for line in open("/proc/self/maps")
               if "libpython" in line.rsplit("/", 1)[-1] and line.split()[-1].startswith("/")})
print(json.dumps({
    "version": sys.version,
    "cache_tag": sys.implementation.cache_tag,
    "magic": importlib.util.MAGIC_NUMBER.hex(),
    "executable": sha(os.path.realpath(sys.executable)),
    "libpython": {os.path.basename(p): sha(p) for p in libs},
}, sort_keys=True))
"""

# Runs in a fresh interpreter per distribution. Reads the sources as a tar on stdin (sorted by
# the host), compiles each one after the other exactly as py_compile does with
# --invalidation-mode unchecked-hash (compile() under the installed path, then the hash-based
# .pyc of the source's bytes) and writes a tar of the .pyc and a summary to stdout once stdin
# is done, so nothing is written to disk and the host never has to read while it sends.
COMPILE_SCRIPT = """
import importlib.util, io, json, sys, tarfile
from importlib._bootstrap_external import _code_to_hash_pyc
root, tag = sys.argv[1], sys.implementation.cache_tag
pycs, skipped = [], []
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as sources:
    for member in sources:
        data = sources.extractfile(member).read()
        try:
            code = compile(data, root + "/" + member.name, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, UnicodeDecodeError):
            skipped.append(member.name)
            continue
        head, _, name = member.name.rpartition("/")
        path = (head + "/" if head else "") + "__pycache__/" + name[:-3] + "." + tag + ".pyc"
        pycs.append((path, _code_to_hash_pyc(code, importlib.util.source_hash(data), False)))
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as out:
    for path, pyc in pycs + [("summary.json", json.dumps({"skipped": skipped}).encode())]:
        info = tarfile.TarInfo(path)
        info.size = len(pyc)
        out.addfile(info, io.BytesIO(pyc))
"""


def installed_python_sources(wheel: Path) -> list[tuple[str, str]]:
    """(path under the --target root, wheel member) of each .py module the wheel installs.

    What pip byte-compiles: modules in purelib/platlib, not the scripts in `bin/`.
    """
    with zipfile.ZipFile(wheel) as archive:
        entries = install_entries(archive, 0, wheel.name)
    return sorted(
        (entry.path, entry.member)
        for entry in entries
        if entry.path.endswith(".py") and entry.member and not entry.path.startswith("bin/")
    )


@dataclass(frozen=True)
class Interpreter:
    """The CPython that compiles: what the bytecode depends on, and the image it runs in."""

    image: str  # an engine image holding it (the base, or its system stage)
    version: str  # sys.version
    cache_tag: str  # cpython-313: part of every .pyc name
    build: str  # sha256 of everything above plus the executable's and libpython's sha256

    def to_dict(self) -> dict[str, str]:
        return {"version": self.version, "cache_tag": self.cache_tag, "build": self.build}


@dataclass(frozen=True)
class Compiled:
    """One distribution's bytecode: a tar in the cache of paths relative to the extras root."""

    wheel_sha256: str
    tar: Path
    compiled: int
    skipped: tuple[str, ...]  # sources that did not compile, relative to the root
    first: tuple[str, ...] = ()  # sources importing it reads first (builder.layers.first_reads)


@dataclass(frozen=True)
class BytecodeLayer:
    """The bytecode of a set, as one layer: what it holds, and which sources did not compile."""

    layer: Layer
    interpreter: Interpreter
    compiled: int
    skipped: tuple[str, ...]


class Compiler:
    """A container of the base's interpreter that compiles one distribution per fresh process.

    Use as a context manager: the container (no network, uid 65532, the image's entrypoint
    replaced by a sleep) is removed on exit. Results come from the cache when this interpreter
    compiled the same wheel for the same root before. An image given by its engine id (what
    builder.layers.interpreter passes) cannot change its python3, so the interpreter identified
    in it before is taken from the cache, and the container starts only when a wheel is not
    compiled yet: a no-change rerun starts none.
    """

    def __init__(self, client: docker.DockerClient, image: str, cache: Cache, root: str) -> None:
        self.client, self.image, self.cache, self.root = client, image, cache, root.rstrip("/")
        self.container: Any = None
        self.interpreter: Interpreter | None = None
        self.lock = threading.Lock()  # one start, whichever compile needs the container first

    def __enter__(self) -> Compiler:
        key = self._image_key()
        record = self.cache.get_record("interpreter-of-image", key) if key else None
        if record:
            self.interpreter = Interpreter(
                self.image, record["version"], record["cache_tag"], record["build"]
            )
        else:
            self._start()
        return self

    def _image_key(self) -> str:
        """The record key of a content-addressed image; a tag's python3 may change: none."""
        if not self.image.startswith("sha256:"):
            return ""
        return hashlib.sha256(f"{BYTECODE_FORMAT}\n{self.image}".encode()).hexdigest()

    def __exit__(self, *exc: object) -> None:
        if self.container is not None:
            with contextlib.suppress(docker.errors.DockerException):  # already gone
                self.container.remove(force=True)

    def _start(self) -> None:
        try:
            self.container = self.client.containers.run(
                self.image,
                entrypoint=["sleep", "infinity"],
                command=[],
                detach=True,
                network_disabled=True,
                read_only=True,  # the compile reads stdin and writes stdout, nothing else
                user=SANDBOX_USER,
                labels={"org.build-sandbox-image.role": "bytecode"},
            )
        except docker.errors.DockerException as error:
            raise UserError(f"bytecode: cannot start {self.image}: {error}") from None
        found = self._identify()
        if self.interpreter is not None and found.build != self.interpreter.build:
            raise UserError(f"bytecode: the python3 of {self.image} changed; run the build again")
        self.interpreter = found
        if key := self._image_key():
            self.cache.put_record("interpreter-of-image", key, found.to_dict())

    def _exec(self, argv: Sequence[str], what: str, stdin: bytes = b"") -> bytes:
        """stdout of `python3 argv` in the container, `stdin` sent first; a failure names `what`.

        -s -P and an empty PYTHONPATH: the base's own /app/deps cannot shadow the stdlib; not
        -I, which would also drop PYTHONHASHSEED.
        """
        api = self.client.api
        started = api.exec_create(
            self.container.id,
            ["python3", "-s", "-P", *argv],
            stdin=True,
            user=SANDBOX_USER,
            environment={"PYTHONPATH": "", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"},
        )
        connection = api.exec_start(started["Id"], socket=True)
        try:
            raw: Any = getattr(connection, "_sock", connection)  # the hijacked HTTP connection
            raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)  # EOF on the process's stdin
            stdout, stderr = demultiplexed(raw)
        finally:
            connection.close()
        if api.exec_inspect(started["Id"])["ExitCode"] != 0:
            last = (stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
            raise UserError(f"bytecode: {what} failed in {self.image}: {' '.join(last)[:200]}")
        return stdout or b""

    def _identify(self) -> Interpreter:
        facts = json.loads(self._exec(["-c", IDENTITY_SCRIPT], "identifying python3"))
        build = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
        return Interpreter(self.image, facts["version"], facts["cache_tag"], build)

    def compile(self, wheel_sha256: str, wheel: Path) -> Compiled:
        """One wheel's bytecode, from the cache when this interpreter made it before."""
        assert self.interpreter is not None, "use the Compiler as a context manager"
        key = compiled_key(wheel_sha256, self.interpreter.build, self.root)
        record = self.cache.get_record(COMPILED, key)
        if record and (tar := self.cache.find_blob(record["tar"], COMPILED_FILE)):
            found = record["compiled"], tuple(record["skipped"])
            first = cached_first_reads(wheel, wheel_sha256, self.cache)
            return Compiled(wheel_sha256, tar, *found, first)
        with self.lock:
            if self.container is None:
                self._start()
        output = self._exec(
            ["-c", COMPILE_SCRIPT, self.root], f"compiling {wheel.name}", _sources_tar(wheel)
        )
        pycs, summary = _pyc_members(output)
        pack = packed(lambda out: normalized_tar(out, pycs.items(), "", 0))
        temp, digest = written(self.cache, pack)
        tar = self.cache.place(temp, digest, COMPILED_FILE)
        skipped = tuple(sorted(summary["skipped"]))
        self.cache.put_record(
            COMPILED, key, {"tar": digest, "compiled": len(pycs), "skipped": skipped}
        )
        first = cached_first_reads(wheel, wheel_sha256, self.cache)
        return Compiled(wheel_sha256, tar, len(pycs), skipped, first)


def compiled_key(wheel_sha256: str, build: str, root: str) -> str:
    """What a distribution's bytecode is a function of, hashed: its record's key."""
    text = f"{BYTECODE_FORMAT}\n{wheel_sha256}\n{build}\n{root}"
    return hashlib.sha256(text.encode()).hexdigest()


class CompileQueue:
    """Wheels compiled as they arrive (a cold build's downloads), the largest waiting one first.

    A distribution's bytecode depends only on its own sources (each gets a fresh interpreter),
    so the order across distributions changes no byte: compiling one as soon as its download
    ended hides the compile behind the downloads still running, and taking the one with the
    most source first keeps the biggest (scipy, sympy: seconds each) from ending last, alone
    on one core. `compiler` is called by each job: it waits for a Compiler still starting.
    `done(sha256)` is called as each wheel's compile ends (a run's timeline).
    """

    def __init__(
        self,
        compiler: Callable[[], Compiler],
        pool: Executor,
        done: Callable[[str], None] | None = None,
    ) -> None:
        self.compiler, self.pool, self.done = compiler, pool, done
        self.waiting: list[tuple[int, str, Path]] = []  # a heap: (-source bytes, sha256, wheel)
        self.jobs: dict[str, Future[Compiled]] = {}
        self.lock = threading.Lock()

    def add(self, wheel_sha256: str, wheel: Path) -> None:
        """Queue one wheel (once per sha256); a free job takes the largest waiting."""
        size = _source_bytes(wheel)
        with self.lock:
            if wheel_sha256 in self.jobs:
                return
            heapq.heappush(self.waiting, (-size, wheel_sha256, wheel))
            self.jobs[wheel_sha256] = self.pool.submit(self._next)

    def add_as_ready(self, ready: Iterable[tuple[Path, str]]) -> None:
        """Queue each (wheel, sha256) `ready` yields, e.g. as its download ends."""
        for wheel, wheel_sha256 in ready:
            self.add(wheel_sha256, wheel)

    def _next(self) -> Compiled:
        compiler = self.compiler()
        with self.lock:
            _, sha, wheel = heapq.heappop(self.waiting)
        compiled = compiler.compile(sha, wheel)
        if self.done is not None:
            self.done(sha)
        return compiled

    def results(self) -> dict[str, Compiled]:
        """Every queued wheel's bytecode by sha256, once all are compiled (add no more)."""
        with self.lock:
            jobs = list(self.jobs.values())
        return {part.wheel_sha256: part for part in (job.result() for job in jobs)}


@contextlib.contextmanager
def cancelled_on_error(pool: ThreadPoolExecutor) -> Iterator[ThreadPoolExecutor]:
    """`pool`, whose queued jobs are dropped if the block fails: the error is not held back
    until every wheel queued (a cold build's hundreds) is compiled for nothing. The jobs
    already running finish: the pool's own exit waits for them."""
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def bytecode_layer(
    parts: Sequence[Compiled],
    interpreter: Interpreter,
    root: str,
    epoch: int,
    cache: Cache,
    shadowed: frozenset[str] = frozenset(),
) -> BytecodeLayer:
    """One layer of the parts' bytecode under `root`, in lock order: a later wheel's file wins.

    `shadowed` sources (a later distribution of the set installs them: see
    builder.layers.layer.LayerWheels) get no bytecode here; the winner's layer carries theirs.
    Cached by the parts' own digests, the root, the epoch (every mtime in the tar) and those.
    """
    root = root.strip("/")
    key_text = "\n".join(
        [LAYER_KEY, root, str(epoch), *(p.tar.parent.name for p in parts), *sorted(shadowed)]
    )
    key = hashlib.sha256(key_text.encode()).hexdigest()
    compiled = sum(p.compiled for p in parts)
    skipped = tuple(sorted({s for p in parts for s in p.skipped}))
    record = cache.get_record("bytecode-layer", key)
    if record and (path := cache.checked_blob(record["diff_id"].split(":", 1)[1], LAYER_TAR)):
        layer = Layer(path, record["diff_id"], record["size"], epoch)
        return BytecodeLayer(layer, interpreter, compiled, skipped)
    files: dict[str, bytes] = {}
    for part in parts:
        with tarfile.open(part.tar) as archive:
            for member in archive:
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted is not None and source_of(member.name) not in shadowed:
                    files[member.name] = extracted.read()
    pyc_of = {source_of(name): name for name in files}
    first = [pyc_of[source] for part in parts for source in part.first if source in pyc_of]
    temp, digest = written(
        cache, lambda out: normalized_tar(out, files.items(), root, epoch, first)
    )
    layer = keep(temp, digest, cache, epoch)
    cache.put_record("bytecode-layer", key, {"diff_id": layer.diff_id, "size": layer.size})
    return BytecodeLayer(layer, interpreter, compiled, skipped)


def source_of(pyc: str) -> str:
    """The source a `__pycache__/<name>.<tag>.pyc` path was compiled from."""
    cache_dir, name = posixpath.split(pyc)
    return posixpath.join(posixpath.dirname(cache_dir), name.split(".", 1)[0] + ".py")


def _source_bytes(wheel: Path) -> int:
    """How much Python a wheel holds: what its compile time follows (read from the zip index)."""
    with zipfile.ZipFile(wheel) as archive:
        return sum(info.file_size for info in archive.infolist() if info.filename.endswith(".py"))


def _sources_tar(wheel: Path) -> bytes:
    """The wheel's installed .py files, by path under the root, sorted: the compile's input."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(wheel) as archive, tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, member in installed_python_sources(wheel):
            try:
                data = archive.read(member)
            except UNREADABLE as error:
                raise unreadable(wheel.name, member, error) from None
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class CompileSummary(TypedDict):
    """The compile script's `summary.json`: the sources that did not compile."""

    skipped: list[str]


def _pyc_members(output: bytes) -> tuple[dict[str, bytes], CompileSummary]:
    """The compile's .pyc by path, and its summary, from the tar it wrote."""
    pycs: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(output), mode="r:") as archive:
        for member in archive:
            extracted = archive.extractfile(member) if member.isfile() else None
            if extracted is not None:
                pycs[member.name] = extracted.read()
    summary = json.loads(pycs.pop("summary.json", b"{}") or b"{}")
    if "skipped" not in summary:
        raise UserError("bytecode: the compile gave no summary")
    return pycs, summary


def normalized_tar(
    out: IO[bytes] | Any,
    files: Iterable[tuple[str, bytes]],
    root: str,
    epoch: int,
    first: Sequence[str] = (),
) -> None:
    """A normalized tar: every parent directory, root-owned, fixed modes and mtimes; sorted,
    but for the `first` files (what the first import reads), put right after the directories."""
    prefix = f"{root}/" if root else ""
    members = {f"{prefix}{path}": data for path, data in files}
    directories = {
        "/".join(name.split("/")[:depth])
        for name in members
        for depth in range(1, name.count("/") + 1)
    }
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        leading = [f"{prefix}{path}" for path in first]
        for name in laid_out(sorted(directories | set(members)), directories, leading):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if name in members:
                info.size, info.mode = len(members[name]), FILE_MODE
                tar.addfile(info, io.BytesIO(members[name]))
            else:
                info.type, info.mode = tarfile.DIRTYPE, DIR_MODE
                tar.addfile(info)
