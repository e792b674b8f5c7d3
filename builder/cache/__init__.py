"""A content-addressed cache: wheels, and what the stages made of them, keyed by sha256.

This module is the cache itself (`Cache`: blobs, records, and the locks under which an entry is
made once); `bound` is the size an operator gives it and the prune a run ends with, `prune`
says what it holds and trims it.

Everything is written to a temporary name and renamed into place, so a crash or a parallel
run never leaves a half-written entry that a later run would trust (a record through
builder.files, as every file the tool writes). An entry that is slow to make (a download) is
made under `exclusive`, so a fleet's templates (threads) or parallel runs (processes) that need
the same one wait for the first instead of making it again.

Nothing leaves the cache as a hard link (a build context gets copies). A layer tar, which
leaves it as it is, is found through `checked_blob`: hashed when the file is new to the check
or changed since (written, linked or unlinked: its ctime says so), and removed with a warning
(`warn`: the run's reporter) when it no longer matches its digest, so it is made again.

Every entry found is touched (its mtime is its last use: what a prune removes first is what was
used least recently), a blob under its `exclusive` lock of kind `USE_LOCK`, which a prune
takes too before it removes one. A run says it is using the cache with `in_use`: a prune
(builder.cache.prune) never removes an entry touched since the oldest running run started, so
an entry a run found stays until that run ends, and one it has not looked for yet is either
there whole or not at all (a miss, made again).

uv, the resolver, keeps its own cache in `uv/` here (`uv_cache`), so `--cache-dir` and the bound
cover it too; a run holds it shared while uv runs, and a prune removes it whole only when it gets
it exclusively. The directory is marked as this tool's cache (`CACHEDIR.TAG`); `mark` says what
the layout holds and which directory may be used as a cache at all.

Every stage keeps what it made here, so the cache imports nothing of the project but the errors,
the digest of a file and the writer of files (tests/test_layout.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from builder.digest import CHUNK, HashingWriter
from builder.errors import UserError
from builder.files import sha256_of, write_whole

T = TypeVar("T")
_HEX64 = re.compile("[0-9a-f]{64}")
USE_LOCK = "use-blob"  # `exclusive` kind held while a blob is touched (found) or pruned
RUNS = "runs"  # one file per run using the cache, flock-ed by it while it runs
UV = "uv"  # uv's own cache (UV_CACHE_DIR), one entry of this one
UV_LOCK = "uv.lock"  # under locks/: shared by a run while its uv runs, exclusive by a prune
BLOB_MEMORY = "registry-blobs.json"  # the root's one file: which repositories hold which blob
CHECKED = "checked-blob"  # records: the file of a blob that hashed to its digest (checked_blob)


def default_root() -> Path:
    explicit = os.environ.get("BSI_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "build-sandbox-image"


def touch(path: Path) -> None:
    """Mark `path` used now, by the clock a run's start is read from (time.time()): the
    kernel's own file times trail it by up to a tick, which a prune's comparison would miss."""
    now = time.time()
    with suppress(PermissionError):  # a cache another user wrote, read here: not ours to mark
        os.utime(path, (now, now))


def _unheard(line: str) -> None:
    """Where a cache's warnings go when its maker gives no reporter (a test, a library)."""


def _identity(path: Path) -> dict[str, int]:
    """What changes when a file is written, linked or unlinked: the `CHECKED` record."""
    found = path.stat()
    return {"inode": found.st_ino, "size": found.st_size, "ctime": found.st_ctime_ns}


