"""The sandbox runtime server (``builder/runtime/server/``) as a subprocess, for tests.

Starts it on a free loopback port (``--port 0``), reads the port from its ``listening on`` line,
talks HTTP to it and stops it with SIGTERM (then SIGKILL). Also: a multipart encoder shaped like
the upstream client's, and /proc helpers to find processes the server should have reaped.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import http.client
import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypedDict

import pytest

from builder.runtime import copy_server
from builder.verify.client import Sandbox
from builder.verify.hardened.hardening import HEALTH_LIMIT, NATIVE_START
from builder.verify.hardened.starve import ATTACK
from support.waiting import accepts, wait_for

SERVER = Path(
    os.environ.get(
        "SANDBOX_SERVER_SCRIPT",  # e.g. an older server, to show a test fails on it
        Path(__file__).resolve().parents[2] / "builder" / "runtime" / "server",
    )
)
# The interpreter that runs the server: images use 3.13; CI may point this at one.
SERVER_PYTHON = os.environ.get("SANDBOX_SERVER_PYTHON", sys.executable)
# The sandbox user of the images; tests that run as root start the server as this user.
SANDBOX_UID = 65532
MIB = 1024 * 1024
REPORT_SECONDS = 60  # how long a server may take to print its port (a busy machine: long)


@functools.cache
def reachable_copy(source: Path) -> Path:
    """``source`` (the server's package directory, or another server's directory or single
    file) copied once a process into a fresh directory under /tmp, laid out as the image
    installs it under /opt/sandbox: directories 0755, files 0444, so a server run as another
    user can read it wherever the checkout lives (a home or a ``mktemp -d`` is 0700). Removed
    when the process exits."""
    parent = Path(tempfile.mkdtemp(prefix="bsi-server-", dir="/tmp"))
    atexit.register(shutil.rmtree, parent, ignore_errors=True)
    copy = parent / source.name
    if source.is_dir():
        copy_server(copy, source)
    else:
        shutil.copyfile(source, copy)
    for directory, _, files in os.walk(parent):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o444)
    return copy


Access = Literal["read", "write", "execute"]
# As the user: each directory above the path must be enterable, then the path itself allow
# the access (a directory also entered): the first that fails is printed ("enter" or "use").
REACH = (
    "flag=$1; path=$2; shift 2\n"
    'for dir; do test -x "$dir" || { echo "enter $dir"; exit; }; done\n'
    'test "$flag" "$path" || { echo "use $path"; exit; }\n'
    'if test -d "$path" && ! test -x "$path"; then echo "enter $path"; fi\n'
)


def reach_problem(uid: int, path: Path, access: Access) -> str | None:
    """None when ``uid`` (its own gid, no other groups) can enter every directory above
    ``path`` and ``access`` it, else one line naming the directory or file it cannot use,
    its mode and owner. Asked as that user (``test`` in a shell), so ACLs and the like count
    as the kernel counts them."""
    flag = {"read": "-r", "write": "-w", "execute": "-x"}[access]
    path = Path(os.path.abspath(path))
    result = subprocess.run(
        ["sh", "-c", REACH, "reach", flag, str(path), *map(str, reversed(path.parents))],
        user=uid, group=uid, extra_groups=[], capture_output=True, text=True, check=True,
    )  # fmt: skip
    if not result.stdout:
        return None
    verb, _, culprit = result.stdout.rstrip("\n").partition(" ")
    try:
        found = os.stat(culprit)
    except OSError as error:
        return f"uid {uid} cannot {verb} {culprit}: {error.strerror}"
    what = f"{stat.filemode(found.st_mode)} {found.st_uid}:{found.st_gid}"
    verb = access if verb == "use" else verb
    return f"uid {uid} cannot {verb} {culprit} ({what})"


class ServerProcess:
    """A server subprocess on a free loopback port, plus a tiny HTTP client for it.

    ``log`` receives the server's stderr (default: a fresh file beside ``workspace``); ``prefix``
    is prepended to the command line (e.g. ``unshare ...``); ``server`` is the server to run
    (default: ``SERVER``); ``uid``, the user ``prefix`` switches to, if any: what that user
    cannot reach (the interpreter, the server, the workspace) fails the test with one line
    before anything starts.
    """

    def __init__(
        self,
        workspace: Path,
        *flags: str,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
        python: str = SERVER_PYTHON,
        host: str = "127.0.0.1",
        server: Path | None = None,
        uid: int | None = None,
    ) -> None:
        self.workspace = workspace
        self.address = "127.0.0.1"  # where clients connect
        self.log = log or workspace.parent / f"server-{secrets.token_hex(4)}.log"
        server = server or SERVER
        env = env or dict(os.environ)
        if uid is not None:
            check_reach(uid, python, env, server, workspace)
        argv = [*prefix, python, "-I", str(server), "--host", host, "--port", "0"]
        argv += ["--workspace", str(workspace), *flags]
        with self.log.open("wb") as stderr:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, env=env)
        self.port = int(self._reported(host).rsplit(":", 1)[1])

    def _reported(self, host: str) -> str:
        """The server's ``listening on`` line; else the test fails saying what became of it
        (its exit status and the last line it wrote to the log)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + REPORT_SECONDS
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while not selector.select(0.1):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    break
            else:
                line = self.proc.stdout.readline().decode()
                if line.startswith(f"listening on {host}:"):
                    return line
        try:
            how = f"exit status {self.proc.wait(timeout=1)}"  # its stdout closed: it is exiting
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            how = "still running"
        told = self.log.read_text(errors="replace").strip().splitlines()
        pytest.fail(
            f"the server did not report its port ({how}); its log ends: "
            + (told[-1] if told else "(empty)"),
            pytrace=False,
        )

    def connection(self) -> http.client.HTTPConnection:
        """The connection for the next request: a new one (subclasses may keep one alive)."""
        return http.client.HTTPConnection(self.address, self.port, timeout=60)

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
        with socket.create_connection((self.address, self.port), timeout=10) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def stop(self) -> int:
        """SIGTERM, then the exit status (SIGKILL if it takes over 60 s: a bound on a hang,
        generous for a busy machine)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            assert self.proc.stdout is not None
            self.proc.stdout.close()


# Its own pid namespace (as a container's: PID 1, /proc shows only its processes) and network
# namespace with loopback up: code the server runs reaches it on 127.0.0.1, as in a pod.
NAMESPACES = ("unshare", "--kill-child", "--pid", "--mount-proc", "--net")
LOOPBACK_UP = ("sh", "-c", 'ip link set lo up && exec "$@"', "sh")


class NamespacedServer(ServerProcess):
    """The server in its own pid and network namespaces, reached over a veth pair (root only).

    Clients on this side come from ``sources`` (two addresses of the host's end, so a test has
    two outside sources; ``connection()`` uses the first), the server is at ``address``, and the
    commands it runs are on its loopback: the sandbox's own code, one source to the server.
    """

    def __init__(
        self, workspace: Path, *flags: str, prefix: tuple[str, ...] = (), **options: Any
    ) -> None:
        """``prefix`` comes after the namespaces are made (e.g. ``setpriv``, as root did)."""
        super().__init__(
            workspace, *flags, prefix=NAMESPACES + LOOPBACK_UP + prefix, host="0.0.0.0", **options
        )
        net = f"10.{secrets.randbelow(50) + 200}.{secrets.randbelow(256)}"
        low = 8 * secrets.randbelow(32)
        self.address = f"{net}.{low + 2}"
        self.sources = (f"{net}.{low + 1}", f"{net}.{low + 3}")
        self.link = f"bsi{secrets.token_hex(4)}"
        inside = ("nsenter", "-t", str(self.proc.pid), "-n")
        peer = ("name", "eth0", "netns", str(self.proc.pid))  # created in the server's network
        try:
            for argv in (
                ("ip", "link", "add", self.link, "type", "veth", "peer", *peer),
                *(("ip", "addr", "add", f"{a}/29", "dev", self.link) for a in self.sources),
                ("ip", "link", "set", self.link, "up"),
                (*inside, "ip", "addr", "add", f"{self.address}/29", "dev", "eth0"),
                (*inside, "ip", "link", "set", "eth0", "up"),
            ):
                subprocess.run(argv, check=True, capture_output=True)
            self._wait_reachable()
        except BaseException:
            self.stop()
            raise

    def _wait_reachable(self) -> None:
        wait_for(
            lambda: accepts(self.address, self.port),
            deadline_s=60,
            what=f"the server at {self.address}:{self.port}, over the veth pair",
            process=self.proc,
        )

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(
            self.address, self.port, timeout=60, source_address=(self.sources[0], 0)
        )

    def connect_from(self, source: str, timeout: float = 10) -> socket.socket:
        """A raw connection to the server from one of ``sources``."""
        return socket.create_connection(
            (self.address, self.port), timeout=timeout, source_address=(source, 0)
        )

    def inside(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the server's side (its network namespace): the sandbox's own code."""
        command = ("nsenter", "-t", str(self.proc.pid), "-n", *argv)
        return subprocess.run(command, capture_output=True, text=True, check=False)

    def accepted_all(self) -> bool:
        """Has the server accepted every connection made to it? (Its listening socket's accept
        queue, ``ss``'s Recv-Q, is empty.) A connection still queued holds no slot yet, and a
        probe sent meanwhile may take the slot it was to hold."""
        listening = self.inside("ss", "-ltnH", f"sport = :{self.port}").stdout.split()
        return len(listening) > 1 and listening[1] == "0"

    def server_pid(self) -> int:
        """The server process itself (``unshare``'s child)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0])

    def stop(self) -> int:
        """SIGTERM to the server itself (``unshare --fork`` passes no signal on; it exits with
        its child), then the veth's host end goes (the namespace's end went with it)."""
        with contextlib.suppress(OSError, IndexError, ValueError):
            os.kill(self.server_pid(), signal.SIGTERM)
        try:
            return super().stop()
        finally:
            subprocess.run(("ip", "link", "del", self.link), capture_output=True, check=False)


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


def hang_up(sock: socket.socket) -> None:
    """Close our side of a connection the server is serving and wait until it has closed its
    own: its thread gives the connection's shares back before it closes the socket
    (``Listener.serve_connection``), so they are free when this returns. A connection the
    server had dropped already is over at once."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    sock.close()


