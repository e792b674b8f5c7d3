"""The application: the contract's routes, and the server that holds what they share.

:class:`Handler` gets each request already framed (``protocol.framing``); it validates, acts
through the workspace's descriptors (``files.paths``) or the command runner
(``execution.commands``), and answers JSON.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from .admission.limits import Slots
from .admission.listener import Listener
from .config import CHUNK, Config
from .errors import ApiError, os_error
from .execution.commands import Runner, parse_command, parse_env, parse_timeout
from .execution.output import SpoolFactory
from .execution.supervisor import MARKER_VAR, Supervisor, process_limit_reached
from .files.paths import DIR_READ, Workspace, remove_tree
from .health import health_payload
from .protocol.forms import Multipart, disposition_params
from .protocol.framing import FramedHandler

FILE_ROUTE = re.compile(r"/(download|list|exists|files)(?:/(.*))?", re.DOTALL)


class SandboxServer(Listener):
    """The threaded server, bounded in connections (``admission.listener``) and concurrent
    commands (``admission.limits``)."""

    def __init__(self, address: tuple[str, int], config: Config) -> None:
        super().__init__(address, Handler, config)
        self.workspace = Workspace(config.workspace)
        self.supervisor = Supervisor()
        self.spools = SpoolFactory(config.spool_dir, self.workspace.root)
        self.slots = Slots(config.max_executes, config.max_queued, config.max_executes_per_source)
        self.runner = Runner(config, self.supervisor, self.spools)

    def unready(self, holding: int = 0) -> str | None:
        """The listener's reasons, then the command side's: no slot or queue place, the
        container's process limit reached, no spool file to be had."""
        if reason := super().unready(holding):
            return reason
        if not self.slots.has_room():
            return "every command slot and queue place is taken"
        if process_limit_reached():
            return "the process limit is reached"
        try:
            self.spools.new().close()
        except OSError as exc:
            return f"command output cannot be spooled: {exc.strerror or exc}"
        return None

    def reap_orphans(self) -> None:
        self.supervisor.reap_orphans()

    def kill_all(self) -> None:
        """Kill every process the server's commands started (server shutdown)."""
        self.supervisor.kill_everything()


class Handler(FramedHandler):
    """One request: route, validate, answer JSON."""

    server: SandboxServer

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

    def _refuses_body(self, length: int) -> bool:
        """Do not invite an upload that will be refused as too large (a 413 instead)."""
        return length > self.server.config.max_upload and self.path.partition("?")[0] == "/upload"

    # --- routes ---------------------------------------------------------------------------

    def _health(self) -> None:
        """ok only when a new command could run (``unready``), as the gate answers it too."""
        reason = self.server.unready(holding=1)
        if reason is None:
            self._send_json(200, health_payload(reason))
        else:
            self._send_json(503, health_payload(reason), {"Retry-After": "1"})

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
        source = server.sources.of(self.client_address, self.connection.getsockname())
        # The slot bounds commands running: it is free again once the command has ended, so a
        # client that has read its reply finds it free, however slowly the reply streamed.
        with server.slots.hold(source):
            cwd_fd = workspace.open_cwd(cwd_raw)
            try:
                outcome = server.runner.run(argv, cwd_fd, env, timeout)
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
