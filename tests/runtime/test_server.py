"""The sandbox runtime server, driven as a real subprocess over HTTP (its runtime contract)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.sandboxserver import ServerProcess, multipart, proc_stat, processes_with


class Sandbox(ServerProcess):
    """The server with JSON, upload and execute helpers for the contract tests."""

    def json(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        body = None if payload is None else json.dumps(payload).encode()
        status, _, data = self.request(method, path, body, {"Content-Type": "application/json"})
        return status, json.loads(data)

    def execute(self, command: Any, **fields: Any) -> dict[str, Any]:
        status, body = self.json("POST", "/execute", {"command": command, **fields})
        assert status == 200, body
        return body

    def upload(self, filename: str, data: bytes) -> tuple[int, Any]:
        body, content_type = multipart(filename, data)
        status, _, raw = self.request("POST", "/upload", body, {"Content-Type": content_type})
        return status, json.loads(raw)


def enc(path: str) -> str:
    """Percent-encode a path the way the upstream client does (``/`` becomes ``%2F``)."""
    return quote(path, safe="")


def children(parent: int) -> list[tuple[int, str]]:
    """(pid, state) of the processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                state, ppid = proc_stat(entry.name)
                if ppid == parent:
                    found.append((int(entry.name), state))
    return found


def wait_gone(marker: str, seconds: float = 5.0) -> list[int]:
    """Processes still carrying ``marker`` after a short grace for SIGKILL to land."""
    deadline = time.monotonic() + seconds
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sandbox")
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP-SECRET-OUTSIDE")
    pypath = base / "pypath"
    pypath.mkdir()
    (pypath / "sbx_probe_mod.py").write_text("VALUE = 'probe-from-pythonpath'\n")
    # A module that would break the server if PYTHONPATH leaked into it (it runs with -I).
    (pypath / "json.py").write_text("SHADOW = 'shadowed'\n")
    workspace = base / "workspace"
    workspace.mkdir()
    return {"base": base, "outside": outside, "pypath": pypath, "workspace": workspace}


@pytest.fixture(scope="module")
def sandbox(layout: dict[str, Path]) -> Iterator[Sandbox]:
    env = dict(os.environ, PYTHONPATH=str(layout["pypath"]), SBX_SERVER_ONLY="from-server")
    server = Sandbox(layout["workspace"], env=env)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    workspace = tmp_path_factory.mktemp("small") / "workspace"
    server = Sandbox(workspace, "--max-upload", "4096", "--max-output", "1000")
    yield server
    assert server.stop() == 0


def test_health(sandbox: Sandbox) -> None:
    status, headers, body = sandbox.request("GET", "/")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"status": "ok"}


def test_execute_string_is_split_like_words(sandbox: Sandbox) -> None:
    result = sandbox.execute("printf '%s|' 'a b' c")
    assert result == {
        "stdout": "a b|c|",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
        "truncated": {"stdout": False, "stderr": False},
    }


def test_execute_list_is_argv(sandbox: Sandbox) -> None:
    result = sandbox.execute([sys.executable, "-c", "import sys; print(sys.argv[1:])", "x y", "$Z"])
    assert result["stdout"] == "['x y', '$Z']\n"
    assert result["exit_code"] == 0


def test_no_shell_no_expansion(sandbox: Sandbox) -> None:
    assert sandbox.execute("echo $HOME")["stdout"] == "$HOME\n"
    assert sandbox.execute("echo a; echo b")["stdout"] == "a; echo b\n"
    assert sandbox.execute("echo *")["stdout"] == "*\n"


def test_exit_codes_and_stderr(sandbox: Sandbox) -> None:
    code = "import sys; sys.stderr.write('bad'); sys.exit(3)"
    result = sandbox.execute([sys.executable, "-c", code])
    assert (result["stderr"], result["exit_code"]) == ("bad", 3)
    assert sandbox.execute(["sh", "-c", "exit 7"])["exit_code"] == 7
    assert sandbox.execute(["sh", "-c", "kill -9 $$"])["exit_code"] == 128 + 9


def test_command_not_found_is_127(sandbox: Sandbox) -> None:
    result = sandbox.execute("no-such-command-xyz --flag")
    assert result["exit_code"] == 127
    assert "no-such-command-xyz" in result["stderr"]


def test_not_executable_is_126(sandbox: Sandbox) -> None:
    assert sandbox.upload("plain.txt", b"not a program")[0] == 200
    result = sandbox.execute("./plain.txt")
    assert result["exit_code"] == 126
    assert result["stderr"]