def stop_signals_pending(pid: int) -> bool:
    """Whether a SIGTERM or SIGINT sent to ``pid`` waits to be read (the server blocks both
    and reads them on a thread of its own): /proc's pending masks, process-wide and of the
    main thread, one bit per signal from bit 0 for signal 1."""
    masks = [
        int(line.split()[1], 16)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith(("ShdPnd:", "SigPnd:"))
    ]
    stop = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))
    return any(mask & stop for mask in masks)


def check_reach(uid: int, python: str, env: dict[str, str], server: Path, workspace: Path) -> None:
    """Fail the test with one line when ``uid`` cannot execute ``python`` (as found on the
    server's PATH), read ``server`` (its ``__main__.py`` when a directory) or write
    ``workspace``: otherwise the server dies before it reports its port."""
    found = shutil.which(python, path=env.get("PATH"))
    entry = server / "__main__.py" if server.is_dir() else server
    needs: tuple[tuple[str, Path, Access], ...] = (
        ("the interpreter", Path(os.path.realpath(found or python)), "execute"),
        ("the server", entry, "read"),
        ("the workspace", workspace, "write"),
    )
    for role, path, access in needs:
        problem = reach_problem(uid, path, access)
        if problem:
            pytest.fail(f"{problem}, so it cannot run the server: {role} is {path}", pytrace=False)


