"""Issue 23: the control plane answers whatever the sandbox's own code does.

The server runs in its own network namespace (`NamespacedServer`): the tests' requests come
from two outside addresses (two sources), and code run on the server's side reaches it on
loopback, one source, as code in a sandbox does. Per-source shares of connections and commands,
GET / answered (honestly) from the accept path when a limit is reached, and every command's
oom_score_adj at 1000 while the server keeps its own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sandboxserver import (
    NamespacedServer,
    ServerProcess,
    hang_up,
    health_limit,
    processes_with,
)
from support.waiting import wait_for

from builder.verify.hardened.starve import ATTACK

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

FULL_REQUEST = b"GET /exists/x HTTP/1.1\r\nHost: sandbox\r\n\r\n"
HEALTH_REQUEST = b"GET / HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n"
# Opens N connections to the server's port, on the addresses given in turn (loopback unless
# told), sends a whole request on each, prints the status each got (200, or 503 from the gate),
# keeping them all open until it is done.
SHARE = """
import json, socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
hosts = sys.argv[3].split(",") if len(sys.argv) > 3 else ["127.0.0.1"]
socks, statuses = [], []
for index in range(count):
    sock = socket.create_connection((hosts[index % len(hosts)], port), timeout=10)
    sock.sendall(b"GET /exists/x HTTP/1.1\\r\\nHost: sandbox\\r\\n\\r\\n")
    statuses.append(int(sock.recv(4096).split(b" ", 2)[1]))
    socks.append(sock)
print(json.dumps(statuses))
"""


def status_of(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the whole head of the answer on `sock`."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def ask(server: NamespacedServer, source: str, request: bytes) -> tuple[int, bytes, float]:
    """One request on a new connection from `source`: status, answer head, seconds taken."""
    started = time.monotonic()
    with server.connect_from(source) as sock:
        sock.sendall(request)
        status, head = status_of(sock)
    return status, head, time.monotonic() - started


def whole_answer(server: NamespacedServer, source: str, request: bytes) -> bytes:
    """Everything the server sends on a new connection from `source` until it closes."""
    with server.connect_from(source) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def execute_from(server: NamespacedServer, source: str, command: list[str]) -> tuple[int, bytes]:
    body = json.dumps({"command": command}).encode()
    head = f"POST /execute HTTP/1.1\r\nHost: sandbox\r\nContent-Length: {len(body)}\r\n\r\n"
    with server.connect_from(source, timeout=30) as sock:
        sock.sendall(head.encode() + body)
        return status_of(sock)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "workspace").mkdir()
    return tmp_path / "workspace"


@pytest.fixture
def namespaced(base: Path) -> Iterator[NamespacedServer]:
    server = NamespacedServer(base)
    try:
        yield server
    finally:
        assert server.stop() == 0


def once_refused(server: NamespacedServer, source: str, request: bytes) -> tuple[int, bytes, float]:
    """`ask` until the server answers 503, once it has taken the connections just opened (it
    accepts them on its own thread: no fixed wait is long enough on a loaded machine); the
    last answer, with how long that one took."""
    deadline = time.monotonic() + 60  # generous: it only bounds a failure
    while True:
        status, head, seconds = ask(server, source, request)
        if status == 503 or time.monotonic() > deadline:
            return status, head, seconds
        time.sleep(0.05)


def test_a_starve_from_loopback_leaves_the_outside_served_and_no_slot_held(
    namespaced: NamespacedServer, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    inside = ("nsenter", "-t", str(namespaced.proc.pid), "-n", "python3", "-c", ATTACK)
    attack = subprocess.Popen(
        [*inside, "300", "4", "3", str(namespaced.port), str(started)],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not started.exists():
        assert time.monotonic() < deadline and attack.poll() is None, "the attack did not start"
        time.sleep(0.05)
    slowest, statuses, limit = 0.0, set(), health_limit()
    for _ in range(20):
        status, _, seconds = ask(namespaced, namespaced.sources[0], HEALTH_REQUEST)
        statuses.add(status)
        slowest = max(slowest, seconds)
        time.sleep(0.1)
    executed = execute_from(namespaced, namespaced.sources[1], ["echo", "served"])
    out, _ = attack.communicate(timeout=60)
    found = json.loads(out)
    assert statuses == {200} and slowest < limit, (statuses, slowest, limit)
    assert executed[0] == 200, executed
    assert found["held_max"] >= 64 and found["refused"] > 0, found  # the attack did bite
    assert (found["left"], found["probe"]) == (0, 200), found
    # No slot left taken: loopback gets its whole share (64) again, and no more.
    share = namespaced.inside("python3", "-c", SHARE, str(namespaced.port), "65")
    assert json.loads(share.stdout) == [200] * 64 + [503], share.stderr


def test_the_servers_own_address_and_loopback_are_one_source(
    namespaced: NamespacedServer,
) -> None:
    """Code in a pod reaches its server through the pod's IP as well as 127.0.0.1: one share."""
    hosts = f"{namespaced.address},127.0.0.1"
    share = namespaced.inside("python3", "-c", SHARE, str(namespaced.port), "65", hosts)
    assert json.loads(share.stdout) == [200] * 64 + [503], share.stderr