def test_env_merged_and_pythonpath_reaches_children(sandbox: Sandbox) -> None:
    code = (
        "import os, json, sbx_probe_mod;"
        "print(os.environ['SBX_VAR'], os.environ['SBX_SERVER_ONLY'], sbx_probe_mod.VALUE,"
        " json.SHADOW)"
    )
    result = sandbox.execute(["python3", "-c", code], env={"SBX_VAR": "from-request"})
    assert result["stdout"] == "from-request from-server probe-from-pythonpath shadowed\n"
    overridden = sandbox.execute(
        ["sh", "-c", 'echo "$SBX_SERVER_ONLY"'], env={"SBX_SERVER_ONLY": "x"}
    )
    assert overridden["stdout"] == "x\n"


def test_cwd_default_relative_and_absolute(sandbox: Sandbox) -> None:
    root = os.path.realpath(sandbox.workspace)
    assert sandbox.upload("sub/dir/f.txt", b"x")[0] == 200
    assert sandbox.execute("pwd")["stdout"] == f"{root}\n"
    assert sandbox.execute("pwd", cwd="sub/dir")["stdout"] == f"{root}/sub/dir\n"
    absolute = str(sandbox.workspace / "sub")
    assert sandbox.execute("pwd", cwd=absolute)["stdout"] == f"{root}/sub\n"


@pytest.mark.parametrize(
    "cwd", ["..", "../outside", "/etc", "/", "sub/../..", "out_link", "a\\..\\.."]
)
def test_cwd_escape_refused(sandbox: Sandbox, layout: dict[str, Path], cwd: str) -> None:
    link = sandbox.workspace / "out_link"
    if not link.is_symlink():
        link.symlink_to(layout["outside"])
    status, body = sandbox.json("POST", "/execute", {"command": "pwd", "cwd": cwd})
    assert status == 403, body


def test_cwd_missing_or_file(sandbox: Sandbox) -> None:
    assert sandbox.json("POST", "/execute", {"command": "pwd", "cwd": "nope"})[0] == 404
    assert sandbox.upload("cwd_file", b"")[0] == 200
    assert sandbox.json("POST", "/execute", {"command": "pwd", "cwd": "cwd_file"})[0] == 400


def test_timeout_kills_whole_group(sandbox: Sandbox) -> None:
    marker = str(secrets.randbelow(10**9))
    script = f"sleep 1000.{marker} & (sleep 1000.{marker} &) ; sleep 1000.{marker}"
    start = time.monotonic()
    result = sandbox.execute(["sh", "-c", script], timeout_seconds=1)
    assert time.monotonic() - start < 10
    assert result["exit_code"] == 124
    assert "timed out" in result["stderr"]
    assert wait_gone(marker) == []


def test_timeout_keeps_output_so_far(sandbox: Sandbox) -> None:
    code = "import time; print('partial', flush=True); time.sleep(100)"
    result = sandbox.execute([sys.executable, "-c", code], timeout_seconds=1)
    assert (result["stdout"], result["exit_code"]) == ("partial\n", 124)


def test_background_children_do_not_outlive_the_command(sandbox: Sandbox) -> None:
    marker = str(secrets.randbelow(10**9))
    start = time.monotonic()
    result = sandbox.execute(
        ["sh", "-c", f"sleep 1000.{marker} & echo started"], timeout_seconds=60
    )
    assert time.monotonic() - start < 10
    assert (result["stdout"], result["exit_code"]) == ("started\n", 0)
    assert wait_gone(marker) == []


@pytest.mark.parametrize("timeout", [0, -1, "5", True, float("nan"), float("inf"), [1]])
def test_bad_timeout_is_400(sandbox: Sandbox, timeout: Any) -> None:
    status, body = sandbox.json("POST", "/execute", {"command": "true", "timeout_seconds": timeout})
    assert status == 400, body


@pytest.mark.parametrize("timeout", [10**12, 10**400, 1e300])
def test_huge_timeout_is_capped_not_refused(sandbox: Sandbox, timeout: float) -> None:
    assert sandbox.execute("true", timeout_seconds=timeout)["exit_code"] == 0


@pytest.mark.parametrize(
    "payload",
    [
        [1, 2],
        "just a string",
        {},
        {"command": 5},
        {"command": ["ls", 5]},
        {"command": ""},
        {"command": []},
        {"command": "echo 'unbalanced"},
        {"command": ["echo", "nul\x00byte"]},
        {"command": "true", "env": ["A=1"]},
        {"command": "true", "env": {"A": 1}},
        {"command": "true", "env": {"A=B": "1"}},
        {"command": "true", "cwd": 7},
    ],
)
def test_bad_execute_request_is_400(sandbox: Sandbox, payload: Any) -> None:
    status, body = sandbox.json("POST", "/execute", payload)
    assert status == 400, body
    assert "error" in body