class AsUser(TypedDict, total=False):
    """ServerProcess arguments that run the server as another user (none when not root)."""

    env: dict[str, str]
    prefix: tuple[str, ...]
    python: str
    server: Path
    uid: int


def as_sandbox_user(uid: int = SANDBOX_UID, limits: tuple[str, ...] = ()) -> AsUser:
    """ServerProcess arguments that run the server as ``uid`` (65532, as in the images) when
    the tests run as root: ``setpriv`` (after ``limits``, e.g. ``prlimit ...``), an interpreter
    that user can execute, and the server copied where that user can read it."""
    if os.geteuid() != 0:
        return {}
    python = os.environ.get("SANDBOX_HARDENED_PYTHON", "/usr/bin/python3")
    ids = str(uid)
    # Commands must find a python3 that user can run (root's pyenv shims are not).
    path = f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin"
    return {
        "env": dict(os.environ, PATH=path),
        "prefix": (*limits, "setpriv", "--reuid", ids, "--regid", ids, "--clear-groups"),
        "python": python,
        "server": reachable_copy(SERVER),
        "uid": uid,
    }


def sandbox_dir(parent: str | None = None) -> Path:
    """A fresh directory the sandbox user can use (pytest's own tmp dirs are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="sbx-", dir=parent or "/tmp"))
    path.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(path, SANDBOX_UID, SANDBOX_UID)
    return path


def give_to_sandbox_user(root: Path) -> None:
    """chown -R to the sandbox user (when root), symlinks themselves included."""
    if os.geteuid() != 0:
        return
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.chown(Path(directory, name), SANDBOX_UID, SANDBOX_UID, follow_symlinks=False)
    os.chown(root, SANDBOX_UID, SANDBOX_UID)


def peak_rss(pid: int) -> int:
    """A process's peak resident set size in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


