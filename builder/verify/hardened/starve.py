"""The starve check: the sandbox's own code holds connections to its server; the platform must
still be served.

From inside the sandbox (a command, so as the sandbox user), ATTACK_CONNECTIONS connections to
the server's port on 127.0.0.1 each send half a request line and are held for ATTACK_SECONDS;
each one the server closes is opened again, as a runaway client retries. Meanwhile, from
outside, `GET /` must answer 200 within a second (stretched, like the flood's deadline, by how
slowly the sandbox starts a Python) and an `/execute` must succeed. Afterwards the server may
hold none of the attack's connections, accepted or still queued (read from /proc/net/tcp
inside), and a request from inside is served again (both within a few seconds): the attack left
no slot taken. The server must also have refused some of the attack's connections: one that
merely had room for all of them (unbounded threads, say) bounds nothing the sandbox's code
holds, and a few more connections would starve it.

The server's port inside is the listening socket among its (the command's parent's)
descriptors, so the check works whether the port is published under another number (an image)
or the server runs as a process on any port (tests). Where /proc does not show the server's
descriptors (a server that is not dumpable keeps them from its commands), it is the first of the
contract's port and the port the check reaches the server on that accepts on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import secrets
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from builder import contract
from builder.verify.client import Sandbox
from builder.verify.hardened.hardening import expect_responsive, slowness
from builder.verify.hardened.race import START_WAIT
from builder.verify.report import ContractViolation, expect, short

ATTACK_CONNECTIONS = 300  # over the 256 connections a server without per-source shares serves
ATTACK_SECONDS = 3.0
POLL_SECONDS = 0.1  # between the outside requests
RELEASE_WAIT = 3.0  # natively, for the server to let go of the closed connections

ATTACK = """
import json, os, select, socket, sys, time
count, hold, release, candidates, started = sys.argv[1:6]
count, hold, release = int(count), float(hold), float(release)

def sockets():  # every TCP socket's row of /proc/net/tcp and tcp6, split into fields
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows += [line.split() for line in handle.read().splitlines()[1:]]
        except OSError:
            continue
    return rows

def server_port():
    inodes, server = set(), os.getppid()
    try:
        for fd in os.listdir(f"/proc/{server}/fd"):
            try:
                link = os.readlink(f"/proc/{server}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    for row in sockets():
        if row[3] == "0A" and row[9] in inodes:
            return int(row[1].rsplit(":", 1)[1], 16)
    for candidate in candidates.split(","):  # the server's /proc is not ours: one that answers
        try:
            socket.create_connection(("127.0.0.1", int(candidate)), timeout=1).close()
            return int(candidate)
        except OSError:
            continue
    return int(candidates.split(",")[0])

port = server_port()
LOOPBACK = ("0100007F", "0000000000000000FFFF00000100007F")  # 127.0.0.1 in /proc/net/tcp{,6}
# The server's end of a connection it has not closed yet: accepted or still in its listen queue
# (ESTABLISHED), or closed by the client (CLOSE_WAIT).
PENDING = ("01", "08")
used, opened, refused, closed, held_max = set(), [0], 0, 0, 0

def attack_one():
    sock = socket.socket()
    sock.settimeout(1.0)
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /exists/starve HT")
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    used.add(sock.getsockname()[1])
    opened[0] += 1
    return sock

held = [s for s in (attack_one() for _ in range(count)) if s is not None]
open(started, "w").close()
end = time.monotonic() + hold
while time.monotonic() < end:
    ready = select.select(held, [], [], 0.1)[0] if held else []
    for sock in ready:
        try:
            answer = sock.recv(4096)
        except OSError:
            answer = b""
        refused += answer.startswith(b"HTTP/1.1 503")
        closed += 1
        held.remove(sock)
        sock.close()
    held_max = max(held_max, len(held))
    held += [s for s in (attack_one() for _ in range(count - len(held))) if s is not None]
for sock in held:
    sock.close()

def still_held():
    found = 0
    for row in sockets():
        local, (address, remote), state = row[1], row[2].split(":"), row[3]
        if int(local.rsplit(":", 1)[1], 16) == port and state in PENDING:
            found += address in LOOPBACK and int(remote, 16) in used
    return found

deadline = time.monotonic() + release
while (left := still_held()) and time.monotonic() < deadline:
    time.sleep(0.05)

REQUEST = b"GET /exists/starve HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n"

def probe():
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(REQUEST)
            status = sock.recv(4096).split(b" ", 2)[1:2]
    except OSError:
        return 0
    return int(status[0]) if status and status[0].isdigit() else 0

deadline = time.monotonic() + release
while (served := probe()) != 200 and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"port": port, "opened": opened[0], "refused": refused, "closed": closed,
                  "held_max": held_max, "left": left, "probe": served}))