def test_invalid_json_is_400(sandbox: Sandbox) -> None:
    for body in (b"{not json", b"\xff\xfe", b"[" * 100000):
        status, _, data = sandbox.request("POST", "/execute", body)
        assert status == 400, data


def test_output_is_bounded(small: Sandbox) -> None:
    result = small.execute([sys.executable, "-c", "print('x' * 5000)"])
    assert result["stdout"] == "x" * 1000
    assert "stdout truncated" in result["stderr"]
    assert result["exit_code"] == 0


def test_file_round_trip(sandbox: Sandbox) -> None:
    payload = bytes(range(256)) * 64
    before = time.time()
    status, body = sandbox.upload("deep/er/file.bin", payload)
    assert (status, body) == (200, {"path": "deep/er/file.bin", "size": len(payload)})

    status, listing = sandbox.json("GET", "/list/" + enc("deep/er"))
    assert status == 200
    [entry] = listing
    assert entry["name"] == "file.bin"
    assert (entry["size"], entry["type"]) == (len(payload), "file")
    assert isinstance(entry["mod_time"], float)
    assert before - 5 <= entry["mod_time"] <= time.time() + 5
    status, listing = sandbox.json("GET", "/list/deep")
    assert {"name": "er", "type": "directory"}.items() <= listing[0].items()

    assert sandbox.json("GET", "/exists/" + enc("deep/er/file.bin")) == (
        200,
        {"path": "deep/er/file.bin", "exists": True},
    )
    status, headers, data = sandbox.request("GET", "/download/" + enc("deep/er/file.bin"))
    assert (status, data) == (200, payload)
    assert headers["Content-Type"] == "application/octet-stream"

    assert sandbox.upload("deep/er/file.bin", b"replaced")[0] == 200
    assert sandbox.request("GET", "/download/" + enc("deep/er/file.bin"))[2] == b"replaced"

    assert sandbox.json("DELETE", "/files/deep")[0] == 200
    assert sandbox.json("GET", "/exists/" + enc("deep/er/file.bin"))[1]["exists"] is False
    assert not (sandbox.workspace / "deep").exists()
    assert sandbox.json("DELETE", "/files/deep")[0] == 404


def test_unicode_and_spaces_in_paths(sandbox: Sandbox) -> None:
    name = "dir with space/ünï cödé 😀.txt"
    assert sandbox.upload(name, b"u")[1]["path"] == name
    assert sandbox.request("GET", "/download/" + enc(name))[:3:2] == (200, b"u")
    assert sandbox.json("GET", "/exists/" + enc(name))[1] == {"path": name, "exists": True}


def test_upload_absolute_path_inside_workspace(sandbox: Sandbox) -> None:
    status, body = sandbox.upload(str(sandbox.workspace / "abs.txt"), b"a")
    assert (status, body["path"]) == (200, "abs.txt")


def test_list_root_forms(sandbox: Sandbox) -> None:
    assert sandbox.upload("rootfile.txt", b"r")[0] == 200
    for path in ("/list", "/list/", "/list/" + enc(str(sandbox.workspace))):
        status, listing = sandbox.json("GET", path)
        assert status == 200, path
        assert "rootfile.txt" in {entry["name"] for entry in listing}


def test_missing_is_404(sandbox: Sandbox) -> None:
    for method, route in (("GET", "download"), ("GET", "list"), ("DELETE", "files")):
        assert sandbox.request(method, f"/{route}/" + enc("missing/thing"))[0] == 404
    assert sandbox.json("GET", "/exists/missing")[1] == {"path": "missing", "exists": False}


def test_wrong_kind_is_400(sandbox: Sandbox) -> None:
    assert sandbox.upload("kind/f.txt", b"f")[0] == 200
    assert sandbox.request("GET", "/download/kind")[0] == 400
    assert sandbox.request("GET", "/list/" + enc("kind/f.txt"))[0] == 400
    assert sandbox.upload("kind", b"over a directory")[0] == 400
    assert sandbox.upload("kind/f.txt/below", b"under a file")[0] == 400


def test_delete_root_refused(sandbox: Sandbox) -> None:
    for path in ("/files/", "/files", "/files/.", "/files/" + enc(str(sandbox.workspace))):
        assert sandbox.request("DELETE", path)[0] == 403, path
    assert sandbox.workspace.is_dir()


