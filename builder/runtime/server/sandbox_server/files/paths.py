"""Workspace paths resolved through directory descriptors, never by name after a check.

The workspace is opened once, each component is opened with ``O_NOFOLLOW | O_DIRECTORY``
relative to its parent's descriptor, symlinks met on the way are read and resolved by the server
itself (never above the workspace root), and the final operation (open, stat, scandir, unlink,
rmdir, mkdir, the upload's rename) is done relative to the parent's descriptor without following
symlinks. A command that swaps a directory for a symlink mid-request makes the request fail or
act on the symlink itself; it never leads outside. ``/execute``'s cwd is entered with ``fchdir``
on such a descriptor in the child before exec. (A command can still *move* a directory the
server holds open out of the workspace, on the same filesystem; the server then acts in that
directory, which the command could already write itself: no privilege is gained.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field

from ..errors import ApiError, check_os_string, os_error

MAX_SYMLINKS = 40
REMOVE_RETRIES = 20  # times a directory may be found written to again while it is deleted
DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def read_link(name: str, dir_fd: int) -> str | None:
    """The target of ``name`` in ``dir_fd`` if it is a symlink, else None (it is not one)."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
            return None
        raise


@dataclass
class Resolved:
    """A path reached through descriptors: ``name`` (``"."``: the directory itself) inside the
    open directory ``parent``; ``relative`` is the path from the root, as told to clients."""

    parent: int
    name: str
    relative: str

    def close(self) -> None:
        close_quietly(self.parent)

    def __enter__(self) -> Resolved:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass
class Walk:
    """A resolution under way: the open directory reached (``fd``, -1 while none is), the
    names from the root to it, and how many symlinks were followed on the way."""

    fd: int
    done: list[str] = field(default_factory=list)
    links: int = 0


