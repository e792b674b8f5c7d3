"""Sandbox runtime server: the HTTP contract every sandbox image serves (port 8888).

Standard library only and one self-contained file, because images start it as
``python3 -I /opt/sandbox/server.py``: isolated mode keeps /app/deps and /app/deps-extra (on
PYTHONPATH) from shadowing the server's own modules, while the commands it runs still inherit
PYTHONPATH from its environment.

Routes: ``GET /`` health, ``POST /execute``, ``POST /upload`` (multipart, field ``file`` whose
filename is the destination), ``GET /download/{path}``, ``GET /list/{path}``,
``GET /exists/{path}``, ``DELETE /files/{path}``. Paths are percent-decoded exactly once and must
stay inside the workspace, symlinks included.

Hardening (the commands run as the same user as the server and may race it):

* Paths are resolved through directory descriptors, never by name after a check: the workspace
  is opened once, each component is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to its
  parent's descriptor, symlinks met on the way are read and resolved by the server itself (never
  above the workspace root), and the final operation (open, stat, scandir, unlink, rmdir, mkdir,
  the upload's rename) is done relative to the parent's descriptor without following symlinks.
  A command that swaps a directory for a symlink mid-request makes the request fail or act on
  the symlink itself; it never leads outside. ``/execute``'s cwd is entered with ``fchdir`` on
  such a descriptor in the child before exec. (A command can still *move* a directory the
  server holds open out of the workspace, on the same filesystem; the server then acts in that
  directory, which the command could already write itself: no privilege is gained.)
* Process supervision (:class:`Supervisor`): the server is a child subreaper, so every orphan of
  a command is re-parented to it, not to init. Each execution carries a unique
  ``SANDBOX_EXEC_ID`` in its environment. When the command's main process exits or times out,
  every process below it, every orphan carrying its marker and every orphan carrying no marker
  of a running execution (one that cleared its environment) is killed, in rounds, until none is
  left; ``setsid``, double forks and new sessions do not escape. What can still escape: nothing
  that stays a descendant of the server. A process that clears its environment while another
  command is running is treated as an orphan of whichever execution finishes first (killed
  early, never missed). Without the subreaper (a kernel without PR_SET_CHILD_SUBREAPER, and the
  server not PID 1) orphans go to init and only the environment marker finds them, so a process
  that both clears its environment and double-forks escapes in that case only.
* Memory: command output is spooled to unnamed temporary files (``--spool-dir``, default
  ``$TMPDIR`` or /tmp, never the workspace; a memfd when no directory is writable), each stream
  capped at ``--max-output`` raw bytes, and the JSON reply is encoded and streamed in chunks,
  each stream capped at half of ``--max-reply`` encoded bytes (``"truncated"`` says which were
  cut). At most ``--max-executes`` commands run at once, ``--max-queued`` more wait; beyond
  that: 429 with ``Retry-After``.
* Requests: at most ``--max-connections`` connections are served at once (beyond: 503), headers
  must arrive within ``--header-timeout`` seconds and a body within ``--body-timeout``; every
  malformed request is answered with a 4xx JSON error. Uploads may come as a chunked body (the
  upstream SDK streams file objects so), bounded by ``--max-upload`` and the body deadline too.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import ctypes
import errno
import functools
import io
import json
import math
import os
import re
import resource
import secrets
import selectors
import shlex
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any
from urllib.parse import quote, unquote_to_bytes

MIB = 1024 * 1024
TIMEOUT_EXIT_CODE = 124
NOT_EXECUTABLE_EXIT_CODE = 126
NOT_FOUND_EXIT_CODE = 127
MAX_JSON_BODY = 16 * MIB
DRAIN_LIMIT = 1 * MIB
CHUNK = 256 * 1024
ENCODE_CHUNK = 64 * 1024
LINGER_SECONDS = 2.0
PIPE_LINGER_SECONDS = 0.5
POLL_SECONDS = 0.02
REAP_SECONDS = 1.0
QUEUE_WAIT_SECONDS = 30.0
MAX_SYMLINKS = 40
MARKER_VAR = "SANDBOX_EXEC_ID"
PR_SET_CHILD_SUBREAPER = 36
NOTE_RESERVE = 1024  # encoded bytes kept back in each stream's budget for the server's notes
FILE_ROUTE = re.compile(r"/(download|list|exists|files)(?:/(.*))?", re.DOTALL)
DISPOSITION_PARAM = re.compile(r';\s*([^\s=;]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;]*))', re.DOTALL)
ASCII_DIGITS = re.compile(r"[0-9]+")
CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")
BODY_LINE = 4096  # longest chunk-size or trailer line of a chunked body
MAX_TRAILERS = 64
UNTIL_LAST_CHUNK = sys.maxsize  # body bytes left of a chunked body: unknown until its end
DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Config:
    """Limits and defaults, fixed at start-up."""

    workspace: str
    max_upload: int
    max_output: int
    default_timeout: float
    max_timeout: float
    file_mode: int
    max_reply: int = 32 * MIB
    max_executes: int = 32
    max_queued: int = 64
    max_connections: int = 256
    header_timeout: float = 30.0
    body_timeout: float = 600.0
    spool_dir: str | None = None


class ApiError(Exception):
    """A client-visible failure: becomes a JSON ``{"error": ...}`` response, never a traceback."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def os_error(exc: OSError) -> ApiError:
    """Turn a filesystem error caused by the client's path into the matching HTTP status."""
    code = exc.errno
    if code in (errno.ENOENT, errno.ENOTDIR):
        return ApiError(404, "no such file or directory")
    if code in (errno.EACCES, errno.EPERM, errno.ELOOP, errno.EROFS, errno.EXDEV):
        return ApiError(403, os.strerror(code))
    if code in (errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ, errno.EISDIR, errno.EEXIST):
        return ApiError(400, os.strerror(code))
    if code == errno.ENOTEMPTY:
        return ApiError(409, os.strerror(code))
    if code in (errno.ENOSPC, errno.EDQUOT):
        return ApiError(507, os.strerror(code))
    if code in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return ApiError(503, os.strerror(code), {"Retry-After": "1"})
    raise exc


