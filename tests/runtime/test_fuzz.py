"""Hostile-input fuzzing of the sandbox runtime server: no path escapes, no process survives.

Deterministic (fixed seed). A canary file and a canary directory live next to the workspace;
symlinks inside the workspace point at them, at / and at their parent. Ten thousand generated
paths go through every file route; afterwards nothing outside the workspace may have been read,
changed, created or deleted, and the server must never have answered 500.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import secrets
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.sandboxserver import ServerProcess, multipart, processes_with

SEED = 20240611
PATH_COUNT = 10_000
ALLOWED = {200, 400, 403, 404, 405, 409, 413}  # 409: a delete raced a concurrent upload
TOKEN = secrets.token_hex(6)  # in every uploaded name, to find anything created outside
SECRET = f"CANARY-{secrets.token_hex(12)}"
INNER = f"inner-{secrets.token_hex(6)}.txt"  # a name only a listing of the canary dir reveals


class Server(ServerProcess):
    """The server as a subprocess; each client thread keeps one keep-alive connection."""

    def __init__(self, workspace: Path, *flags: str, log: Path) -> None:
        super().__init__(workspace, *flags, log=log)
        self._local = threading.local()

    def connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = super().connection()
        return conn

    def release(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        if response.will_close:
            conn.close()

    def execute(self, payload: dict[str, Any]) -> dict[str, Any]:
        status, _, body = self.request("POST", "/execute", json.dumps(payload).encode())
        assert status == 200, body
        return json.loads(body)


def snapshot(root: Path, skip: Path) -> dict[str, str]:
    """Every path under ``root`` except ``skip``, with a digest of each regular file."""
    seen: dict[str, str] = {}
    for directory, dirs, files in os.walk(root):
        if Path(directory) == skip or skip in Path(directory).parents:
            dirs.clear()
            continue
        for name in dirs + files:
            path = Path(directory, name)
            if path == skip:
                continue
            if path.is_file() and not path.is_symlink():
                seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                seen[str(path)] = "dir-or-link"
    return seen


class Layout:
    """The workspace, the canaries beside it and the hostile symlinks inside it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.workspace = base / "workspace"
        self.canary = base / "canary.txt"
        self.canary_dir = base / "canary_dir"
        self.workspace.mkdir()
        self.canary.write_text(SECRET)
        self.canary_dir.mkdir()
        (self.canary_dir / INNER).write_text(SECRET)
        self.restore()

    def restore(self) -> None:
        """Re-create what fuzzed deletes may legitimately remove inside the workspace."""
        links = {
            "ln_file": self.canary,
            "ln_dir": self.canary_dir,
            "ln_root": Path("/"),
            "ln_parent": Path(".."),
            "ln_rel_canary": Path("../canary.txt"),
            "chain1": Path("chain2"),
            "chain2": self.canary_dir,
            "loop_a": Path("loop_b"),
            "loop_b": Path("loop_a"),
            "ok/ln_up": Path("../.."),
        }
        (self.workspace / "ok" / "sub").mkdir(parents=True, exist_ok=True)
        (self.workspace / "ok" / "f.txt").write_text("inside")
        for name, target in links.items():
            link = self.workspace / name
            if not link.is_symlink():
                if link.is_dir():
                    shutil.rmtree(link)
                elif link.exists():
                    link.unlink()
                link.symlink_to(target)


ATOMS = [
    "..", "%2e%2e", "%2E%2E", ".%2e", "%2e.", "%252e%252e", "...", ".", "", "%2e",
    "ln_file", "ln_dir", "ln_root", "ln_parent", "ln_rel_canary", "chain1", "loop_a", "ok",
    "ln_up", "f.txt", "sub", "canary.txt", "canary_dir", INNER, "etc", "passwd", "workspace",
    "%00", "\x00", "a%00b", "%2500", "\\", "%5C", "%5c..", "..\\..", "%c0%ae%c0%ae", "%ff",
    "%C3%A9", "é", "😀", "%F0%9F%98%80", "\u202e", "%E2%80%AE", "~", "$HOME", "*", "?", "#",
    ";", " ", "%20", "%0A", "%0D", "\t", "x" * 300, "y" * 4000, "..%2F", "..%252F", "%2e%2e%2f",
    "%u002e", "..;", "CON", "nul", ".upload-x",
]  # fmt: skip
SEPARATORS = ["/", "/", "/", "%2F", "%2f", "%252F", "\\", "%5C", "//", "/./"]