# --- reliability measurements (tests/test_server_*.py and benchmarks/server_reliability.py) --

SWAPPER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(100):
        libc.renameat2(-100, b"d", -100, b"l", 2)  # AT_FDCWD, RENAME_EXCHANGE
"""
INSIDE = "inside-content"
OUTSIDE_ONLY = "outside-only-name.txt"
RACE_ROUTES = ("download", "list", "exists", "delete", "upload", "execute")


class RaceLayout:
    """workspace/d (a directory) and workspace/l (a symlink to ``outside``), which a command
    swaps with renameat2(RENAME_EXCHANGE) in a loop: a request for ``d/...`` that follows the
    symlink reads, lists, deletes or writes outside the workspace."""

    def __init__(self, base: Path, victims: int) -> None:
        self.secret = f"SECRET-{secrets.token_hex(8)}"
        self.workspace = base / "workspace"
        self.outside = base / "outside"
        for root, content in ((self.workspace / "d", INSIDE), (self.outside, self.secret)):
            root.mkdir(parents=True)
            (root / "f.txt").write_text(content)
            (root / "sub").mkdir()
            for index in range(victims):
                (root / f"v{index}").write_text(content)
                (root / f"t{index}").mkdir()
                (root / f"t{index}" / "x").write_text(content)
        (self.outside / OUTSIDE_ONLY).write_text(self.secret)
        (self.workspace / "l").symlink_to(self.outside)
        give_to_sandbox_user(base)

    def outside_damage(self, victims: int) -> dict[str, int]:
        """What deletes and uploads did outside: files removed, trees emptied, files made."""
        removed = sum(not (self.outside / f"v{i}").exists() for i in range(victims))
        trees = sum(not (self.outside / f"t{i}" / "x").exists() for i in range(victims))
        made = [p.name for p in self.outside.iterdir() if p.name.startswith(("u", ".upload-"))]
        return {"delete": removed + trees, "upload": len(made)}


def race(
    server: ServerProcess,
    layout: RaceLayout,
    attempts: int,
    workers: int = 8,
    swapper_prefix: tuple[str, ...] = (),
) -> dict[str, tuple[int, int]]:
    """Hammer each route ``attempts`` times with paths under ``d`` while ``d`` and ``l`` are
    swapped; (attempts, escapes) per route."""
    escapes = dict.fromkeys(RACE_ROUTES, 0)
    outside = os.path.realpath(layout.outside)
    python = as_sandbox_user().get("python", sys.executable) if swapper_prefix else sys.executable
    swapper = subprocess.Popen(
        [*swapper_prefix, str(python), "-c", SWAPPER, "600"], cwd=layout.workspace
    )
    wait_for(  # d is the symlink at every other swap: it has swapped once at least
        (layout.workspace / "d").is_symlink,
        deadline_s=60,
        what="the swapper's first swap",
        process=swapper,
    )

    def probe(route: str, index: int) -> bool:
        if route == "download":
            status, _, body = server.request("GET", "/download/d%2Ff.txt")
            return layout.secret.encode() in body
        if route == "list":
            status, _, body = server.request("GET", "/list/d")
            return status == 200 and OUTSIDE_ONLY.encode() in body
        if route == "exists":
            status, _, body = server.request("GET", f"/exists/d%2F{OUTSIDE_ONLY}")
            return status == 200 and json.loads(body)["exists"] is True
        if route == "delete":
            name = f"v{index // 2}" if index % 2 == 0 else f"t{index // 2}"
            server.request("DELETE", f"/files/d%2F{name}")
            return False  # counted from the outside directory afterwards
        if route == "upload":
            body, content_type = multipart(f"d/u{index}.txt", b"written")
            server.request("POST", "/upload", body, {"Content-Type": content_type})
            return False  # likewise
        payload = json.dumps({"command": "pwd", "cwd": "d", "timeout_seconds": 10}).encode()
        status, _, body = server.request("POST", "/execute", payload)
        return status == 200 and json.loads(body)["stdout"].strip() == outside

    try:
        for route in RACE_ROUTES:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                found = pool.map(lambda index, r=route: probe(r, index), range(attempts))
                escapes[route] += sum(found)
    finally:
        swapper.kill()
        swapper.wait()
    damage = layout.outside_damage((attempts + 1) // 2)
    escapes["delete"] += damage["delete"]
    escapes["upload"] += damage["upload"]
    return {route: (attempts, escapes[route]) for route in RACE_ROUTES}


DOUBLE_FORK = """
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", sys.argv[1]])
    os._exit(0)