@dataclass(frozen=True)
class Cache:
    root: Path
    # where a warning goes (a reporter's `warn`: a line starting "warning: ")
    warn: Callable[[str], None] = field(default=_unheard, compare=False, repr=False)

    def __reduce__(self) -> tuple[type[Cache], tuple[Path]]:
        """The root alone to a worker process (an inspection's): its warnings are the run's."""
        return Cache, (self.root,)

    def blob_path(self, sha256: str, filename: str) -> Path:
        """Where a blob lives; both parts come from an index, so neither may name a path."""
        if not _HEX64.fullmatch(sha256):
            raise UserError(f"{filename!r}: {sha256!r} is not a sha256 hex digest")
        if filename in {"", ".", ".."} or "/" in filename or "\\" in filename or "\0" in filename:
            raise UserError(f"{filename!r}: not a plain file name (from an index listing?)")
        return self.root / "blobs" / sha256[:2] / sha256 / filename

    def find_blob(self, sha256: str, filename: str) -> Path | None:
        """The blob's path, touched as used now, under the lock a prune takes to remove it: once
        found, it is newer than any running run's start, which a prune leaves alone."""
        path = self.blob_path(sha256, filename)
        if not path.parent.is_dir():
            return None
        with self.exclusive(USE_LOCK, sha256):
            try:
                touch(path)
            except FileNotFoundError:
                return None
        return path

    def checked_blob(self, sha256: str, filename: str) -> Path | None:
        """`find_blob`'s blob, once its bytes are known to hash to `sha256`; else a miss, the
        entry removed with a warning, so the caller makes it again.

        For what leaves the cache as it is (a layer tar copied into a build context): an entry
        edited through a hard link (an older tool's context held one) must not be passed on
        under a digest it no longer has. A file is hashed once, not at every lookup: a record
        (`CHECKED`) keeps its inode, size and change time (ctime) as the last lookup's touch
        left them. A write to the file, or a link made to it or removed, changes its ctime,
        which no one can set back, so the next lookup finds the record stale and hashes again."""
        path = self.blob_path(sha256, filename)
        try:
            before = _identity(path)  # before find_blob's touch moves the ctime
            if self.find_blob(sha256, filename) is None:
                return None
            after = _identity(path)
            if self.get_record(CHECKED, sha256) == before or sha256_of(path) == sha256:
                with suppress(OSError):  # a cache this user may not write: hashed next time
                    self.put_record(CHECKED, sha256, after)
                return path
        except FileNotFoundError:  # pruned meanwhile, or never made: a miss
            return None
        with self.exclusive(USE_LOCK, sha256):
            path.unlink(missing_ok=True)
        self.warn(f"cache: {path} no longer hashes to {sha256[:12]}; removed, made again")
        return None

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """Held by a run while it uses the cache: a file under `runs/` naming its start, locked
        until it ends (or dies), so a prune keeps whatever the run touched since."""
        runs = self.root / RUNS
        runs.mkdir(parents=True, exist_ok=True)
        name = f"{os.getpid()}-{uuid.uuid4().hex}"
        path, temp = runs / name, runs / f".{name}"
        with temp.open("w") as held:  # locked before a prune can see it: renamed once locked
            fcntl.flock(held, fcntl.LOCK_EX)
            held.write(repr(time.time()))
            held.flush()
            temp.rename(path)
            try:
                yield
            finally:
                path.unlink(missing_ok=True)

    @contextmanager
    def uv_cache(self) -> Iterator[Path]:
        """uv's cache directory, held (a shared flock) while a uv process uses it: a prune takes
        the lock exclusively to remove it, so never under a running uv. The lock's mtime is the
        cache's last use (uv reads its entries without touching them)."""
        lock = self.root / "locks" / UV_LOCK
        lock.parent.mkdir(parents=True, exist_ok=True)
        with lock.open("a") as held:
            fcntl.flock(held, fcntl.LOCK_SH)
            touch(lock)
            yield self.root / UV

    @contextmanager
    def writing_blob(self, sha256: str, filename: str) -> Iterator[IO[bytes]]:
        """Open a temporary file that becomes the blob only if it hashes to `sha256`."""
        self.blob_path(sha256, filename)  # both parts checked before anything is written
        self.root.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=self.root, prefix=".partial-")
        try:
            with os.fdopen(fd, "wb") as handle:
                hashing = HashingWriter(handle)  # a download is never read back to check it
                yield hashing  # type: ignore[misc]
            actual = hashing.sha256.hex
            if actual != sha256:
                raise ValueError(f"{filename}: sha256 {actual} does not match the lock ({sha256})")
            self.place(Path(temp), sha256, filename)
        finally:
            if os.path.exists(temp):
                os.unlink(temp)

    def place(self, temp: Path, sha256: str, filename: str) -> Path:
        """Rename a finished temporary file (in the cache's root) into place as the blob, readable
        by builders (BuildKit reads a context's copies), under the lock a prune takes to remove the
        blob's directory: a prune never removes the directory between its making and the rename.
        """
        final = self.blob_path(sha256, filename)
        with self.exclusive(USE_LOCK, sha256):
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(temp, 0o644)
            os.replace(temp, final)
            touch(final)
        return final

    def add_blob(self, source: Path, filename: str) -> tuple[Path, str]:
        """Copy a local file (a wheel built on the host) into the cache."""
        sha256 = sha256_of(source)
        found = self.find_blob(sha256, filename)
        if found:
            return found, sha256
        with self.writing_blob(sha256, filename) as handle, source.open("rb") as src:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                handle.write(chunk)
        return self.blob_path(sha256, filename), sha256

    @contextmanager
    def exclusive(self, kind: str, key: str) -> Iterator[None]:
        """Held while one caller makes the entry `key` of `kind` (a sha256, checked by the caller).

        Each open is its own flock, so threads exclude one another as processes do; the lock
        goes with the file's closing, or with a process that dies holding it. The holder
        removes the lock file as it leaves (no file per entry stays behind), so a waiter that
        gets a lock on a removed file tries again on the path's new one.
        """
        lock = self.root / "locks" / kind / key[:2] / f"{key}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        while True:
            held = lock.open("a")
            fcntl.flock(held, fcntl.LOCK_EX)
            try:
                if os.stat(lock).st_ino == os.fstat(held.fileno()).st_ino:
                    break
            except FileNotFoundError:
                pass
            held.close()
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
            held.close()

    def made_once(
        self, kind: str, key: str, kept: Callable[[], T | None], make: Callable[[], T]
    ) -> T:
        """What `kept` finds in the cache, else what `make` makes, while no other caller (a
        thread or a process) makes the entry `key` of `kind`: one that asks meanwhile waits,
        then finds it, instead of doing the same work again beside it."""
        if (found := kept()) is not None:
            return found
        with self.exclusive(kind, key):
            found = kept()
            return found if found is not None else make()

    def _record_path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.json"

    def get_record(self, kind: str, key: str) -> Any | None:
        """The record, touched as used now (a record is read whole in one go: a prune that
        removes it meanwhile leaves this read its bytes, or a miss)."""
        path = self._record_path(kind, key)
        try:
            value = json.loads(path.read_text())
            touch(path)
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return value

    def put_record(self, kind: str, key: str, value: Any) -> None:
        """Record `value` atomically; a record that already says the same is left as it is (a
        rerun that changed nothing writes nothing)."""
        path = self._record_path(kind, key)
        text = json.dumps(value, sort_keys=True)
        try:
            if path.read_text() == text:
                touch(path)
                return
        except (FileNotFoundError, UnicodeDecodeError):
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, text)
        touch(path)