def prefixes(layout: Layout) -> list[str]:
    outside = quote(str(layout.base), safe="")
    return [
        "", "", "", "", "/", "%2F", "//", "/etc/passwd", "%2Fetc%2Fpasswd", "/proc/self/root",
        "%2Fproc%2Fself%2Froot", str(layout.canary), quote(str(layout.canary), safe=""),
        str(layout.workspace) + "/..", quote(str(layout.workspace), safe="") + "%2F..",
        str(layout.workspace) + "/ln_dir", outside, "%252Fetc", "file:", "http://x/",
    ]  # fmt: skip


def plausible_atoms(layout: Layout) -> list[str]:
    """Names with no forbidden character: these get past the lexical checks, so they test
    symlink resolution (the symlinks, the canaries' names, the workspace's own names)."""
    return [
        "ln_file", "ln_dir", "ln_root", "ln_parent", "ln_rel_canary", "chain1", "chain2",
        "loop_a", "ok", "ln_up", "sub", "f.txt", "canary.txt", "canary_dir", INNER, "etc",
        "passwd", "workspace", layout.base.name, ".", "é", "%C3%A9", "%2e",
    ]  # fmt: skip


def hostile_paths(layout: Layout, count: int) -> list[str]:
    """Distinct deterministic hostile paths, as they appear (percent-encoded) after the route.

    Half are chaotic mixes of traversal tricks; half are plausible chains of symlink names."""
    rng = random.Random(SEED)
    heads = prefixes(layout)
    plausible = plausible_atoms(layout)
    inside = [str(layout.workspace) + "/", quote(str(layout.workspace) + "/", safe="")]
    paths: dict[str, None] = {}
    while len(paths) < count:
        if rng.random() < 0.5:
            path = rng.choice(heads)
            for _ in range(rng.randint(1, 6)):
                path += rng.choice(SEPARATORS) + rng.choice(ATOMS)
            path = path.lstrip("/") if rng.random() < 0.3 else path
        else:
            parts = [rng.choice(plausible) for _ in range(rng.randint(1, 4))]
            path = rng.choice(["", "", "", *inside])
            for index, part in enumerate(parts):
                separator = rng.choice(["/", "/", "%2F", "%2f", "//", "/./"])
                path += part if index == 0 else separator + part
        paths[path] = None
    return list(paths)


