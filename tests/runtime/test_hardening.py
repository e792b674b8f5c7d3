"""Issue 9 (races, escaping processes, memory, malformed requests) and issue 13 (timed_out),
against the server subprocess run as the sandbox user (uid 65532) when the tests run as root."""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sandboxserver import (
    MIB,
    RaceLayout,
    ServerProcess,
    as_sandbox_user,
    daemon_patterns,
    flood,
    give_to_sandbox_user,
    hang_up,
    health_limit,
    malformed_requests,
    race,
    run_daemon_pattern,
    sandbox_dir,
    send_raw,
)
from support.waiting import wait_for

RACE_ATTEMPTS = 150

HEALTH_REQUEST = b"GET / HTTP/1.1\r\nHost: sandbox\r\n\r\n"


def execute(server: ServerProcess, payload: dict[str, object]) -> tuple[int, dict[str, object]]:
    status, _, body = server.request("POST", "/execute", json.dumps(payload).encode())
    return status, json.loads(body)


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    path = sandbox_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def hardened(base: Path) -> Iterator[ServerProcess]:
    workspace = base / "hardened-ws"
    workspace.mkdir()
    give_to_sandbox_user(workspace)
    server = ServerProcess(workspace, log=base / "hardened.log", **as_sandbox_user())
    yield server
    assert server.stop() == 0
    assert b"Traceback" not in server.log.read_bytes()


def test_symlink_swap_race_never_escapes(base: Path) -> None:
    """Item 1: a command swaps workspace/d with a symlink to outside while every route is
    hammered; nothing outside may be read, listed, probed, deleted, written or entered."""
    layout = RaceLayout(base / "race", victims=(RACE_ATTEMPTS + 1) // 2)
    user = as_sandbox_user()
    server = ServerProcess(layout.workspace, log=base / "race.log", **user)
    try:
        results = race(server, layout, RACE_ATTEMPTS, swapper_prefix=user.get("prefix", ()))
    finally:
        assert server.stop() == 0
    assert {route: escapes for route, (_, escapes) in results.items()} == dict.fromkeys(results, 0)
    assert b"Traceback" not in server.log.read_bytes()


@pytest.mark.parametrize("index", range(len(daemon_patterns("0"))))
def test_daemon_pattern_leaves_no_survivor(hardened: ServerProcess, index: int) -> None:
    """Item 2: whatever a command does with sessions, groups and forks, nothing survives it,
    and a detached process holding stdout does not delay the reply."""
    marker = str(secrets.randbelow(10**9))
    name, command, timeout = daemon_patterns(marker)[index]
    reply, elapsed, survivors = run_daemon_pattern(hardened, command, timeout, marker)
    assert survivors == [], name
    assert reply["exit_code"] == (124 if timeout < 5 else 0), (name, reply)
    assert elapsed < min(timeout, 5) + 3, (name, elapsed)
    assert reply["timed_out"] is (timeout < 5), name


def test_timed_out_field(sandbox_workspace: Path) -> None:
    """Issue 13: timed_out says whether the timeout struck; exit_code 124 then."""
    server = ServerProcess(sandbox_workspace)
    try:
        status, reply = execute(server, {"command": ["sleep", "30"], "timeout_seconds": 0.5})
        assert (status, reply["exit_code"], reply["timed_out"]) == (200, 124, True)
        status, reply = execute(server, {"command": ["sh", "-c", "exit 124"]})
        assert (status, reply["exit_code"], reply["timed_out"]) == (200, 124, False)
        status, reply = execute(server, {"command": "echo hi"})
        assert (reply["stdout"], reply["exit_code"], reply["timed_out"]) == ("hi\n", 0, False)
    finally:
        assert server.stop() == 0


def test_flood_memory_is_bounded(base: Path) -> None:
    """Item 3: 8 concurrent commands writing 2 x 10 MiB of 0xff: bounded server memory,
    truncated replies that say so, health answering throughout."""
    workspace = base / "flood-ws"
    workspace.mkdir()
    server = ServerProcess(workspace, log=base / "flood.log")
    limit = health_limit()
    try:
        figures = flood(server, concurrent=8)
    finally:
        assert server.stop() == 0
    assert figures["peak_rss"] < 256 * MIB, figures["peak_rss"]  # type: ignore[operator]
    assert figures["max_health_seconds"] < limit, (figures["max_health_seconds"], limit)  # type: ignore[operator]
    assert figures["reply_bytes"] <= 32 * MIB  # type: ignore[operator]
    for reply in figures["replies"]:  # type: ignore[attr-defined]
        assert reply["truncated"] == {"stdout": True, "stderr": True}
        assert (reply["exit_code"], reply["timed_out"]) == (0, False)


@pytest.mark.parametrize(
    ("name", "data"), malformed_requests(), ids=[name for name, _ in malformed_requests()]
)
def test_malformed_request_gets_an_answer(hardened: ServerProcess, name: str, data: bytes) -> None:
    """Item 4: a 4xx JSON error (the deep upload is simply valid), never a 500 or silence."""
    status = send_raw(hardened, data)
    if name.startswith("upload a/"):
        assert status == 200, name
        assert hardened.request("DELETE", "/files/a")[0] == 200
    elif "boundary*=utf-8''zz" in name:  # a valid RFC 2231 boundary: a valid upload
        assert status == 200, name
    else:
        assert 400 <= status < 500, (name, status)
    assert hardened.request("GET", "/")[0] == 200


def test_limits_connections_executes_and_slow_headers(base: Path) -> None:
    """Item 4 (connections, deadlines) and 3 (concurrent executes)."""
    workspace = base / "limits-ws"
    workspace.mkdir()
    flags = ("--max-connections", "4", "--max-executes", "1", "--max-queued", "0")
    server = ServerProcess(workspace, *flags, "--header-timeout", "1", log=base / "limits.log")
    try:
        # A slow-loris client is dropped at the header deadline.
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
            slow.sendall(b"GET / HTTP/1.1\r\n")
            with pytest.raises(OSError):
                for _ in range(40):
                    time.sleep(0.2)
                    slow.sendall(b"X-Slow: 1\r\n")
                    if not slow.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                        raise ConnectionResetError("closed")
        assert time.monotonic() - start < 5
        # Over the connection cap: a 503 from the gate, which waits half a second for a
        # GET / it would answer, with no request sent.
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
        # Accepted in the order they connected: once a later health probe is answered by the
        # gate, the four hold every connection slot.
        wait_for(
            lambda: b"every connection slot is taken" in server.raw(HEALTH_REQUEST),
            deadline_s=30,
            what="the four connections to be served",
        )
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
            started = time.monotonic()
            assert extra.recv(65536).startswith(b"HTTP/1.1 503 ")  # before any request
            assert time.monotonic() - started < 2
        for sock in idle:
            hang_up(sock)  # their slots given back
        # One execute at a time, none queued: the second gets a 429 with Retry-After.
        hold = ["sh", "-c", ": > running; until [ -e release ]; do sleep 0.01; done"]
        thread = threading.Thread(target=execute, args=(server, {"command": hold}), daemon=True)
        thread.start()
        wait_for((workspace / "running").exists, deadline_s=30, what="the first command to start")
        status, headers, _ = server.request(
            "POST", "/execute", json.dumps({"command": "true"}).encode()
        )
        assert (status, headers.get("Retry-After")) == (429, "1")
        (workspace / "release").touch()
        thread.join()
        assert execute(server, {"command": "true"})[0] == 200
    finally:
        assert server.stop() == 0