TRAVERSALS = [
    "..%2F..%2Foutside%2Fsecret.txt",
    "%2e%2e%2Foutside%2Fsecret.txt",
    "%2E%2E/outside/secret.txt",
    "..",
    "a/../../outside/secret.txt",
    "%2Fetc%2Fpasswd",
    "/etc/passwd",
    "..%5Coutside%5Csecret.txt",
    "a%5C..%5C..%5Coutside",
    "%00",
    "ok%00.txt",
    "out_link%2Fsecret.txt",
    "out_link",
    "file_link",
]


@pytest.mark.parametrize("route", ["download", "list", "exists"])
@pytest.mark.parametrize("path", TRAVERSALS)
def test_traversal_refused(
    sandbox: Sandbox, layout: dict[str, Path], route: str, path: str
) -> None:
    make_links(sandbox.workspace, layout["outside"])
    status, _, body = sandbox.request("GET", f"/{route}/{path}")
    assert status == 403, (status, body)
    assert b"TOP-SECRET" not in body


@pytest.mark.parametrize("path", ["%252e%252e%252Foutside%252Fsecret.txt", "..%252F..%252Fetc"])
def test_double_encoding_is_a_literal_name(sandbox: Sandbox, path: str) -> None:
    assert sandbox.request("GET", f"/download/{path}")[0] == 404
    expected = {"path": path.replace("%25", "%"), "exists": False}
    assert sandbox.json("GET", f"/exists/{path}") == (200, expected)


@pytest.mark.parametrize(
    "path", ["..%2Foutside%2Fsecret.txt", "%2Fetc%2Fpasswd", "out_link%2Fsecret.txt", "%00"]
)
def test_delete_traversal_refused(sandbox: Sandbox, layout: dict[str, Path], path: str) -> None:
    make_links(sandbox.workspace, layout["outside"])
    assert sandbox.request("DELETE", f"/files/{path}")[0] == 403
    assert (layout["outside"] / "secret.txt").read_text() == "TOP-SECRET-OUTSIDE"


def test_delete_symlink_removes_only_the_link(sandbox: Sandbox, layout: dict[str, Path]) -> None:
    make_links(sandbox.workspace, layout["outside"])
    assert sandbox.request("DELETE", "/files/out_link")[0] == 200
    assert sandbox.request("DELETE", "/files/file_link")[0] == 200
    assert not (sandbox.workspace / "out_link").is_symlink()
    assert (layout["outside"] / "secret.txt").read_text() == "TOP-SECRET-OUTSIDE"


@pytest.mark.parametrize(
    "filename",
    ["../escape.txt", "/tmp/escape.txt", "out_link/new.txt", "file_link", "a\\b", "x\x00y"],
)
def test_upload_traversal_refused(sandbox: Sandbox, layout: dict[str, Path], filename: str) -> None:
    make_links(sandbox.workspace, layout["outside"])
    before = sorted(p.name for p in layout["base"].iterdir())
    status, body = sandbox.upload(filename, b"PWNED")
    assert status == 403, body
    assert sorted(p.name for p in layout["base"].iterdir()) == before
    assert sorted(p.name for p in layout["outside"].iterdir()) == ["secret.txt"]
    assert (layout["outside"] / "secret.txt").read_text() == "TOP-SECRET-OUTSIDE"
    assert not Path("/tmp/escape.txt").exists()


def make_links(workspace: Path, outside: Path) -> None:
    """Symlinks inside the workspace that point out of it (re-made: some tests delete them)."""
    for name, target in (("out_link", outside), ("file_link", outside / "secret.txt")):
        if not (workspace / name).is_symlink():
            (workspace / name).symlink_to(target)


def test_unknown_route_404(sandbox: Sandbox) -> None:
    for path in ("/nope", "/download%2Fx", "/executes", "/listx", "/upload/x"):
        assert sandbox.request("GET", path)[0] == 404, path


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/execute", "POST"),
        ("PUT", "/upload", "POST"),
        ("POST", "/download/x", "GET, HEAD"),
        ("DELETE", "/list/", "GET, HEAD"),
        ("GET", "/files/x", "DELETE"),
        ("POST", "/", "GET, HEAD"),
    ],
)
def test_wrong_method_405(sandbox: Sandbox, method: str, path: str, allowed: str) -> None:
    status, headers, body = sandbox.request(method, path, b"{}")
    assert status == 405
    assert headers["Allow"] == allowed
    assert "error" in json.loads(body)


def test_oversize_upload_413_and_server_survives(small: Sandbox) -> None:
    status, body = small.upload("big.bin", b"x" * 8192)
    assert status == 413, body
    assert not (small.workspace / "big.bin").exists()
    assert small.upload("fits.bin", b"x" * 1024) == (200, {"path": "fits.bin", "size": 1024})
    assert small.request("GET", "/")[0] == 200