class Workspace:
    """Maps client paths onto the workspace and resolves them through directory descriptors.

    The root is opened once; every later lookup starts from that descriptor and walks one
    component at a time with ``O_NOFOLLOW``, so a name swapped for a symlink mid-request is seen
    as a symlink (and resolved by the rules here, never above the root) or fails."""

    def __init__(self, root: str) -> None:
        self.given = os.path.abspath(root)
        self.root = os.path.realpath(root)
        self.root_fd = os.open(self.root, DIR_PATH)

    def lexical(self, raw: str) -> str:
        """Absolute, normalised path under the root; symlinks not followed yet."""
        if "\x00" in raw or "\\" in raw or any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
            raise ApiError(403, "path contains a forbidden character")
        check_os_string(raw, "path")
        if ".." in raw.split("/"):
            raise ApiError(403, "path may not contain '..'")
        if not raw.startswith("/"):
            return os.path.normpath(os.path.join(self.root, raw))
        norm = os.path.normpath(raw)
        for base in (self.given, self.root):
            if norm == base or norm.startswith(base.rstrip("/") + "/"):
                return os.path.normpath(os.path.join(self.root, os.path.relpath(norm, base)))
        raise ApiError(403, "absolute path outside the workspace")

    def parts(self, raw: str) -> list[str]:
        """The components of a client path below the root ([] for the root itself)."""
        relative = os.path.relpath(self.lexical(raw), self.root)
        return [] if relative == "." else relative.split("/")

    def _link_parts(self, target: str) -> tuple[bool, list[str]]:
        """(restart at the root?, components) of a symlink's target; 403 if it is absolute
        and outside the workspace."""
        if not target.startswith("/"):
            return False, target.split("/")
        norm = os.path.normpath(target)
        for base in (self.root, self.given):
            if norm == base or norm.startswith(base.rstrip("/") + "/"):
                rest = os.path.relpath(norm, base)
                return True, [] if rest == "." else rest.split("/")
        raise ApiError(403, "path resolves outside the workspace")

    def open_dir(self, names: list[str]) -> int:
        """A new O_PATH descriptor for root/names, walked without following any symlink."""
        fd = os.open(".", DIR_PATH, dir_fd=self.root_fd)
        try:
            for name in names:
                child = os.open(name, DIR_PATH, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            close_quietly(fd)
            raise
        return fd

    def resolve(self, raw: str, *, follow: bool = True, create: bool = False) -> Resolved:
        """Resolve a client path to (open parent directory, final name).

        Symlinks in the middle are always resolved (by this code, relative to the descriptor
        they were found in, never above the root: 403); the last one only if ``follow``.
        ``create`` makes missing directories on the way (for uploads). Raises ApiError for
        paths that leave the workspace and OSError for what the filesystem says."""
        pending = self.parts(raw)[::-1]
        walk = Walk(self.open_dir([]))
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":  # only ever from a symlink's target
                    self._up(walk)
                    continue
                if all(part in ("", ".") for part in pending):  # the last component
                    target = read_link(name, walk.fd) if follow else None
                    if target is None:
                        return Resolved(walk.fd, name, "/".join([*walk.done, name]))
                elif (target := self._enter(walk, name, create)) is None:
                    continue
                pending.extend(reversed(self._follow(walk, target)))
            return Resolved(walk.fd, ".", "/".join(walk.done) or ".")
        except BaseException:
            if walk.fd >= 0:
                close_quietly(walk.fd)
            raise

    def _reopen(self, walk: Walk, names: list[str]) -> None:
        """Move ``walk`` to root/names: its descriptor closed first (-1 until the new one is
        open, so that a failure closes nothing twice)."""
        os.close(walk.fd)
        walk.fd = -1
        walk.fd = self.open_dir(names)
        walk.done = names

    def _up(self, walk: Walk) -> None:
        """A ``..`` of a symlink's target: one directory up, never above the root (403)."""
        if not walk.done:
            raise ApiError(403, "path resolves outside the workspace")
        self._reopen(walk, walk.done[:-1])

    def _enter(self, walk: Walk, name: str, create: bool) -> str | None:
        """Step into the directory ``name`` (None), or, if it is a symlink, its target."""
        child, target = self._step(walk.fd, name, create)
        if child is not None:
            os.close(walk.fd)
            walk.fd = child
            walk.done.append(name)
        return target

    def _follow(self, walk: Walk, target: str) -> list[str]:
        """The components a symlink's ``target`` puts ahead on the path; an absolute target
        restarts ``walk`` at the root. ELOOP past ``MAX_SYMLINKS`` (or for an empty target)."""
        walk.links += 1
        if walk.links > MAX_SYMLINKS or not target:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        restart, names = self._link_parts(target)
        if restart:
            self._reopen(walk, [])
        return names

    @staticmethod
    def _step(fd: int, name: str, create: bool) -> tuple[int | None, str | None]:
        """Open the directory ``name`` in ``fd`` (making it if ``create``): (its descriptor,
        None), or (None, its target) if it is a symlink."""
        try:
            return os.open(name, DIR_PATH, dir_fd=fd), None
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=fd)
            return Workspace._step(fd, name, False)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            target = read_link(name, fd)
            if target is None:
                raise
            return None, target

    def lookup(self, raw: str, *, follow: bool = True, create: bool = False) -> Resolved:
        """:meth:`resolve` with filesystem errors turned into HTTP errors."""
        try:
            return self.resolve(raw, follow=follow, create=create)
        except OSError as exc:
            raise os_error(exc) from None

    def open_cwd(self, raw: str) -> int:
        """An O_PATH descriptor of the directory a command should start in."""
        with self.lookup(raw) as found:
            try:
                info = os.stat(found.name, dir_fd=found.parent, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    raise ApiError(400, "cwd is not a directory")
                return os.open(found.name, DIR_PATH, dir_fd=found.parent)
            except FileNotFoundError:
                raise ApiError(404, "cwd does not exist") from None
            except OSError as exc:
                raise os_error(exc) from None


def remove_tree(parent: int, name: str) -> None:
    """Delete the directory ``name`` in ``parent`` and everything below it, walking by
    descriptors: entries are unlinked relative to their directory's descriptor (a symlink is
    removed itself, never followed) and subdirectories are opened with O_NOFOLLOW. Iterative,
    so depth is no problem; a directory that keeps being written to is a 409."""
    frames: list[tuple[int, str, int]] = []  # (parent fd, name, own fd)
    frames.append((parent, name, os.open(name, DIR_READ, dir_fd=parent)))
    retries = 0
    try:
        while frames:
            up, here, fd = frames[-1]
            if (below := unlink_entries(fd)) is not None:
                frames.append(below)
                continue
            if not remove_empty(up, here):
                retries += 1
                if retries > REMOVE_RETRIES:
                    raise ApiError(409, "directory changed while it was deleted; try again")
                continue
            os.close(fd)
            frames.pop()
    finally:
        for _, _, fd in frames:
            close_quietly(fd)


def unlink_entries(fd: int) -> tuple[int, str, int] | None:
    """Unlink every entry of the open directory ``fd`` up to its first subdirectory, and
    return that one opened, as a frame to descend into (None: no subdirectory was left)."""
    for entry in os.listdir(fd):
        try:
            os.unlink(entry, dir_fd=fd)
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            if (below := open_below(fd, entry)) is not None:
                return fd, entry, below
    return None


def open_below(fd: int, entry: str) -> int | None:
    """The subdirectory ``entry`` of ``fd``, opened without following a symlink; None if it
    vanished or was swapped for a non-directory meanwhile."""
    try:
        return os.open(entry, DIR_READ, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return None
        raise


def remove_empty(parent: int, name: str) -> bool:
    """Remove the directory ``name`` of ``parent``, emptied (True, also when it is gone
    already); False when it is not empty, written to since it was emptied."""
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY:
            return False
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise
    return True
