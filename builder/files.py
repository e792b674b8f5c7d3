"""Files the tool writes where a user works: whole or not at all, never through a symlink.

The requirements, the config and the project folder are a team's, and the runner that builds
them holds registry logins and signing keys: a symlink planted in the folder must not turn a
write of the tool's into a write of a file elsewhere. So every file the tool writes outside its
cache (the state, the config on `rebuild`, the template, a shard table, a part record, every
file of a build context) goes through `replacing`:

- the bytes go to a fresh temporary file beside the target, made exclusively
  (`O_CREAT | O_EXCL | O_NOFOLLOW`) under a random name, so nothing planted at any name is
  opened, let alone followed;
- it is renamed over the target once complete: rename(2) replaces a directory entry and never
  follows a symlink there, so a reader sees the old file or the new one, never half of one;
- a target that is a symlink is refused before anything is written, with one line naming it
  (`refuse_link`): the tool replaces only a regular file and never what a link points to,
  inside the project or out of it; so is a directory on the way from a config's directory to a
  file it names (`refuse_links_below`);
- the new file keeps the mode of the one it replaces (a config or a template checked in as
  0640 stays 0640); a new one gets the usual 0666 less the umask, as `open()` gives;
- a record others rely on (the state, a table, a part's record) is flushed to disk before the
  rename and the directory after it (`durable`); a build context, remade on the next run, is not.

`copy_whole` copies a file (a layer tar out of the cache) the same way, as a reflink where the
file system has them (the blocks shared copy-on-write: an edit of either copy leaves the other
as it was), else in the kernel (`copy_file_range`), else through memory: never a hard link,
which would make an edit of the copy an edit of the cache.

The cache (builder.cache) writes its own entries the same way: a fresh temporary file in the
cache, renamed into place. `sha256_of` is a file's sha256, counted by builder.digest's
`Sha256` a chunk at a time. Imports nothing of the project but the errors and the digest.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

from builder.digest import CHUNK, Sha256
from builder.errors import UserError

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_MODE = 0o666  # less the umask, which the kernel applies at the open
_ATTEMPTS = 100  # random names tried before giving up (each taken name is someone's file)
_FICLONE = 0x40049409  # linux/fs.h _IOW(0x94, 9, int): share the source's blocks, copy-on-write
_NOT_HERE = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS})


def refuse_link(path: Path) -> None:
    """One error line when `path`, a file the tool would replace, is a symlink."""
    if path.is_symlink():
        raise UserError(
            f"{path}: is a symbolic link; the tool never writes through one"
            " (name the file or directory itself)"
        )


def refuse_links_below(base: Path, path: Path) -> None:
    """One error line when `path`, to be written, passes through a symlink below `base` (the
    directory of a team's config: `st/state.json` with `st` a link writes wherever `st` points).
    A path not below `base` (absolute) has its last component checked alone."""
    if not path.is_relative_to(base):
        refuse_link(path)
        return
    below = base
    for part in path.relative_to(base).parts:
        below = below / part
        refuse_link(below)


@contextmanager
def replacing(path: Path, *, durable: bool = False) -> Iterator[IO[bytes]]:
    """A new file that replaces `path` when the block ends without an error; none otherwise."""
    refuse_link(path)
    mode = _kept_mode(path)
    fd, temp = _fresh(path)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            if durable:
                os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    if durable:
        _sync_directory(path.parent)


def write_whole(path: Path, data: bytes | str, *, durable: bool = False) -> None:
    """`data` (text as UTF-8) as the file at `path`, through `replacing`."""
    with replacing(path, durable=durable) as out:
        out.write(data.encode() if isinstance(data, str) else data)


def named_contents(paths: Iterable[Path]) -> tuple[tuple[str, bytes], ...]:
    """Each file's name and its bytes, read whole: the inputs a run was given, for the documents
    that name them by content (attest.provenance.input_files)."""
    return tuple((path.name, path.read_bytes()) for path in paths)


def file_sha256(path: Path) -> Sha256:
    """The sha256 and size of the file at `path`, read a chunk at a time."""
    found = Sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            found.update(chunk)
    return found


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file at `path`: how the cache and a lock name it."""
    return file_sha256(path).hex


def copy_whole(source: Path, destination: Path) -> None:
    """A copy of `source` as the file at `destination`, through `replacing`: a reflink where
    the file system shares blocks, else a copy made in the kernel, else through memory."""
    with source.open("rb") as src, replacing(destination) as out:
        if not _cloned(src, out):
            _copied(src, out)


def _fresh(path: Path) -> tuple[int, str]:
    """A new file beside `path` under a random name, opened exclusively, never a link."""
    stem = path.name[:64]  # room for the suffix within a name's 255 bytes
    for _ in range(_ATTEMPTS):
        temp = os.path.join(path.parent, f".{stem}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(temp, _FLAGS, _NEW_MODE), temp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def _kept_mode(path: Path) -> int | None:
    """The permission bits of the regular file `path` replaces; None when there is none."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    return found.st_mode & 0o777 if stat.S_ISREG(found.st_mode) else None


def _cloned(src: IO[bytes], out: IO[bytes]) -> bool:
    """Share the source's blocks (btrfs, XFS, bcachefs); False where the file system cannot."""
    try:
        fcntl.ioctl(out.fileno(), _FICLONE, src.fileno())
    except OSError as error:
        if error.errno in _NOT_HERE:
            return False
        raise
    return True


def _copied(src: IO[bytes], out: IO[bytes]) -> None:
    """The bytes copied by the kernel (no trip through this process), or read and written."""
    size = os.fstat(src.fileno()).st_size
    done = 0
    in_kernel = getattr(os, "copy_file_range", None)  # Linux's; elsewhere through memory
    try:
        while in_kernel is not None and done < size:
            step = in_kernel(src.fileno(), out.fileno(), size - done)
            if step == 0:  # the source shrank meanwhile: what is left is copied below
                break
            done += step
    except OSError as error:
        if error.errno not in _NOT_HERE or done:
            raise
    src.seek(done)
    out.seek(done)
    shutil.copyfileobj(src, out)


def _sync_directory(directory: Path) -> None:
    """The rename itself on disk: the directory's entry flushed."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