@pytest.mark.parametrize("expect", [b"", b"Expect: 100-continue\r\n"])
def test_oversize_refused_before_the_body_is_sent(small: Sandbox, expect: bytes) -> None:
    head = (
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
        b"Content-Length: 1000000000000\r\n" + expect + b"\r\n"
    )
    with socket.create_connection(("127.0.0.1", small.port), timeout=10) as sock:
        sock.sendall(head)  # and never the body: the answer must come anyway
        response = sock.recv(65536)
    assert response.startswith(b"HTTP/1.1 413")


def upload_request(body: bytes) -> bytes:
    """A raw upload request with boundary ``zz`` and a correct Content-Length."""
    head = "POST /upload HTTP/1.1\r\nContent-Type: multipart/form-data; boundary=zz\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /\r\n\r\n", 400),
        (b"GET / HTTP/9.9\r\n\r\n", 505),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"BREW / HTTP/1.1\r\n\r\n", 405),
        (b"BREW /nowhere HTTP/1.1\r\n\r\n", 404),
        (b"POST /execute HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
        (b"POST /execute HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400),
        (b"POST /execute HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"POST /execute HTTP/1.1\r\n\r\n", 411),
        (b"POST /execute HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", 413),
        (b'POST /execute HTTP/1.1\r\nContent-Length: 50\r\n\r\n{"comm', 400),
        (b"POST /upload HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi", 400),
        (upload_request(b"--zz\r\nContent-Disposition: form"), 400),
        (
            upload_request(b'--zz\r\nContent-Disposition: form-data; name="x"\r\n\r\nv\r\n--zz--'),
            400,
        ),
        (
            upload_request(
                b'--zz\r\nContent-Disposition: form-data; name="file"\r\n\r\nv\r\n--zz--'
            ),
            400,
        ),
        (upload_request(b"no delimiter at all"), 400),
        (b"GET /download/%ff%fe HTTP/1.1\r\n\r\n", 400),
    ],
)
def test_malformed_requests_answered_without_crash(
    sandbox: Sandbox, request_bytes: bytes, expected: int
) -> None:
    response = sandbox.raw(request_bytes)
    assert response.split(b"\r\n", 1)[0].split(b" ")[1] == str(expected).encode(), response[:300]
    assert b"Content-Type: application/json" in response
    assert sandbox.request("GET", "/")[0] == 200


def test_head_health(sandbox: Sandbox) -> None:
    status, headers, body = sandbox.request("HEAD", "/")
    assert (status, body) == (200, b"")
    assert int(headers["Content-Length"]) > 0


def test_concurrent_executes_overlap(tmp_path: Path) -> None:
    """50 at once from one client: 32 run, the rest queue (its share raised from the default
    16, which tests/runtime/test_sources.py covers)."""
    sandbox = Sandbox(tmp_path / "workspace", "--max-executes-per-source", "50")
    try:
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=50) as pool:
            results = list(pool.map(lambda _: sandbox.execute(["sleep", "1"]), range(50)))
        assert [r["exit_code"] for r in results] == [0] * 50
        assert time.monotonic() - start < 25
    finally:
        assert sandbox.stop() == 0


def test_sigterm_stops_server_and_running_commands(tmp_path: Path) -> None:
    server = Sandbox(tmp_path / "workspace")
    marker = str(secrets.randbelow(10**9))
    payload = json.dumps({"command": f"sleep 1000.{marker}", "timeout_seconds": 600}).encode()

    def run_forever() -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):
            server.request("POST", "/execute", payload)

    thread = threading.Thread(target=run_forever, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker), "the command never started"
    assert server.stop() == 0
    assert wait_gone(marker) == []


def test_as_pid_1_orphaned_grandchildren_are_reaped(tmp_path: Path) -> None:
    """In a container the server is PID 1 and inherits orphans: their zombies must not pile up."""
    server = Sandbox(tmp_path / "workspace", prefix=("unshare", "--fork", "--pid", "--mount-proc"))
    try:
        [(server_pid, _)] = children(server.proc.pid)
        script = "(sleep 0.1 &) ; (sleep 0.1 &) ; (true &) ; echo ok"
        for _ in range(3):
            assert server.execute(["sh", "-c", script])["stdout"] == "ok\n"
        deadline = time.monotonic() + 5
        while (zombies := [p for p, s in children(server_pid) if s == "Z"]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert zombies == []
        assert server.request("GET", "/")[0] == 200
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signal.SIGTERM)
        assert server.stop() == 0