def parse_length(value: str) -> int:
    """A Content-Length: ASCII digits only (``str.isdigit`` also takes '²'), at most 18 of them
    (``int`` refuses over 4,300), else a 400 / 413 rather than a crash."""
    value = value.strip()
    if not ASCII_DIGITS.fullmatch(value):
        raise ApiError(400, "invalid Content-Length")
    if len(value.lstrip("0")) > 18:
        raise ApiError(413, "Content-Length too large")
    return int(value.lstrip("0") or "0")  # int() counts leading zeros against its limit


def check_os_string(value: str, what: str) -> None:
    """Reject strings the OS cannot take (NUL, lone surrogates) as a 400 instead of a crash."""
    if "\x00" in value:
        raise ApiError(400, f"{what} contains a NUL byte")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise ApiError(400, f"{what} is not valid UTF-8") from None


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
        done: list[str] = []
        links = 0
        fd = self.open_dir([])
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":  # only ever from a symlink's target
                    if not done:
                        raise ApiError(403, "path resolves outside the workspace")
                    done.pop()
                    os.close(fd)
                    fd = -1
                    fd = self.open_dir(done)
                    continue
                last = not any(part not in ("", ".") for part in pending)
                target: str | None = None
                if last:
                    if follow:
                        target = read_link(name, fd)
                    if target is None:
                        return Resolved(fd, name, "/".join([*done, name]))
                else:
                    child, target = self._step(fd, name, create)
                    if child is not None:
                        os.close(fd)
                        fd = child
                        done.append(name)
                        continue
                assert target is not None
                links += 1
                if links > MAX_SYMLINKS or not target:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                restart, names = self._link_parts(target)
                if restart:
                    os.close(fd)
                    fd = -1
                    fd = self.open_dir([])
                    done = []
                pending.extend(reversed(names))
            return Resolved(fd, ".", "/".join(done) or ".")
        except BaseException:
            if fd >= 0:
                close_quietly(fd)
            raise

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
            descended = False
            for entry in os.listdir(fd):
                try:
                    os.unlink(entry, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except IsADirectoryError:
                    try:
                        frames.append((fd, entry, os.open(entry, DIR_READ, dir_fd=fd)))
                    except OSError as exc:  # vanished, or swapped for a non-directory
                        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                            continue
                        raise
                    descended = True
                    break
            if descended:
                continue
            try:
                os.rmdir(here, dir_fd=up)
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY:
                    retries += 1
                    if retries > 20:
                        message = "directory changed while it was deleted; try again"
                        raise ApiError(409, message) from None
                    continue
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    raise
            os.close(fd)
            frames.pop()
    finally:
        for _, _, fd in frames:
            close_quietly(fd)


class SpoolFactory:
    """Unnamed temporary files for command output, outside the workspace: O_TMPFILE files in
    the first writable directory of ``--spool-dir``, $TMPDIR, /tmp, /var/tmp; a memfd when
    none is (a read-only root filesystem)."""

    def __init__(self, configured: str | None, workspace: str) -> None:
        self.directory: str | None = None
        candidates = [configured] if configured else [os.environ.get("TMPDIR"), "/tmp", "/var/tmp"]
        for candidate in candidates:
            if not candidate:
                continue
            real = os.path.realpath(candidate)
            if os.path.commonpath([real, workspace]) == workspace:
                continue  # never spool where commands (and clients) can see or fill it
            try:
                os.close(os.open(real, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600))
            except OSError:
                continue
            self.directory = real
            break

    @property
    def kind(self) -> str:
        return self.directory or "memfd"

    def new(self) -> IO[bytes]:
        if self.directory is not None:
            with contextlib.suppress(OSError):
                fd = os.open(self.directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
                return open(fd, "w+b")
        return open(os.memfd_create("sandbox-spool", os.MFD_CLOEXEC), "w+b")


class Capture:
    """Keeps the first ``limit`` bytes of a stream in a spool file and counts the rest."""

    def __init__(self, limit: int, spool: IO[bytes]) -> None:
        self.limit = limit
        self.spool = spool
        self.size = 0
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = max(self.limit - self.size, 0)
        if room:
            self.spool.write(chunk[:room])
            self.size += min(room, len(chunk))
        self.dropped += max(len(chunk) - room, 0)


def json_text(text: str) -> bytes:
    """``text`` as the inside of a JSON string (no quotes), UTF-8."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


class EncodedStream:
    """A spooled stream as the body of a JSON string, in chunks, at most ``budget`` bytes.

    Bytes are decoded as UTF-8 (invalid ones become U+FFFD) and escaped chunk by chunk, so no
    copy of the whole output is ever built. Encoding is deterministic: the reply is encoded once
    to learn its length and cut, then again to send it."""

    def __init__(self, spool: IO[bytes], budget: int) -> None:
        self.spool = spool
        self.budget = budget
        self.cut = False
        self.last = ""

    def chunks(self) -> Iterator[bytes]:
        self.spool.flush()
        self.spool.seek(0)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        used, self.cut, self.last = 0, False, ""
        while True:
            raw = self.spool.read(ENCODE_CHUNK)
            text = decoder.decode(raw, final=not raw)
            if text:
                piece = json_text(text)
                if used + len(piece) > self.budget:
                    room, keep = self.budget - used, len(text)
                    while keep > 0:
                        keep = min(keep - 1, keep * room // len(piece))
                        piece = json_text(text[:keep])
                        if len(piece) <= room:
                            break
                    if keep > 0:
                        self.last = text[keep - 1]
                        yield piece
                    self.cut = True
                    return
                used += len(piece)
                self.last = text[-1]
                yield piece
            if not raw:
                return


@dataclass
class Outcome:
    """What a command left: spooled output, exit status, and why it ended."""

    out: Capture
    err: Capture
    exit_code: int
    timed_out: bool
    timeout: float
    budget: int
    killed: int = 0
    message: str = ""  # stderr for commands that never started

    def close(self) -> None:
        self.out.spool.close()
        self.err.spool.close()

    def _pieces(self) -> Iterator[bytes]:
        stdout = EncodedStream(self.out.spool, self.budget)
        stderr = EncodedStream(self.err.spool, self.budget)
        yield b'{"stdout": "'
        yield from stdout.chunks()
        yield b'", "stderr": "'
        yield json_text(self.message)
        yield from stderr.chunks()
        last = stderr.last or self.message[-1:]
        notes = []
        for name, capture, encoded in (("stdout", self.out, stdout), ("stderr", self.err, stderr)):
            if capture.dropped:
                notes.append(f"{name} truncated: {capture.dropped} bytes dropped")
            if encoded.cut:
                notes.append(f"{name} truncated: reply limit of {self.budget} bytes reached")
        if self.timed_out:
            notes.append(f"timed out after {self.timeout:g}s; its processes were killed")
        for note in notes:
            separator = "\n" if last and last != "\n" else ""
            yield json_text(f"{separator}[sandbox] {note}\n")
            last = "\n"
        truncated = {
            "stdout": stdout.cut or self.out.dropped > 0,
            "stderr": stderr.cut or self.err.dropped > 0,
        }
        tail = {"exit_code": self.exit_code, "timed_out": self.timed_out, "truncated": truncated}
        yield b'", ' + json.dumps(tail).encode()[1:]

    def reply(self) -> tuple[int, Iterator[bytes]]:
        """(length, chunks) of the JSON reply, encoded without holding it in memory."""
        return sum(len(piece) for piece in self._pieces()), self._pieces()


def parse_command(command: Any) -> list[str]:
    """A string is split like a POSIX shell would split words (no expansion); a list is argv."""
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ApiError(400, f"command cannot be split: {exc}") from None
    elif isinstance(command, list) and all(isinstance(arg, str) for arg in command):
        argv = list(command)
    else:
        raise ApiError(400, "command must be a string or a list of strings")
    if not argv:
        raise ApiError(400, "command is empty")
    for arg in argv:
        check_os_string(arg, "command")
    return argv


def parse_timeout(value: Any, config: Config) -> float:
    """Positive finite seconds, capped so that no request can hold a worker forever."""
    if value is None:
        return config.default_timeout
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, "timeout_seconds must be a number")
    if (isinstance(value, float) and not math.isfinite(value)) or value <= 0:
        raise ApiError(400, "timeout_seconds must be a positive finite number")
    return float(min(value, config.max_timeout))  # exact int/float comparison: no overflow


def parse_env(value: Any) -> dict[str, str]:
    """Extra environment variables; merged over the server's own (which carries PYTHONPATH)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, "env must be an object of strings")
    for key, item in value.items():
        if not isinstance(item, str) or not key or "=" in key:
            raise ApiError(400, f"env entry {key!r} must map a valid name to a string")
        check_os_string(key, "env name")
        check_os_string(item, "env value")
    return value


def disposition_params(value: str) -> dict[str, str]:
    """Parameters of a Content-Disposition/Content-Type header (quoted or RFC 5987 ``*=``).

    Quoted values are taken literally, as browsers and urllib3 2 send them; a backslash stays a
    backslash, so a path that contains one is refused rather than silently rewritten."""
    params: dict[str, str] = {}
    for match in DISPOSITION_PARAM.finditer(value):
        name, quoted, bare = match.group(1).lower(), match.group(2), match.group(3)
        text = quoted if quoted is not None else bare.strip()
        if name.endswith("*"):
            charset, _, encoded = text.partition("'")
            _, _, encoded = encoded.partition("'")
            try:
                text = unquote_to_bytes(encoded).decode(charset or "utf-8")
            except (LookupError, ValueError):  # UnicodeError from odd codecs included
                raise ApiError(400, f"cannot decode header parameter {name}") from None
            name = name[:-1]
            params[name] = text
        else:
            params.setdefault(name, text)
    return params


class Multipart:
    """Streaming multipart/form-data reader, so uploads go to disk without being held in memory."""

    def __init__(self, read: Callable[[int], bytes], boundary: bytes) -> None:
        self._read = read
        self._delimiter = b"\r\n--" + boundary
        self._buf = bytearray(b"\r\n")  # lets the first delimiter match like every later one

    def _fill(self) -> None:
        chunk = self._read(CHUNK)
        if not chunk:
            raise ApiError(400, "multipart body ends before its closing boundary")
        self._buf += chunk

    def copy_part(self, sink: Callable[[bytes], None] | None) -> None:
        """Pass the bytes up to the next delimiter to ``sink`` (or drop them) and consume it."""
        keep = len(self._delimiter) - 1
        while (index := self._buf.find(self._delimiter)) < 0:
            if len(self._buf) > keep:
                if sink is not None:
                    sink(bytes(self._buf[:-keep]))
                del self._buf[:-keep]
            self._fill()
        if sink is not None and index:
            sink(bytes(self._buf[:index]))
        del self._buf[: index + len(self._delimiter)]

    def _line(self) -> bytes:
        while (index := self._buf.find(b"\r\n")) < 0:
            if len(self._buf) > 16384:
                raise ApiError(400, "multipart header line too long")
            self._fill()
        line = bytes(self._buf[:index])
        del self._buf[: index + 2]
        return line

    def next_part(self) -> bool:
        """After a delimiter: True if a part follows, False at the closing ``--``."""
        while len(self._buf) < 2:
            self._fill()
        if self._buf[:2] == b"--":
            return False
        if self._line().strip(b" \t"):
            raise ApiError(400, "malformed multipart delimiter")
        return True

    def headers(self) -> dict[str, str]:
        """Headers of the current part, lower-cased names."""
        found: dict[str, str] = {}
        for _ in range(64):
            line = self._line()
            if not line:
                return found
            name, sep, value = line.partition(b":")
            if not sep:
                raise ApiError(400, "malformed multipart header")
            try:
                found[name.strip().lower().decode("ascii")] = value.strip().decode("utf-8")
            except UnicodeDecodeError:
                raise ApiError(400, "multipart header is not valid UTF-8") from None
        raise ApiError(400, "too many multipart headers")


def set_child_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER): orphans below the server are re-parented to it rather
    than to init. Needs no capability; False where the kernel or libc lacks it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process visible in /proc."""
    table: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            table[int(name)] = (int(fields[1]), fields[0].decode())
        except (OSError, IndexError, ValueError):
            continue
    return table


def children_of(table: dict[int, tuple[int, str]], parent: int) -> list[int]:
    return [pid for pid, (ppid, _) in table.items() if ppid == parent]


def live_subtrees(table: dict[int, tuple[int, str]], roots: list[int], spare: int) -> set[int]:
    """``roots`` and every process below them, zombies and ``spare`` (the server) left out."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in found or pid == spare:
            continue
        found.add(pid)
        stack.extend(children.get(pid, []))
    return {pid for pid in found if table[pid][1] != "Z"}


def marker_of(pid: int) -> str | None:
    """The execution marker in a process's environment (None: none, or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:
        return None
    prefix = MARKER_VAR.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("ascii", "replace")
    return None


class Supervisor:
    """Starts commands and makes sure none of their processes outlive them.

    The server is a child subreaper (and, in a container, PID 1), so every process a command
    starts stays a descendant of the server, whatever it does with sessions and groups: while
    its parent lives it hangs below the command, and once orphaned it hangs directly below the
    server. Each execution's processes carry ``SANDBOX_EXEC_ID=<random>`` in their environment.
    :meth:`sweep` kills, in rounds until a round finds nothing: the command's leader and all its
    descendants, and every orphan below the server (with its descendants) that carries the
    execution's marker or no marker of a running execution."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.subreaper = set_child_subreaper()
        self._lock = threading.Lock()
        self._leaders: dict[int, str] = {}  # running commands' main pids -> marker

    def spawn(
        self, argv: list[str], env: dict[str, str], cwd_fd: int
    ) -> tuple[subprocess.Popen[bytes], str]:
        """Start ``argv`` in its own session, in the directory ``cwd_fd`` (fchdir in the child,
        so the directory is the one resolved, whatever its name points at by then)."""
        marker = secrets.token_hex(16)
        with self._lock:  # registered before any sweep or reap can see the new child
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env | {MARKER_VAR: marker},
                start_new_session=True,
                preexec_fn=functools.partial(os.fchdir, cwd_fd),
            )
            self._leaders[proc.pid] = marker
        return proc, marker

    def release(self, proc: subprocess.Popen[bytes]) -> None:
        """Reap the command's main process and forget it."""
        proc.wait()
        with self._lock:
            self._leaders.pop(proc.pid, None)

    def _victims(self, table: dict[int, tuple[int, str]], leader: int, marker: str) -> set[int]:
        roots = [leader] if leader in table else []
        running = set(self._leaders.values())
        for pid in children_of(table, self.pid):
            if pid in self._leaders:
                continue
            found = marker_of(pid)
            if found == marker or found not in running:
                roots.append(pid)
        if not self.subreaper and self.pid != 1:  # orphans went to init: the marker only
            roots += [pid for pid in table if pid != self.pid and marker_of(pid) == marker]
        return live_subtrees(table, roots, self.pid)

    def sweep(self, proc: subprocess.Popen[bytes], marker: str) -> int:
        """Kill every process of one execution (its leader included); the number killed."""
        killed = 0
        for attempt in range(500):
            with self._lock:  # no command can be spawned between the scan and the kill
                victims = self._victims(process_table(), proc.pid, marker)
                for pid in victims:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            if not victims:
                break
            killed += len(victims - {proc.pid})
            self.reap_orphans()
            time.sleep(min(0.001 * attempt, 0.02))
        return killed

    def kill_everything(self) -> None:
        """Server shutdown: kill every descendant."""
        for _ in range(200):
            with self._lock:
                table = process_table()
                alive = live_subtrees(table, children_of(table, self.pid), self.pid)
                for pid in alive:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            self.reap_orphans()
            if not alive:
                return
            time.sleep(0.01)

    def reap_orphans(self) -> None:
        """Reap the zombies of orphans re-parented to the server (as subreaper or PID 1), never
        a command's main process, whose Popen reaps it."""
        with self._lock:
            owned = set(self._leaders)
            for pid, (ppid, state) in process_table().items():
                if state == "Z" and ppid == self.pid and pid not in owned:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)


