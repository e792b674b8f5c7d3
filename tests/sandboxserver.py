"""The sandbox runtime server (``builder/runtime/server.py``) as a subprocess, for tests.

Starts it on a free loopback port (``--port 0``), reads the port from its ``listening on`` line,
talks HTTP to it and stops it with SIGTERM (then SIGKILL). Also: a multipart encoder shaped like
the upstream client's, and /proc helpers to find processes the server should have reaped.
"""

from __future__ import annotations

import http.client
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
from pathlib import Path

SERVER = Path(__file__).resolve().parents[1] / "builder" / "runtime" / "server.py"
# The interpreter that runs the server: images use 3.13; CI may point this at one.
SERVER_PYTHON = os.environ.get("SANDBOX_SERVER_PYTHON", sys.executable)


class ServerProcess:
    """A server subprocess on a free loopback port, plus a tiny HTTP client for it.

    ``log`` receives the server's stderr (default: a fresh file beside ``workspace``); ``prefix``
    is prepended to the command line (e.g. ``unshare ...``).
    """

    def __init__(
        self,
        workspace: Path,
        *flags: str,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.workspace = workspace
        self.log = log or workspace.parent / f"server-{secrets.token_hex(4)}.log"
        argv = [*prefix, SERVER_PYTHON, "-I", str(SERVER), "--host", "127.0.0.1", "--port", "0"]
        argv += ["--workspace", str(workspace), *flags]
        with self.log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=stderr, env=env or dict(os.environ)
            )
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            assert selector.select(15), "server did not report its port"
        line = self.proc.stdout.readline().decode()
        assert line.startswith("listening on 127.0.0.1:"), line
        self.port = int(line.rsplit(":", 1)[1])

    def connection(self) -> http.client.HTTPConnection:
        """The connection for the next request: a new one (subclasses may keep one alive)."""
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def release(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        """Called after a response was read in full: close the connection."""
        conn.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one HTTP request."""
        conn = self.connection()
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            conn.close()
            raise
        self.release(conn, response)
        return response.status, dict(response.getheaders()), data

    def raw(self, data: bytes) -> bytes:
        """Send bytes as they are on a fresh socket and return whatever comes back."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def stop(self) -> int:
        """SIGTERM, then the exit status (SIGKILL if it takes over 10 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            assert self.proc.stdout is not None
            self.proc.stdout.close()


def multipart(
    filename: str,
    data: bytes,
    field: str = "file",
    content_type: str | None = "application/octet-stream",
) -> tuple[bytes, str]:
    """(body, Content-Type) of a multipart/form-data file field the way urllib3 2 (requests)
    encodes it: CR, LF and quote percent-escaped; ``content_type=None`` leaves out the part's
    own Content-Type header."""
    boundary = secrets.token_hex(16)
    safe = filename.translate({10: "%0A", 13: "%0D", 34: "%22"})
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{safe}"\r\n'
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n"
    body = (head + "\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def proc_stat(pid: int | str) -> tuple[str, int]:
    """(state, parent pid) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def processes_with(marker: str) -> list[int]:
    """Live (non-zombie) processes other than this one whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = proc_stat(entry.name)[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