"""


def check_starve(sandbox: Sandbox) -> str:
    """The attack run from inside while the platform's traffic runs from outside, then what
    each side saw, in order: the attack really held connections, the outside was served."""
    slow = slowness(sandbox)
    found, traffic = _attack(sandbox, slow)
    _expect_the_attack_was_bounded(found)
    health_limit = _expect_the_outside_was_served(sandbox, traffic, slow)
    expect(found["left"] == 0, f"the server still held {found['left']} of the attack's connections")
    expect(found["probe"] == 200, f"a request from inside got HTTP {found['probe']} afterwards")
    return (
        f"{ATTACK_CONNECTIONS} half-sent connections from inside held {ATTACK_SECONDS:g}s"
        f" ({found['opened']} opened, {found['refused']} refused with 503, at most"
        f" {found['held_max']} open): {len(traffic.latencies)} GET / from outside all 200,"
        f" slowest {max(traffic.latencies, default=float('inf')):.2f}s (limit"
        f" {health_limit:.1f}s), /execute answered in {traffic.execute_seconds:.2f}s;"
        f" afterwards none held and a request from inside served; {sandbox.machine}"
    )


def _attack(sandbox: Sandbox, slow: float) -> tuple[Any, Traffic]:
    """The attack's own account (what it opened, was refused, left held) and the traffic from
    outside meanwhile."""
    token = f"bsi-starve-{secrets.token_hex(6)}"
    started = f"{sandbox.workspace}/{token}"
    argv = [
        str(ATTACK_CONNECTIONS),
        str(ATTACK_SECONDS),
        str(RELEASE_WAIT * slow),
        f"{contract.PORT},{sandbox.port}",
        started,
    ]
    with ThreadPoolExecutor(1) as pool:
        attack = pool.submit(
            sandbox.python, ATTACK, *argv, timeout_seconds=START_WAIT + ATTACK_SECONDS + 60
        )
        traffic = Traffic(sandbox, token)
        traffic.run_until(attack)
        result = attack.result()
    sandbox.execute(["rm", "-f", started])
    expect(
        result["exit_code"] == 0,
        f"the starving command exited {result['exit_code']}: {short(result['stderr'][-300:])}",
    )
    try:
        found: Any = json.loads(result["stdout"])
    except ValueError:
        found = None
    expect(isinstance(found, dict), f"the starving command printed {short(result['stdout'])}")
    return found, traffic


def _expect_the_attack_was_bounded(found: Any) -> None:
    expect(  # else nothing was attacked: e.g. the server is not on 127.0.0.1 at that port
        found["opened"] >= ATTACK_CONNECTIONS,
        f"the attack opened only {found['opened']} connections to port {found['port']}",
    )
    expect(  # else the attack merely fit: a few more connections could take everything
        found["refused"] > 0,
        f"the server never refused one of the attack's connections ({found['opened']} opened):"
        " nothing bounds what the sandbox's own code holds",
    )


def _expect_the_outside_was_served(sandbox: Sandbox, traffic: Traffic, slow: float) -> float:
    """Nothing from outside refused, GET / answered in time, /execute answered; the health
    limit the latencies were held to."""
    refused = Counter(traffic.refusals)
    expect(
        not refused,
        "requests from outside were refused during the attack: "
        + ", ".join(f"{what} (x{count})" for what, count in sorted(refused.items())),
    )
    health_limit = expect_responsive(sandbox, traffic.latencies, slow, "the attack")
    expect(traffic.executed == "", f"/execute during the attack: {traffic.executed}")
    return health_limit


class Traffic:
    """The platform's requests while the attack runs: GET / every POLL_SECONDS from the
    attack's submission to its reply, and one /execute once the attack holds its connections
    (seen through /exists, which must be answered too)."""

    def __init__(self, sandbox: Sandbox, token: str) -> None:
        self.sandbox = sandbox
        self.token = token
        self.latencies: list[float] = []
        self.refusals: list[str] = []  # what was refused, e.g. "GET / -> HTTP 503"
        self.executed = "never ran: the attack was not seen holding its connections"
        self.execute_seconds = 0.0

    def run_until(self, attack: Future[Any]) -> None:
        runner: threading.Thread | None = None
        while not attack.done():
            started = time.monotonic()
            try:
                status = self.sandbox.health(timeout=30).status
            except (OSError, http.client.HTTPException):
                status = 0  # no answer
            self.latencies.append(time.monotonic() - started)
            if status != 200:
                self.refusals.append(f"GET / -> HTTP {status}")
            if runner is None and self._holding():
                runner = threading.Thread(target=self._execute, daemon=True)
                runner.start()
            time.sleep(POLL_SECONDS)
        if runner is not None:
            runner.join()

    def _holding(self) -> bool:
        """Whether the attack has opened its connections (its file exists)."""
        try:
            response = self.sandbox.exists(self.token)
        except (OSError, http.client.HTTPException):
            self.refusals.append("GET /exists -> no answer")
            return False
        if response.status != 200:
            self.refusals.append(f"GET /exists -> HTTP {response.status}")
            return False
        return response.object().get("exists") is True

    def _execute(self) -> None:
        started = time.monotonic()
        try:
            reply = self.sandbox.execute(["echo", "served"], timeout_seconds=30)
            ok = reply["exit_code"] == 0 and reply["stdout"] == "served\n"
            self.executed = "" if ok else f"exit {reply['exit_code']}, {short(reply['stdout'])}"
        except (ContractViolation, OSError, http.client.HTTPException) as error:
            self.executed = f"{type(error).__name__}: {error}"
        self.execute_seconds = time.monotonic() - started