def to_url(path: str) -> str:
    """Make a path sendable on a request line; existing %XX sequences are kept as they are."""
    return quote(path, safe="/%:@!$&'()*+,;=~")


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    return Layout(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module")
def server(layout: Layout, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("fuzzlog") / "server.log"  # outside the watched tree
    # One client running up to 50 commands at once: its share raised from the default 16.
    flags = ("--max-upload", "65536", "--max-executes-per-source", "64")
    running = Server(layout.workspace, *flags, log=log)
    yield running
    assert running.stop() == 0
    assert b"Traceback" not in running.log.read_bytes()


def send(server: Server, op: str, path: str) -> tuple[int, bytes]:
    if op == "upload":
        # No Content-Type header on the part itself, unlike the contract tests' uploads.
        body, content_type = multipart(f"{path}{TOKEN}", b"fuzz", content_type=None)
        status, _, data = server.request("POST", "/upload", body, {"Content-Type": content_type})
        return status, data
    method, route = {
        "download": ("GET", "download"),
        "list": ("GET", "list"),
        "exists": ("GET", "exists"),
        "delete": ("DELETE", "files"),
    }[op]
    status, _, data = server.request(method, f"/{route}/{to_url(path)}")
    return status, data


def test_hostile_paths_never_escape(server: Server, layout: Layout) -> None:
    paths = hostile_paths(layout, PATH_COUNT)
    assert len(set(paths)) == PATH_COUNT
    ops = ["download", "list", "exists", "delete", "upload"]
    before = snapshot(layout.base, skip=layout.workspace)
    statuses: Counter[int] = Counter()
    leaks: list[tuple[str, str, int]] = []

    def probe(index: int) -> None:
        op, path = ops[index % len(ops)], paths[index]
        status, body = send(server, op, path)
        statuses[status] += 1
        # Uploads only ever create files whose names end in TOKEN: a *file* named INNER can
        # only be the canary directory's own.
        listed = (
            op == "list"
            and status == 200
            and (INNER, "file") in {(entry["name"], entry["type"]) for entry in json.loads(body)}
        )
        if status not in ALLOWED or SECRET.encode() in body or listed:
            leaks.append((op, path, status))

    start = time.monotonic()
    batch = 1000
    for offset in range(0, PATH_COUNT, batch):
        layout.restore()  # fuzzed deletes may remove the workspace's symlinks: keep them there
        with ThreadPoolExecutor(max_workers=12) as pool:
            list(pool.map(probe, range(offset, min(offset + batch, PATH_COUNT))))
    elapsed = time.monotonic() - start

    assert leaks == [], leaks[:20]
    assert sum(statuses.values()) == PATH_COUNT
    assert statuses[403] > 0.3 * PATH_COUNT, statuses  # the fuzz really was hostile
    assert statuses[200] > 0, statuses  # and some of it was harmless, and served
    assert layout.canary.read_text() == SECRET
    assert [p.name for p in layout.canary_dir.iterdir()] == [INNER]
    assert snapshot(layout.base, skip=layout.workspace) == before
    for place in (Path("/"), Path("/etc"), Path("/tmp"), layout.base.parent, layout.base):
        assert not [p for p in place.iterdir() if TOKEN in p.name], place
    assert layout.workspace.is_dir()
    assert elapsed < 60


def test_raw_garbage_never_crashes(server: Server) -> None:
    rng = random.Random(SEED)
    alphabet = b"GETPOSDLU /%.\\\x00\r\n:HTTP/1.1-Content-Length0123456789abc\xff{}\"'"
    codes: Counter[int] = Counter()
    for _ in range(300):
        junk = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        if rng.random() < 0.5:
            junk = rng.choice([b"GET /", b"POST /execute", b"DELETE /files/"]) + junk
        reply = server.raw(junk + b"\r\n\r\n")
        if reply:
            code = int(reply.split(b" ", 2)[1])
            codes[code] += 1
            assert code != 500 and 200 <= code < 600, reply[:200]
    assert codes, "no request was answered at all"
    assert server.request("GET", "/")[0] == 200


def test_timeouts_leave_no_process(server: Server) -> None:
    marker = str(secrets.randbelow(10**9))
    scripts = [
        ["sh", "-c", f"sleep 1000.{marker} & sleep 1000.{marker}"],
        ["sh", "-c", f"(sleep 1000.{marker} &) ; (trap '' TERM; sleep 1000.{marker})"],
        [
            sys.executable,
            "-c",
            "import os, time, sys\n"
            "for _ in range(3):\n"
            "    if os.fork() == 0:\n"
            "        os.execvp('sleep', ['sleep', sys.argv[1]])\n"
            "time.sleep(1000)",
            f"1000.{marker}",
        ],
    ]

    def timed_out(index: int) -> dict[str, Any]:
        return server.execute({"command": scripts[index % len(scripts)], "timeout_seconds": 0.2})

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(timed_out, range(100)))
    assert time.monotonic() - start < 30
    assert Counter(r["exit_code"] for r in results) == {124: 100}
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_concurrent_executes_complete(server: Server) -> None:
    def run(index: int) -> dict[str, Any]:
        return server.execute({"command": ["sh", "-c", 'sleep 0.5; echo "$1"', "sh", str(index)]})

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(run, range(50)))
    assert [r["stdout"] for r in results] == [f"{i}\n" for i in range(50)]
    assert [r["exit_code"] for r in results] == [0] * 50
    assert time.monotonic() - start < 20


def test_health_after_everything(server: Server) -> None:
    status, _, body = server.request("GET", "/")
    assert (status, body) == (200, b'{"status": "ok"}')