def open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits; None where the kernel lacks it."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def has_exited(pid: int) -> bool:
    """True once the child has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


class Slots:
    """Bounds concurrent executes: ``size`` run, ``queue`` more wait; others get a 429."""

    def __init__(self, size: int, queue: int) -> None:
        self._free = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._waiting = 0
        self.queue = queue

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        busy = ApiError(429, "too many commands running; retry later", {"Retry-After": "1"})
        if not self._free.acquire(blocking=False):
            with self._lock:
                if self._waiting >= self.queue:
                    raise busy
                self._waiting += 1
            try:
                acquired = self._free.acquire(timeout=QUEUE_WAIT_SECONDS)
            finally:
                with self._lock:
                    self._waiting -= 1
            if not acquired:
                raise busy
        try:
            yield
        finally:
            self._free.release()


class DeadlineReader(io.RawIOBase):
    """The socket as a raw stream whose reads also stop at a per-request deadline, so a client
    that trickles bytes cannot hold a connection (and its thread) for ever."""

    def __init__(self, sock: socket.socket, idle: float) -> None:
        super().__init__()
        self.sock = sock
        self.idle = idle
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        timeout = self.idle
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request deadline passed")
            timeout = min(timeout, left)
        self.sock.settimeout(timeout)
        return self.sock.recv_into(buffer)


class SandboxServer(ThreadingHTTPServer):
    """Threaded server, bounded in connections and concurrent commands."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], config: Config) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.config = config
        self.workspace = Workspace(config.workspace)
        self.supervisor = Supervisor()
        self.spools = SpoolFactory(config.spool_dir, self.workspace.root)
        self.slots = Slots(config.max_executes, config.max_queued)
        self._connections = threading.BoundedSemaphore(config.max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, at most ``max_connections``; beyond: an immediate 503."""
        if not self._connections.acquire(blocking=False):
            body = b'{"error": "too many connections; retry later"}'
            head = (
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
            )
            with contextlib.suppress(OSError):
                request.settimeout(0.5)
                request.sendall(head.encode() + body)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()

    def run(self, argv: list[str], cwd_fd: int, env: dict[str, str], timeout: float) -> Outcome:
        """Run argv without a shell in ``cwd_fd``; when it exits or times out, every process it
        started is killed (see :class:`Supervisor`)."""
        budget = max(self.config.max_reply // 2 - NOTE_RESERVE, 0)
        out = Capture(self.config.max_output, self.spools.new())
        err = Capture(self.config.max_output, self.spools.new())
        try:
            proc, marker = self.supervisor.spawn(argv, env, cwd_fd)
        except FileNotFoundError:
            message = f"{argv[0]}: command not found\n"
            return Outcome(out, err, NOT_FOUND_EXIT_CODE, False, timeout, budget, message=message)
        except (OSError, subprocess.SubprocessError) as exc:
            message = f"{argv[0]}: cannot execute: {getattr(exc, 'strerror', None) or exc}\n"
            return Outcome(
                out, err, NOT_EXECUTABLE_EXIT_CODE, False, timeout, budget, message=message
            )
        killed = 0
        try:
            timed_out = self._collect(proc, marker, out, err, timeout)
        finally:
            killed = self.supervisor.sweep(proc, marker)
            self.supervisor.release(proc)
        if timed_out:
            code = TIMEOUT_EXIT_CODE
        else:
            code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return Outcome(out, err, code, timed_out, timeout, budget, killed=killed)

    def _collect(
        self,
        proc: subprocess.Popen[bytes],
        marker: str,
        out: Capture,
        err: Capture,
        timeout: float,
    ) -> bool:
        """Spool both pipes until the main process exits or the deadline passes (True: timed
        out); then kill everything the command started and drain what is left, briefly."""
        assert proc.stdout is not None and proc.stderr is not None
        captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        pidfd = open_pidfd(proc.pid)
        deadline = time.monotonic() + timeout
        linger_until: float | None = None
        timed_out = False
        with selectors.DefaultSelector() as selector:
            for fd in captures:
                selector.register(fd, selectors.EVENT_READ)
            if pidfd is not None:
                selector.register(pidfd, selectors.EVENT_READ)
            try:
                while True:
                    now = time.monotonic()
                    if linger_until is None and (has_exited(proc.pid) or now >= deadline):
                        timed_out = not has_exited(proc.pid)
                        # Every holder of the pipes dies here, so they reach EOF at once.
                        self.supervisor.sweep(proc, marker)
                        now = time.monotonic()
                        linger_until = now + PIPE_LINGER_SECONDS
                        if pidfd is not None:
                            selector.unregister(pidfd)
                    open_pipes = [fd for fd in selector.get_map() if fd in captures]
                    if linger_until is not None and (not open_pipes or now >= linger_until):
                        break
                    wait = (linger_until or deadline) - now
                    if linger_until is None and pidfd is None:
                        wait = min(wait, POLL_SECONDS)
                    for key, _ in selector.select(max(wait, 0.0)):
                        if key.fd == pidfd:
                            continue
                        chunk = os.read(key.fd, CHUNK)
                        if chunk:
                            captures[key.fd].feed(chunk)
                        else:
                            selector.unregister(key.fd)
            finally:
                if pidfd is not None:
                    os.close(pidfd)
                proc.stdout.close()
                proc.stderr.close()
        return timed_out

    def reap_orphans(self) -> None:
        self.supervisor.reap_orphans()

    def kill_all(self) -> None:
        """Kill every process the server's commands started (server shutdown)."""
        self.supervisor.kill_everything()


class Handler(BaseHTTPRequestHandler):
    """One request: route, validate, answer JSON; client mistakes never become tracebacks."""

    server: SandboxServer
    protocol_version = "HTTP/1.1"
    server_version = "sandbox-runtime/1"
    timeout = 120  # idle seconds per socket read: a stalled client cannot hold a thread forever
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms stalls

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def __getattr__(self, name: str) -> Callable[[], None]:
        """Any other method (PUT, BREW, ...) is routed too, so it gets 404/405 rather than 501."""
        if name.startswith("do_"):
            return lambda: self._dispatch(name[3:])
        raise AttributeError(name)

    def setup(self) -> None:
        super().setup()
        self._reader = DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader, 65536)

    def handle_one_request(self) -> None:
        """Headers must arrive within ``header_timeout`` of the request's start."""
        self._reader.deadline = time.monotonic() + self.server.config.header_timeout
        super().handle_one_request()

    def parse_request(self) -> bool:
        """Refuse HTTP/0.9 (no status line, no headers): every answer here has a status."""
        try:
            if not super().parse_request():
                return False
        except (OSError, TimeoutError):
            raise
        except Exception:  # the stdlib's header parser decodes e.g. ``boundary*=`` itself
            self.send_error(400, "malformed request headers")
            return False
        if self.request_version == "HTTP/0.9":
            self.send_error(400, "HTTP/0.9 is not supported")
            return False
        return True

    # --- plumbing -------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._body_left = 0
        self._chunked = False
        self._chunk_left = 0
        self._received = 0
        self._started = False
        try:
            self._frame_body()
            handler = self._route(method)
            handler()
        except ApiError as exc:
            self._error(exc)
        except TimeoutError:
            self.close_connection = True
            if not self._started:
                self._error(ApiError(408, "request not received in time"))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:
            sys.stderr.write(f"internal error on {method} {self.path!r}:\n{traceback.format_exc()}")
            self.close_connection = True
            if not self._started:
                self._error(ApiError(500, "internal server error"))

    def _error(self, exc: ApiError) -> None:
        try:
            self._send_json(exc.status, {"error": exc.message}, exc.headers)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True

    def _frame_body(self) -> None:
        """Learn how many body bytes follow: a Content-Length, or a chunked body (what clients
        streaming a file object send), bounded like an upload and by the same deadline.
        Both at once, or another transfer coding, is refused: that is how requests are
        smuggled past proxies."""
        encodings = self.headers.get_all("Transfer-Encoding") or []
        length = self.headers.get("Content-Length")
        if encodings:
            self._body_left = UNTIL_LAST_CHUNK  # unread: closing lingers so the error arrives
            if [e.strip().lower() for e in encodings] != ["chunked"]:
                self.close_connection = True
                raise ApiError(501, "only the chunked transfer coding is supported")
            if length is not None:
                self.close_connection = True
                raise ApiError(400, "both Content-Length and Transfer-Encoding")
            self._chunked = True
        elif length is None:
            return
        else:
            try:
                self._body_left = parse_length(length)
            except ApiError:
                self.close_connection = True
                raise
        self._reader.deadline = time.monotonic() + self.server.config.body_timeout

    def _read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body (fewer at its end), never past Content-Length."""
        if self._chunked:
            return self._read_chunked(size)
        size = min(size, self._body_left)
        if size <= 0:
            return b""
        data = self.rfile.read1(size)
        if not data:
            self.close_connection = True
            raise ApiError(400, "request body ended early")
        self._body_left -= len(data)
        return data

    def _read_chunked(self, size: int) -> bytes:
        """Up to ``size`` bytes of a chunked body (b"" after its last chunk); past
        ``max_upload`` bytes in all: 413."""
        if not self._chunk_left:
            line = self._body_line().split(b";", 1)[0].strip(b" \t")
            if not CHUNK_SIZE.fullmatch(line):
                raise self._malformed("malformed chunk size")
            self._chunk_left = int(line, 16)
            if not self._chunk_left:
                for _ in range(MAX_TRAILERS):
                    if not self._body_line():
                        self._body_left = 0
                        return b""
                raise self._malformed("too many trailer lines")
        data = self.rfile.read1(min(size, self._chunk_left))
        if not data:
            raise self._malformed("request body ended early")
        self._chunk_left -= len(data)
        self._received += len(data)
        limit = self.server.config.max_upload
        if self._received > limit:
            self.close_connection = True
            raise ApiError(413, f"upload larger than {limit} bytes")
        if not self._chunk_left and self._body_line():
            raise self._malformed("chunk longer than its size")
        return data

    def _body_line(self) -> bytes:
        """One CRLF-ended line of a chunked body's framing, without its line end."""
        line = self.rfile.readline(BODY_LINE + 1)
        if not line.endswith(b"\n"):
            raise self._malformed("malformed chunked body")
        return line.rstrip(b"\r\n")

    def _malformed(self, message: str) -> ApiError:
        self.close_connection = True
        return ApiError(400, message)

    def _route(self, method: str) -> Callable[[], None]:
        path = self.path.partition("?")[0]
        routes: dict[str, Callable[[], None]]
        if path == "/":
            routes = {"GET": self._health}
        elif path == "/execute":
            routes = {"POST": self._execute}
        elif path == "/upload":
            routes = {"POST": self._upload}
        elif match := FILE_ROUTE.fullmatch(path):
            kind, raw = match.group(1), self._decode(match.group(2) or "")
            routes = {
                "download": {"GET": lambda: self._download(raw)},
                "list": {"GET": lambda: self._list(raw)},
                "exists": {"GET": lambda: self._exists(raw)},
                "files": {"DELETE": lambda: self._delete(raw)},
            }[kind]
        else:
            raise ApiError(404, "no such route")
        if "GET" in routes:
            routes["HEAD"] = routes["GET"]
        if method not in routes:
            raise ApiError(405, "method not allowed", {"Allow": ", ".join(sorted(routes))})
        return routes[method]

    @staticmethod
    def _decode(raw: str) -> str:
        """Percent-decode a path exactly once (the request line arrives as latin-1 text)."""
        try:
            return unquote_to_bytes(raw.encode("latin-1")).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "path is not valid UTF-8") from None

    def _begin(self, status: int, headers: dict[str, str]) -> None:
        """Status line and headers; any unread body is drained or the connection is closed."""
        if self._body_left:
            if (self._chunked or self._body_left <= DRAIN_LIMIT) and not self.close_connection:
                with contextlib.suppress(ApiError, OSError):
                    drained = 0
                    while self._body_left and drained <= DRAIN_LIMIT:
                        drained += len(self._read(CHUNK))
            if self._body_left:
                self.close_connection = True
        self._started = True
        self.connection.settimeout(self.timeout)  # reads may have left a short deadline
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        fields = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        self._begin(status, fields | (headers or {}))
        if self.command != "HEAD":
            self.wfile.write(body)
        self._linger()

    def _send_stream(self, length: int, chunks: Iterator[bytes]) -> None:
        """A 200 JSON reply whose body is written piece by piece (it may be tens of MiB)."""
        self._begin(200, {"Content-Type": "application/json", "Content-Length": str(length)})
        if self.command == "HEAD":
            return
        pending: list[bytes] = []
        size = 0
        for piece in chunks:
            pending.append(piece)
            size += len(piece)
            if size >= CHUNK:
                self.wfile.write(b"".join(pending))
                pending, size = [], 0
        if pending:
            self.wfile.write(b"".join(pending))

    def _linger(self) -> None:
        """Closing with unread input makes the kernel reset the connection and the client may
        lose the response (e.g. a 413): half-close, then read and drop for a short while."""
        if not self._body_left or not self.close_connection:
            return
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_WR)
        self.connection.settimeout(LINGER_SECONDS)
        end = time.monotonic() + LINGER_SECONDS
        try:
            while time.monotonic() < end and self.connection.recv(CHUNK):
                pass
        except OSError:
            pass

    def handle_expect_100(self) -> bool:
        """Do not invite a body that will be refused (curl sends Expect for big uploads)."""
        try:
            length = parse_length(self.headers.get("Content-Length", "0"))
        except ApiError:
            return True  # no "100 Continue": the handler answers 400 straight away
        too_big = length > self.server.config.max_upload
        if too_big and self.path.partition("?")[0] == "/upload":
            return True  # likewise, 413
        return super().handle_expect_100()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol-level errors from http.server (bad request line, 501, 414) as JSON too."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # unparsable request line: answer in HTTP/1.0
            self.request_version = "HTTP/1.0"
        body = json.dumps({"error": message or HTTPStatus(code).phrase}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_json(self) -> dict[str, Any]:
        if self.headers.get("Content-Length") is None:
            raise ApiError(411, "a JSON body with Content-Length is required")
        if self._body_left > MAX_JSON_BODY:
            raise ApiError(413, f"JSON body larger than {MAX_JSON_BODY} bytes")
        data = bytearray()
        while self._body_left:
            data += self._read(CHUNK)
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):
            raise ApiError(400, "body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "body must be a JSON object")
        return body

    # --- routes ---------------------------------------------------------------------------

    def _health(self) -> None:
        self._send_json(200, {"status": "ok"})

    def _execute(self) -> None:
        request = self._read_json()
        server = self.server
        config, workspace = server.config, server.workspace
        argv = parse_command(request.get("command"))
        timeout = parse_timeout(request.get("timeout_seconds"), config)
        env = os.environ | parse_env(request.get("env"))
        env.pop(MARKER_VAR, None)
        cwd_raw = request.get("cwd")
        if cwd_raw is None or cwd_raw == "":
            cwd_raw = ""
        elif not isinstance(cwd_raw, str):
            raise ApiError(400, "cwd must be a string")
        with server.slots.hold():
            cwd_fd = workspace.open_cwd(cwd_raw)
            try:
                outcome = server.run(argv, cwd_fd, env, timeout)
            finally:
                os.close(cwd_fd)
            try:
                self._send_stream(*outcome.reply())
            finally:
                outcome.close()

    def _upload(self) -> None:
        limit = self.server.config.max_upload
        if self._body_left > limit and not self._chunked:
            self.close_connection = True
            raise ApiError(413, f"upload larger than {limit} bytes")
        if self.headers.get("Content-Length") is None and not self._chunked:
            raise ApiError(411, "uploads need a Content-Length or a chunked body")
        content_type = self.headers.get("Content-Type", "")
        boundary = disposition_params(content_type).get("boundary", "")
        media_type = content_type.partition(";")[0].strip().lower()
        if media_type != "multipart/form-data" or not 0 < len(boundary) <= 200:
            raise ApiError(400, "expected multipart/form-data with a boundary")
        try:
            reader = Multipart(self._read, boundary.encode("latin-1"))
        except UnicodeEncodeError:
            raise ApiError(400, "invalid multipart boundary") from None
        reader.copy_part(None)  # preamble
        saved: dict[str, Any] | None = None
        while reader.next_part():
            params = disposition_params(reader.headers().get("content-disposition", ""))
            if saved is None and params.get("name") == "file" and "filename" in params:
                saved = self._store(params["filename"], reader)
            else:
                reader.copy_part(None)
        if saved is None:
            raise ApiError(400, "missing form field 'file' with a filename")
        self._send_json(200, saved)

    def _store(self, filename: str, reader: Multipart) -> dict[str, Any]:
        """Write one part to a temporary file created in the target's (open) directory, then
        rename it into place there: nothing is ever opened by a name that could lead out, and
        a failed upload leaves nothing."""
        workspace = self.server.workspace
        if filename.endswith("/") or not workspace.parts(filename):
            raise ApiError(400, "upload filename must name a file")
        try:
            found = workspace.resolve(filename, create=True)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTDIR):
                raise ApiError(400, "a parent of the path is a file") from None
            raise os_error(exc) from None
        with found:
            parent, name = found.parent, found.name
            if name == ".":
                raise ApiError(400, "upload target is a directory")
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    raise ApiError(400, "upload target is a directory")
            tmp = f".upload-{secrets.token_hex(8)}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(tmp, flags, 0o600, dir_fd=parent)
            except OSError as exc:
                raise os_error(exc) from None
            size = 0
            try:
                with os.fdopen(fd, "wb") as handle:
                    os.fchmod(handle.fileno(), self.server.config.file_mode)

                    def sink(chunk: bytes) -> None:
                        nonlocal size
                        handle.write(chunk)
                        size += len(chunk)

                    reader.copy_part(sink)
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError):
                    raise os_error(exc) from None
                raise
            return {"path": found.relative, "size": size}

    def _download(self, raw: str) -> None:
        with self.server.workspace.lookup(raw) as found:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(found.name, flags, dir_fd=found.parent)
            except OSError as exc:
                raise os_error(exc) from None
            name = os.path.basename(found.relative)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            kind = "is a directory; use /list" if stat.S_ISDIR(info.st_mode) else "not a file"
            raise ApiError(400, kind)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as handle:
            self._begin(
                200,
                {
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(info.st_size),
                    "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name, safe='')}",
                },
            )
            if self.command == "HEAD":
                return
            left = info.st_size
            while left:
                chunk = handle.read(min(CHUNK, left))
                if not chunk:  # the file shrank while being sent: the length is now a lie
                    self.close_connection = True
                    return
                self.wfile.write(chunk)
                left -= len(chunk)

    def _list(self, raw: str) -> None:
        entries = []
        with self.server.workspace.lookup(raw) as found:
            try:
                info = os.stat(found.name, dir_fd=found.parent, follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):  # it was swapped in after the lookup
                    raise ApiError(403, "path changed while it was resolved")
                if not stat.S_ISDIR(info.st_mode):
                    raise ApiError(400, "not a directory")
                fd = os.open(found.name, DIR_READ, dir_fd=found.parent)
                try:
                    with os.scandir(fd) as listing:
                        for entry in listing:
                            try:
                                info = entry.stat(follow_symlinks=False)
                            except FileNotFoundError:
                                continue
                            kind = "directory" if stat.S_ISDIR(info.st_mode) else "file"
                            entries.append(
                                {
                                    "name": entry.name,
                                    "size": info.st_size,
                                    "type": kind,
                                    "mod_time": info.st_mtime,
                                }
                            )
                finally:
                    os.close(fd)
            except OSError as exc:
                raise os_error(exc) from None
        self._send_json(200, sorted(entries, key=lambda item: item["name"]))

    def _exists(self, raw: str) -> None:
        exists = True
        try:
            with self.server.workspace.resolve(raw) as found:
                os.stat(found.name, dir_fd=found.parent, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise os_error(exc) from None
            exists = False
        self._send_json(200, {"path": raw, "exists": exists})

    def _delete(self, raw: str) -> None:
        """Delete what the path names; a symlink is removed itself, never what it points to."""
        workspace = self.server.workspace
        if not workspace.parts(raw):
            raise ApiError(403, "cannot delete the workspace root or outside it")
        with workspace.lookup(raw, follow=False) as found:
            if found.name == ".":
                raise ApiError(403, "cannot delete the workspace root or outside it")
            try:
                info = os.stat(found.name, dir_fd=found.parent, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    remove_tree(found.parent, found.name)
                else:
                    os.unlink(found.name, dir_fd=found.parent)
            except OSError as exc:
                raise os_error(exc) from None
        self._send_json(200, {"path": raw, "deleted": True})


def reap_forever(server: SandboxServer) -> None:
    """Background loop of the PID-1 orphan reaper."""
    while True:
        time.sleep(REAP_SECONDS)
        server.reap_orphans()


def env_default(name: str, fallback: str) -> str:
    """Flags default to SANDBOX_* environment variables, so images can configure without argv."""
    return os.environ.get(name, fallback)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Sandbox runtime HTTP server.")
    parser.add_argument("--host", default=env_default("SANDBOX_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=env_default("SANDBOX_PORT", "8888"))
    parser.add_argument("--workspace", default=env_default("SANDBOX_WORKSPACE", "/workspace"))
    parser.add_argument(
        "--max-upload",
        type=int,
        default=env_default("SANDBOX_MAX_UPLOAD", str(100 * MIB)),
        help="largest accepted upload body in bytes (larger: 413)",
    )
    parser.add_argument(
        "--max-output",
        type=int,
        default=env_default("SANDBOX_MAX_OUTPUT", str(10 * MIB)),
        help="bytes kept per output stream of a command; the rest is dropped",
    )
    parser.add_argument(
        "--default-timeout",
        type=float,
        default=env_default("SANDBOX_DEFAULT_TIMEOUT", "300"),
        help="seconds a command may run when the request names no timeout_seconds",
    )
    parser.add_argument(
        "--max-timeout",
        type=float,
        default=env_default("SANDBOX_MAX_TIMEOUT", "3600"),
        help="cap on timeout_seconds",
    )
    for flag, kind, default, text in (
        ("max-reply", int, str(32 * MIB), "encoded bytes of one /execute reply (half per stream)"),
        ("max-executes", int, "32", "commands running at once"),
        ("max-queued", int, "64", "executes waiting for a slot; beyond that: 429"),
        ("max-connections", int, "256", "connections served at once; beyond that: 503"),
        ("header-timeout", float, "30", "seconds to receive a request's line and headers"),
        ("body-timeout", float, "600", "seconds to receive a request's body"),
    ):
        name = "SANDBOX_" + flag.upper().replace("-", "_")
        parser.add_argument(f"--{flag}", type=kind, default=env_default(name, default), help=text)
    parser.add_argument(
        "--spool-dir",
        default=os.environ.get("SANDBOX_SPOOL_DIR"),
        help="where command output is spooled (default: $TMPDIR, /tmp, /var/tmp, else memory)",
    )
    args = parser.parse_args(argv)
    for name in (
        "max_upload",
        "max_output",
        "default_timeout",
        "max_timeout",
        "max_reply",
        "max_executes",
        "max_connections",
        "header_timeout",
        "body_timeout",
    ):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.workspace, exist_ok=True)
    umask = os.umask(0o022)
    os.umask(umask)
    config = Config(
        workspace=args.workspace,
        max_upload=args.max_upload,
        max_output=args.max_output,
        default_timeout=min(args.default_timeout, args.max_timeout),
        max_timeout=args.max_timeout,
        file_mode=0o666 & ~umask,
        max_reply=args.max_reply,
        max_executes=args.max_executes,
        max_queued=max(args.max_queued, 0),
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        spool_dir=args.spool_dir,
    )
    with contextlib.suppress(ValueError, OSError):  # deep trees are deleted one fd per level
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = SandboxServer((args.host, args.port), config)

    def stop(signum: int, _frame: object) -> None:
        # shutdown() waits for serve_forever(), which runs in this very thread: hand it off.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # As PID 1 or as subreaper the server inherits every orphan: reap their zombies.
    threading.Thread(target=reap_forever, args=(server,), daemon=True).start()
    # getsockname() gives the bound address with the host as str (server_address is typed as
    # possibly bytes); port 0 resolves to the real port here.
    host, port = server.socket.getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.kill_all()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