os.wait()
print("ok")
"""
ENV_CLEARED = """
import os, shutil, sys
sleep = shutil.which("sleep")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sleep, ["sleep", sys.argv[1]], {})
    os._exit(0)
os.wait()
print("ok")
"""
FAN_OUT = """
import subprocess, sys
for _ in range(10):
    subprocess.Popen(["setsid", "sleep", sys.argv[1]], start_new_session=True)
print("ok")
"""


def daemon_patterns(marker: str) -> list[tuple[str, list[str], float]]:
    """(name, command, timeout_seconds): commands that leave a ``sleep 1000.<marker>`` behind,
    by every trick that changes session, group or parent."""
    arg = f"1000.{marker}"
    sleep = f"sleep {arg}"

    def py(code: str) -> list[str]:
        return ["python3", "-c", code, arg]

    return [
        ("background &", ["sh", "-c", f"{sleep} & echo ok"], 30),
        ("setsid &", ["sh", "-c", f"setsid {sleep} & echo ok"], 30),
        ("setsid -f", ["setsid", "-f", "sleep", arg], 30),
        ("(setsid &) subshell", ["sh", "-c", f"(setsid {sleep} &); echo ok"], 30),
        ("nohup &", ["sh", "-c", f"nohup {sleep} >/dev/null 2>&1 & echo ok"], 30),
        ("bash disown", ["bash", "-c", f"{sleep} & disown; echo ok"], 30),
        ("double-fork daemon", py(DOUBLE_FORK), 30),
        (
            "start_new_session=True",
            py("import subprocess as s,sys; s.Popen(['sleep',sys.argv[1]],start_new_session=True)"),
            30,
        ),
        (
            "process_group=0",
            py("import subprocess,sys; subprocess.Popen(['sleep', sys.argv[1]], process_group=0)"),
            30,
        ),
        ("nested setsid", ["sh", "-c", f"setsid sh -c '{sleep} & {sleep}' & echo ok"], 30),
        ("ignores HUP/TERM", ["sh", "-c", f"trap '' HUP INT TERM; {sleep} & echo ok"], 30),
        ("fan-out x10 setsid", py(FAN_OUT), 30),
        ("env cleared + double fork", py(ENV_CLEARED), 30),
        ("timeout: setsid & + wait", ["sh", "-c", f"setsid {sleep} & {sleep}"], 1),
        ("timeout: setsid -f + wait", ["sh", "-c", f"setsid -f {sleep}; {sleep}"], 1),
        (
            "timeout: double fork + wait",
            ["sh", "-c", f"python3 -c '{DOUBLE_FORK}' {arg}; {sleep}"],
            1,
        ),
    ]


def run_daemon_pattern(
    server: ServerProcess, command: list[str], timeout: float, marker: str, grace: float = 10.0
) -> tuple[dict[str, object], float, list[int]]:
    """(reply, seconds to the reply, processes still carrying ``marker`` after ``grace``: the
    kill's last steps may lag the reply on a busy machine; the loop ends once none is left)."""
    payload = json.dumps({"command": command, "timeout_seconds": timeout}).encode()
    start = time.monotonic()
    status, _, body = server.request("POST", "/execute", payload)
    elapsed = time.monotonic() - start
    assert status == 200, body
    with contextlib.suppress(AssertionError):  # the survivors are the answer, not a failure
        wait_for(lambda: not processes_with(marker), deadline_s=grace, what="no survivor")
    left = processes_with(marker)
    for pid in left:  # clean up after a failing server, so later patterns start clean
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return json.loads(body), elapsed, left


FLOOD = (
    "import sys\nchunk = b'\\xff' * (1 << 20)\n"
    "for _ in range(10):\n"
    "    sys.stdout.buffer.write(chunk); sys.stdout.flush()\n"
    "    sys.stderr.buffer.write(chunk); sys.stderr.flush()\n"
)


def health_limit() -> float:
    """The verifier's health deadline (hardening.HEALTH_LIMIT) stretched as it stretches it,
    by how slowly this machine starts a Python now: load from the rest of the suite slows a
    reply without making the server any less responsive. Memory and size bounds never stretch."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
    return HEALTH_LIMIT * max(1.0, (time.monotonic() - started) / NATIVE_START)


def flood(server: ServerProcess, concurrent: int = 8) -> dict[str, object]:
    """``concurrent`` commands each writing 10 MiB of 0xff to stdout and to stderr, while
    ``GET /`` is timed: the server's peak RSS, the slowest health answer, reply sizes."""
    latencies: list[float] = []
    done = threading.Event()

    def health() -> None:
        while not done.is_set():
            start = time.monotonic()
            status = server.request("GET", "/")[0]
            latencies.append(time.monotonic() - start if status == 200 else 99.0)
            time.sleep(0.05)  # the pace of the probe, as a kubelet's (not a synchronisation)

    def run(_index: int) -> tuple[int, dict[str, object]]:
        payload = json.dumps({"command": ["python3", "-c", FLOOD], "timeout_seconds": 120})
        status, _, body = server.request("POST", "/execute", payload.encode())
        assert status == 200, body[:200]
        reply = json.loads(body)
        return len(body), {k: reply[k] for k in ("exit_code", "timed_out", "truncated")}

    watcher = threading.Thread(target=health, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=concurrent) as pool:
            results = list(pool.map(run, range(concurrent)))
    finally:
        done.set()
        watcher.join()
    return {
        "peak_rss": peak_rss(server.proc.pid),
        "max_health_seconds": max(latencies),
        "reply_bytes": max(size for size, _ in results),
        "replies": [reply for _, reply in results],
    }


def starve(
    server: NamespacedServer, connections: int, seconds: float, python: tuple[str, ...]
) -> dict[str, object]:
    """The starve attack (builder/verify/hardened/starve.py's) from the server's side, run by
    ``python`` (e.g. ``setpriv`` to uid 65532 and an interpreter) for ``seconds``, while from
    outside ``GET /`` is asked every 50 ms and ``/execute`` every 250 ms: what the attack got,
    and what the outside got."""
    marker = server.workspace / f"starve-{secrets.token_hex(4)}"
    inside = ("nsenter", "-t", str(server.proc.pid), "-n", *python, "-c", ATTACK)
    argv = [*inside, str(connections), str(seconds), "3", str(server.port), str(marker)]
    attack = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    wait_for(marker.exists, deadline_s=60, what="the attack to start", process=attack)
    health: list[tuple[int, float]] = []
    executes: list[tuple[int, float]] = []

    def timed(request: Any) -> tuple[int, float]:
        started = time.monotonic()
        try:
            status = request()
        except (OSError, http.client.HTTPException):
            status = 0
        return status, time.monotonic() - started

    def outside(into: list[tuple[int, float]], request: Any, pause: float) -> None:
        while attack.poll() is None:
            into.append(timed(request))
            time.sleep(pause)  # the pace of the outside's requests (not a synchronisation)

    body = json.dumps({"command": ["echo", "served"]}).encode()
    workers = [
        threading.Thread(
            target=outside, args=(health, lambda: server.request("GET", "/")[0], 0.05)
        ),
        threading.Thread(
            target=outside,
            args=(executes, lambda: server.request("POST", "/execute", body)[0], 0.25),
        ),
    ]
    for worker in workers:
        worker.start()
    out, _ = attack.communicate(timeout=seconds + 120)
    for worker in workers:
        worker.join()
    found = json.loads(out)
    return {
        **found,
        "health": len(health),
        "health_not_200": sum(status != 200 for status, _ in health),
        "health_slowest": max(seconds for _, seconds in health),
        "executes": len(executes),
        "executes_not_200": sum(status != 200 for status, _ in executes),
        "execute_slowest": max(seconds for _, seconds in executes),
    }


def malformed_requests() -> list[tuple[str, bytes]]:
    """Requests each of which once made the server answer 500 or nothing at all."""
    deep = "a/" * 1000 + "x"
    body, content_type = multipart(deep, b"deep")
    deep_upload = (
        f"POST /upload HTTP/1.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    part = b'--zz\r\nContent-Disposition: form-data; name="file"; filename="b.txt"\r\n'
    part += b"\r\nv\r\n--zz--\r\n"

    def upload_with(content_type: bytes) -> bytes:
        head = b"POST /upload HTTP/1.1\r\nContent-Type: " + content_type + b"\r\n"
        return head + f"Content-Length: {len(part)}\r\n\r\n".encode() + part

    requests: list[tuple[str, bytes]] = [("upload a/*1000+x", deep_upload)]
    for expect in (b"", b"Expect: 100-continue\r\n"):
        label = " + Expect" if expect else ""
        for name, length in (
            ("Content-Length \\xb2", b"\xb2"),
            ("Content-Length 4301 digits", b"9" * 4301),
            ("Content-Length 4301 zeros+1", b"0" * 4300 + b"1"),
            ("Content-Length \\u0661 (Arabic one)", "\u0661".encode()),
            ("Content-Length 1e3", b"1e3"),
            ("Content-Length +5", b"+5"),
        ):
            for route in (b"/execute", b"/upload"):
                raw = b"POST " + route + b" HTTP/1.1\r\nContent-Length: " + length + b"\r\n"
                raw += b"Content-Type: multipart/form-data; boundary=zz\r\n" + expect + b"\r\n{}"
                requests.append((f"{route.decode()} {name}{label}", raw))
        for boundary in (
            b"boundary*=utf-8''zz",
            b"boundary*=",
            b"boundary*=x",
            b"boundary*=rot13''zz",
            b"boundary*=utf-16''%ff",
            b"boundary*=utf-8'en'%C3%28",
            b"boundary*=unicode_escape''%5Cx",
            b"boundary*=idna''xn--",
            b"boundary*=punycode''%80",
        ):
            raw = upload_with(b"multipart/form-data; " + boundary)
            if expect:
                raw = raw.replace(b"\r\n\r\n", b"\r\n" + expect + b"\r\n", 1)
            requests.append((f"upload {boundary.decode()}{label}", raw))
    return requests


def send_raw(server: ServerProcess, data: bytes) -> int:
    """The status code of the reply to raw bytes (0: no reply at all)."""
    try:
        reply = server.raw(data)
    except OSError:
        return 0
    while reply.startswith(b"HTTP/1.1 100"):  # an interim 100 Continue: the real one follows
        reply = reply.partition(b"\r\n\r\n")[2]
    try:
        return int(reply.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


# -- the server as the verifier's checks meet it -------------------------------------------
PID_NAMESPACE = ("unshare", "--kill-child", "--pid", "--mount-proc")
SERVER_PYTHONPATH = "/opt/bsi-test/deps:/opt/bsi-test/deps-extra"


def start_server(workspace: Path) -> ServerProcess:
    """The runtime server in its own pid namespace, with a PYTHONPATH its children inherit."""
    workspace.mkdir()
    env = {**os.environ, "PYTHONPATH": SERVER_PYTHONPATH}
    return ServerProcess(workspace, env=env, prefix=PID_NAMESPACE)


def stop_server(process: ServerProcess) -> None:
    """SIGTERM to the server itself: `unshare --fork` does not pass signals on; it exits with it."""
    children = Path(f"/proc/{process.proc.pid}/task/{process.proc.pid}/children").read_text()
    for pid in children.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)
    process.stop()


def start_namespaced(workspace: Path) -> NamespacedServer:
    """The runtime server as in a container: its own pid namespace (so timeout-cleanup sees
    only its processes) and network namespace (the checks' requests come from outside, the
    commands' own connections from its loopback: the starve check needs both), with a
    PYTHONPATH its children inherit."""
    workspace.mkdir()
    env = {**os.environ, "PYTHONPATH": SERVER_PYTHONPATH}
    return NamespacedServer(workspace, env=env)


def sandbox_of(process: NamespacedServer) -> Sandbox:
    """The verifier's client for the server, from this side of its network."""
    return Sandbox(process.port, host=process.address, workspace=str(process.workspace))
