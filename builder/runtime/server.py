"""Sandbox runtime server: the HTTP contract every sandbox image serves (port 8888).

Standard library only and one self-contained file, because images start it as
``python3 -I /opt/sandbox/server.py``: isolated mode keeps /app/deps and /app/deps-extra (on
PYTHONPATH) from shadowing the server's own modules, while the commands it runs still inherit
PYTHONPATH from its environment.

Routes: ``GET /`` health, ``POST /execute``, ``POST /upload`` (multipart, field ``file`` whose
filename is the destination), ``GET /download/{path}``, ``GET /list/{path}``,
``GET /exists/{path}``, ``DELETE /files/{path}``. Paths are percent-decoded exactly once and must
stay inside the workspace, symlinks included.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import re
import selectors
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote_to_bytes

MIB = 1024 * 1024
TIMEOUT_EXIT_CODE = 124
NOT_EXECUTABLE_EXIT_CODE = 126
NOT_FOUND_EXIT_CODE = 127
MAX_JSON_BODY = 16 * MIB
DRAIN_LIMIT = 1 * MIB
CHUNK = 256 * 1024
LINGER_SECONDS = 2.0
POLL_SECONDS = 0.02
REAP_SECONDS = 1.0
FILE_ROUTE = re.compile(r"/(download|list|exists|files)(?:/(.*))?", re.DOTALL)
DISPOSITION_PARAM = re.compile(r';\s*([^\s=;]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;]*))', re.DOTALL)


@dataclass(frozen=True)
class Config:
    """Limits and defaults, fixed at start-up."""

    workspace: str
    max_upload: int
    max_output: int
    default_timeout: float
    max_timeout: float
    file_mode: int


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
    raise exc


def check_os_string(value: str, what: str) -> None:
    """Reject strings the OS cannot take (NUL, lone surrogates) as a 400 instead of a crash."""
    if "\x00" in value:
        raise ApiError(400, f"{what} contains a NUL byte")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise ApiError(400, f"{what} is not valid UTF-8") from None


def realpath(path: str) -> str:
    """os.path.realpath, whose readlink can fail when a concurrent request removes a symlink
    mid-resolution (then: 404, like any path that vanished)."""
    try:
        return os.path.realpath(path)
    except OSError as exc:
        raise os_error(exc) from None


def remove_tree(path: str) -> None:
    """rmtree that tolerates entries vanishing under it; a directory that keeps being
    written to while it is deleted is a conflict rather than a server error."""
    for _ in range(5):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            if not os.path.lexists(path):
                return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise ApiError(409, "directory changed while it was being deleted; try again")


class Workspace:
    """Maps client paths onto the workspace and proves that they stay inside it."""

    def __init__(self, root: str) -> None:
        self.given = os.path.abspath(root)
        self.root = os.path.realpath(root)

    def contains(self, path: str) -> bool:
        """True if ``path`` (already symlink-free) is the root or below it."""
        return os.path.commonpath([self.root, path]) == self.root

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

    def resolve(self, raw: str) -> str:
        """The real path (all symlinks followed) of a client path; 403 if it leaves the root."""
        real = realpath(self.lexical(raw))
        if not self.contains(real):
            raise ApiError(403, "path resolves outside the workspace")
        return real

    def relative(self, real: str) -> str:
        """Path relative to the root, as reported back to clients."""
        return os.path.relpath(real, self.root)


class Capture:
    """Keeps the first ``limit`` bytes of a stream and counts the rest, so output stays bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        self.data += chunk[: max(room, 0)]
        self.dropped += max(len(chunk) - max(room, 0), 0)


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
            except (LookupError, UnicodeDecodeError):
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