def test_one_outside_source_over_its_share_gets_503_at_once_another_is_served(
    base: Path,
) -> None:
    server = NamespacedServer(base, "--max-connections-per-source", "4")
    first, second = server.sources
    held = [server.connect_from(first) for _ in range(4)]
    try:
        status, head, seconds = once_refused(server, first, FULL_REQUEST)
        assert (status, seconds < 0.5) == (503, True), (head, seconds)
        assert b"\r\nRetry-After: 1\r\n" in head
        assert ask(server, second, FULL_REQUEST)[0] == 200
        # The source over its share still gets its GET / answered (from the gate), honestly ok.
        started = time.monotonic()
        answer = whole_answer(server, first, HEALTH_REQUEST)
        assert time.monotonic() - started < 0.5
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
        assert answer.endswith(b'\r\n\r\n{"status": "ok"}'), answer
    finally:
        for sock in held:
            sock.close()
        assert server.stop() == 0


def test_one_source_over_its_command_share_gets_503_another_runs(base: Path) -> None:
    server = NamespacedServer(base, "--max-executes-per-source", "2")
    first, second = server.sources
    marked = "3.0173"  # a sleep no other test runs: its processes say the share is taken
    sleepers = [
        threading.Thread(target=execute_from, args=(server, first, ["sleep", marked]), daemon=True)
        for _ in range(2)
    ]
    try:
        for thread in sleepers:
            thread.start()
        deadline = time.monotonic() + 30  # both commands running: wait for that, not a time
        while len(processes_with(marked)) < 2:
            assert time.monotonic() < deadline, "the two sleepers did not start"
            time.sleep(0.02)
        started = time.monotonic()
        status, head = execute_from(server, first, ["true"])
        assert (status, time.monotonic() - started < 0.5) == (503, True), head
        assert b"\r\nRetry-After: 1\r\n" in head
        assert execute_from(server, second, ["true"])[0] == 200
        for thread in sleepers:
            thread.join()
        assert execute_from(server, first, ["true"])[0] == 200  # its share given back
    finally:
        assert server.stop() == 0


def test_health_beyond_the_connection_limit_is_answered_and_says_why_not_ok(
    base: Path,
) -> None:
    server = NamespacedServer(base, "--max-connections", "4", "--max-connections-per-source", "8")
    first, second = server.sources
    held: list[socket.socket] = []
    try:
        held += [server.connect_from(second) for _ in range(4)]
        wait_for(server.accepted_all, deadline_s=30, what="the server to accept the four")
        limit = health_limit()
        status, head, seconds = once_refused(server, first, HEALTH_REQUEST)
        assert (status, seconds < limit) == (503, True), (head, seconds, limit)
        answer = whole_answer(server, first, HEALTH_REQUEST)
        body = json.loads(answer.partition(b"\r\n\r\n")[2])
        assert body == {"status": "unavailable", "reason": "every connection slot is taken"}
        for sock in held:
            hang_up(sock)  # its slot given back
        assert ask(server, first, HEALTH_REQUEST)[0] == 200
    finally:
        assert server.stop() == 0  # the server goes whatever failed (it would outlive the run)


def test_health_is_not_ok_while_no_command_could_run(base: Path) -> None:
    server = ServerProcess(base, "--max-executes", "1", "--max-queued", "0")
    try:
        hold = ["sh", "-c", ": > running; until [ -e release ]; do sleep 0.01; done"]
        sleeper = threading.Thread(
            target=server.request,
            args=("POST", "/execute", json.dumps({"command": hold}).encode()),
            daemon=True,
        )
        sleeper.start()
        wait_for((base / "running").exists, deadline_s=30, what="the command to start")
        status, headers, body = server.request("GET", "/")
        assert (status, headers.get("Retry-After")) == (503, "1")
        assert json.loads(body) == {
            "status": "unavailable",
            "reason": "every command slot and queue place is taken",
        }
        (base / "release").touch()
        sleeper.join()
        assert server.request("GET", "/")[:3:2] == (200, b'{"status": "ok"}')
    finally:
        assert server.stop() == 0


def test_every_process_of_a_command_gets_oom_score_adj_1000_and_the_server_keeps_its_own(
    base: Path,
) -> None:
    own = Path("/proc/self/oom_score_adj").read_text()
    server = ServerProcess(base)
    try:
        script = 'cat /proc/self/oom_score_adj; sh -c "cat /proc/self/oom_score_adj" &\nwait'
        status, _, body = server.request(
            "POST", "/execute", json.dumps({"command": ["sh", "-c", script]}).encode()
        )
        assert status == 200 and json.loads(body)["stdout"] == "1000\n1000\n", body
        assert Path(f"/proc/{server.proc.pid}/oom_score_adj").read_text() == own
    finally:
        assert server.stop() == 0


def test_where_any_address_can_be_bound_outside_sources_stay_apart(base: Path) -> None:
    """`ip_nonlocal_bind` makes the bind test say yes to every address: the server then knows
    the host's own only as the address a connection came in on, and outside clients stay
    separate sources."""
    nonlocal_bind = ("sh", "-c", 'echo 1 > /proc/sys/net/ipv4/ip_nonlocal_bind && exec "$@"', "sh")
    server = NamespacedServer(base, "--max-connections-per-source", "2", prefix=nonlocal_bind)
    first, second = server.sources
    held = [server.connect_from(second) for _ in range(2)]
    wait_for(server.accepted_all, deadline_s=30, what="the server to accept the two connections")
    try:
        assert once_refused(server, second, FULL_REQUEST)[0] == 503  # its share taken
        assert ask(server, first, FULL_REQUEST)[0] == 200
        hosts = f"{server.address},127.0.0.1"
        share = server.inside("python3", "-c", SHARE, str(server.port), "3", hosts)
        assert json.loads(share.stdout) == [200, 200, 503], share.stderr
    finally:
        for sock in held:
            sock.close()
        assert server.stop() == 0