def has_exited(pid: int) -> bool:
    """True once the child has exited, without reaping it, so its process group still exists."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group (grandchildren too), then the child itself."""
    for kill, target in ((os.killpg, proc.pid), (os.kill, proc.pid)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(target, signal.SIGKILL)


def open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits; None where the kernel lacks it."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def with_note(text: str, note: str) -> str:
    """Append a server note to stderr on its own line."""
    separator = "\n" if text and not text.endswith("\n") else ""
    return f"{text}{separator}[sandbox] {note}\n"


class SandboxServer(ThreadingHTTPServer):
    """Threaded server that also remembers running commands, to kill them on shutdown."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], config: Config) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.config = config
        self.workspace = Workspace(config.workspace)
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
        """Run argv without a shell; kill its process group on timeout or when it exits."""
        try:
            with self._lock:  # registered before the orphan reaper can see it
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                )
                self._running.add(proc)
        except FileNotFoundError:
            message = f"{argv[0]}: command not found\n"
            return {"stdout": "", "stderr": message, "exit_code": NOT_FOUND_EXIT_CODE}
        except OSError as exc:
            message = f"{argv[0]}: cannot execute: {exc.strerror}\n"
            return {"stdout": "", "stderr": message, "exit_code": NOT_EXECUTABLE_EXIT_CODE}
        try:
            out, err, timed_out = self._collect(proc, timeout)
        finally:
            kill_group(proc)
            proc.wait()
            with self._lock:
                self._running.discard(proc)
        stderr = err.data.decode("utf-8", "replace")
        for name, capture in (("stdout", out), ("stderr", err)):
            if capture.dropped:
                stderr = with_note(stderr, f"{name} truncated: {capture.dropped} bytes dropped")
        if timed_out:
            stderr = with_note(stderr, f"timed out after {timeout:g}s; process group killed")
            code = TIMEOUT_EXIT_CODE
        else:
            code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return {"stdout": out.data.decode("utf-8", "replace"), "stderr": stderr, "exit_code": code}

    def _collect(
        self, proc: subprocess.Popen[bytes], timeout: float
    ) -> tuple[Capture, Capture, bool]:
        """Read both pipes until the leader exits or the deadline passes, then the group dies."""
        assert proc.stdout is not None and proc.stderr is not None
        out, err = Capture(self.config.max_output), Capture(self.config.max_output)
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
                        kill_group(proc)
                        linger_until = now + LINGER_SECONDS
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
        return out, err, timed_out

    def reap_orphans(self) -> None:
        """As PID 1 (a container entrypoint) the server inherits every orphaned grandchild:
        reap those zombies, never a child that a running command's Popen still owns."""
        with self._lock:
            owned = {proc.pid for proc in self._running}
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit() or int(entry.name) in owned:
                    continue
                try:
                    with open(os.path.join(entry.path, "stat")) as handle:
                        fields = handle.read().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if fields[0] == "Z" and int(fields[1]) == os.getpid():
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(int(entry.name), os.WNOHANG)

    def kill_all(self) -> None:
        """Kill every running command's process group (server shutdown)."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            kill_group(proc)


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

    def parse_request(self) -> bool:
        """Refuse HTTP/0.9 (no status line, no headers): every answer here has a status."""
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":
            self.send_error(400, "HTTP/0.9 is not supported")
            return False
        return True

    # --- plumbing -------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._body_left = 0
        self._started = False
        try:
            self._frame_body()
            handler = self._route(method)
            handler()
        except ApiError as exc:
            self._error(exc)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
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
        """Learn how many body bytes follow; chunked bodies are refused (uploads need a size)."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ApiError(411, "send a Content-Length; chunked bodies are not supported")
        length = self.headers.get("Content-Length")
        if length is None:
            return
        if not length.strip().isdigit():
            self.close_connection = True
            raise ApiError(400, "invalid Content-Length")
        self._body_left = int(length)

    def _read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body (fewer at its end), never past Content-Length."""
        size = min(size, self._body_left)
        if size <= 0:
            return b""
        data = self.rfile.read1(size)
        if not data:
            self.close_connection = True
            raise ApiError(400, "request body ended early")
        self._body_left -= len(data)
        return data

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
            if self._body_left <= DRAIN_LIMIT and not self.close_connection:
                while self._body_left:
                    self._read(CHUNK)
            else:
                self.close_connection = True
        self._started = True
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
        length = self.headers.get("Content-Length", "").strip()
        too_big = length.isdigit() and int(length) > self.server.config.max_upload
        if too_big and self.path.partition("?")[0] == "/upload":
            return True  # no "100 Continue": the handler answers 413 straight away
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
        config, workspace = self.server.config, self.server.workspace
        argv = parse_command(request.get("command"))
        timeout = parse_timeout(request.get("timeout_seconds"), config)
        env = os.environ | parse_env(request.get("env"))
        cwd_raw = request.get("cwd")
        if cwd_raw is None or cwd_raw == "":
            cwd = workspace.root
        elif isinstance(cwd_raw, str):
            cwd = workspace.resolve(cwd_raw)
            if not os.path.exists(cwd):
                raise ApiError(404, "cwd does not exist")
            if not os.path.isdir(cwd):
                raise ApiError(400, "cwd is not a directory")
        else:
            raise ApiError(400, "cwd must be a string")
        self._send_json(200, self.server.run(argv, cwd, env, timeout))

    def _upload(self) -> None:
        limit = self.server.config.max_upload
        if self._body_left > limit:
            self.close_connection = True
            raise ApiError(413, f"upload larger than {limit} bytes")
        if self.headers.get("Content-Length") is None:
            raise ApiError(411, "uploads need a Content-Length")
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
        """Write one part to a temporary file beside the target, then rename it into place:
        the target is never opened through a symlink and a failed upload leaves nothing."""
        workspace = self.server.workspace
        real = workspace.resolve(filename)
        if real == workspace.root or filename.endswith("/"):
            raise ApiError(400, "upload filename must name a file")
        if os.path.isdir(real):
            raise ApiError(400, "upload target is a directory")
        parent = os.path.dirname(real)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise (
                ApiError(400, "a parent of the path is a file")
                if exc.errno in (errno.EEXIST, errno.ENOTDIR)
                else os_error(exc)
            ) from None
        if realpath(parent) != parent:
            raise ApiError(403, "path resolves outside the workspace")
        try:
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=".upload-")
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
            os.replace(tmp, real)
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):  # its directory may be gone too
                os.unlink(tmp)
            if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError):
                raise os_error(exc) from None
            raise
        return {"path": workspace.relative(real), "size": size}

    def _download(self, raw: str) -> None:
        real = self.server.workspace.resolve(raw)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise os_error(exc) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            kind = "is a directory; use /list" if stat.S_ISDIR(info.st_mode) else "not a file"
            raise ApiError(400, kind)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as handle:
            name = quote(os.path.basename(real), safe="")
            self._begin(
                200,
                {
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(info.st_size),
                    "Content-Disposition": f"attachment; filename*=UTF-8''{name}",
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
        real = self.server.workspace.resolve(raw)
        try:
            if not stat.S_ISDIR(os.stat(real).st_mode):
                raise ApiError(400, "not a directory")
            entries = []
            with os.scandir(real) as found:
                for entry in found:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    entries.append(
                        {
                            "name": entry.name,
                            "size": info.st_size,
                            "type": "directory" if stat.S_ISDIR(info.st_mode) else "file",
                            "mod_time": info.st_mtime,
                        }
                    )
        except OSError as exc:
            raise os_error(exc) from None
        self._send_json(200, sorted(entries, key=lambda item: item["name"]))

    def _exists(self, raw: str) -> None:
        real = self.server.workspace.resolve(raw)
        self._send_json(200, {"path": raw, "exists": os.path.exists(real)})

    def _delete(self, raw: str) -> None:
        """Delete what the path names; a symlink is removed itself, never what it points to."""
        workspace = self.server.workspace
        lexical = workspace.lexical(raw)
        parent = realpath(os.path.dirname(lexical))
        target = os.path.join(parent, os.path.basename(lexical))
        if lexical == workspace.root or not workspace.contains(parent) or target == workspace.root:
            raise ApiError(403, "cannot delete the workspace root or outside it")
        try:
            if stat.S_ISDIR(os.lstat(target).st_mode):
                remove_tree(target)
            else:
                os.unlink(target)
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
    args = parser.parse_args(argv)
    for name in ("max_upload", "max_output", "default_timeout", "max_timeout"):
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
    )
    server = SandboxServer((args.host, args.port), config)

    def stop(signum: int, _frame: object) -> None:
        # shutdown() waits for serve_forever(), which runs in this very thread: hand it off.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if os.getpid() == 1:
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
