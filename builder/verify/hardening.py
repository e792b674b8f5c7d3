"""Adversarial checks: what a hostile command does to the server, run against every image.

  race      a command swaps a workspace directory with a symlink to outside (renameat2
            RENAME_EXCHANGE) while every file route and /execute's cwd are hammered inside that
            directory: nothing outside is read, listed, found, deleted or written, no cwd outside
  detached  `setsid sleep &`, a double-fork daemon and a start_new_session child outlive
            neither a command that exits nor one that times out, and do not delay the reply
  flood     2 concurrent commands each writing 2 x 10 MiB of 0xff: bounded, truncated replies,
            GET / answering within a second meanwhile, the server's peak RSS under 256 MiB
            (emulated: one command of 2 x 3 MiB of 0x01, RSS reported but not bounded)

Each is bounded in time (a few seconds natively) because it runs in every verification, under
arm64 emulation too: the race hammers for a fixed time rather than a fixed count, and the flood
scales its health deadline by how slowly the sandbox starts a Python (load or emulation); which
bounds apply is the Sandbox's `machine` (never that timing), so a loaded native sandbox keeps them.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from builder import contract
from builder.verify.client import Response, Sandbox, python_json
from builder.verify.report import expect, short

MIB = 1024 * 1024
RACE_SECONDS = 2.0  # how long the routes are hammered while the directory is swapped
RACE_CAP = 150  # attempts per route at most (natively ~all of them fit in RACE_SECONDS)
RACE_WORKERS = 4
RACE_VICTIMS = 16  # outside files and trees that escaping DELETEs would remove
START_WAIT = 30.0  # for a helper command to start (emulated Pythons start slowly)
RACE_ROUTES = ("download", "list", "exists", "execute-cwd", "delete", "upload")
READ_ROUTES = RACE_ROUTES[:4]

RACE_SETUP = """
import json, os, sys, tempfile
root, token, victims = os.path.realpath(sys.argv[1]), sys.argv[2], int(sys.argv[3])
base = os.path.join(root, token)
os.makedirs(os.path.join(base, "d"))
outside = None
for parent in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
    real = os.path.realpath(parent)
    if os.path.commonpath([real, root]) == root:
        continue
    try:
        outside = tempfile.mkdtemp(prefix=token + "-", dir=real)
        break
    except OSError:
        continue
if outside is None:  # a read-only root: race the reads against a file everyone has
    outside, name = "/etc", "passwd"
else:
    name = token + ".out"
    for path in [name] + [f"v{i}" for i in range(victims)]:
        with open(os.path.join(outside, path), "w") as handle:
            handle.write(token)
    for i in range(victims):
        os.mkdir(os.path.join(outside, f"t{i}"))
        with open(os.path.join(outside, f"t{i}", "x"), "w") as handle:
            handle.write(token)
os.symlink(outside, os.path.join(base, "l"))
print(json.dumps({"outside": os.path.realpath(outside), "name": name,
                  "writable": outside != "/etc"}))
"""
DAMAGE = """
def damage(outside, victims):
    gone = [f"v{i}" for i in range(victims) if not os.path.exists(os.path.join(outside, f"v{i}"))]
    gone += [f"t{i}/x" for i in range(victims)
             if not os.path.exists(os.path.join(outside, f"t{i}", "x"))]
    made = [n for n in os.listdir(outside) if n.startswith(("u", ".upload-"))]
    return {"delete": gone, "upload": made}
"""
# Swaps until the client's `stop`, then, once stopped by it (every probe answered), counts the
# damage in the outside directory (argv[3], "" when it is not writable) without a second Python.
SWAPPER = (
    """
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
base = sys.argv[1]
d, link, stop = (os.fsencode(os.path.join(base, n)) for n in ("d", "l", "stop"))
end = time.monotonic() + float(sys.argv[2])
swaps = error = 0
open(os.path.join(base, "started"), "w").close()
while time.monotonic() < end and not os.path.exists(stop):
    for _ in range(50):
        if libc.renameat2(-100, d, -100, link, 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
            swaps += 1
        else:
            error = ctypes.get_errno()
found = {"swaps": swaps, "errno": error}
"""
    + DAMAGE
    + """
if sys.argv[3] and os.path.exists(stop):
    found["damage"] = damage(sys.argv[3], int(sys.argv[4]))
print(json.dumps(found))
"""
)
RACE_DAMAGE = (
    "import json, os, sys\n" + DAMAGE + "print(json.dumps(damage(sys.argv[1], int(sys.argv[2]))))\n"
)


class Race:
    """One race: the layout a setup command made, and what the hammering found per route."""

    def __init__(self, sandbox: Sandbox, token: str, layout: dict[str, Any]) -> None:
        self.sandbox = sandbox
        self.token = token
        self.outside: str = layout["outside"]
        self.name: str = layout["name"]
        self.routes = RACE_ROUTES if layout["writable"] else READ_ROUTES
        self.attempts = dict.fromkeys(self.routes, 0)
        self.escapes: dict[str, list[str]] = {route: [] for route in self.routes}
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def probe(self, route: str, index: int) -> None:
        """One request inside the swapped directory `d`; an escape is noted by route."""
        sandbox, inside = self.sandbox, f"{self.token}/d"
        escaped = False
        if route == "download":
            response = sandbox.download(f"{inside}/{self.name}")
            escaped = response.status == 200
        elif route == "list":
            response = sandbox.list(inside)
            escaped = response.status == 200 and self.name in listed_names(response)
        elif route == "exists":
            response = sandbox.exists(f"{inside}/{self.name}")
            escaped = response.status == 200 and response.object().get("exists") is True
        elif route == "execute-cwd":
            payload = {"command": ["pwd", "-P"], "cwd": inside, "timeout_seconds": 30}
            response = sandbox.request(
                "POST", contract.EXECUTE, json.dumps(payload).encode(), timeout=60
            )
            stdout = response.object().get("stdout") if response.status == 200 else None
            escaped = isinstance(stdout, str) and stdout.strip() == self.outside
        elif route == "delete":  # counted from the outside directory afterwards
            victim = f"v{index % RACE_VICTIMS}" if index % 2 else f"t{index % RACE_VICTIMS}"
            response = sandbox.delete(f"{inside}/{victim}")
        else:  # upload, likewise
            response = sandbox.upload(f"{inside}/u{index}.txt", b"written by the race check\n")
        with self._lock:
            self.attempts[route] += 1
            if escaped:
                self.escapes[route].append(f"#{index}: HTTP {response.status}")
            if response.status == 500:
                self.errors.append(f"{route}: {short(response.body)}")

    def hammer(self, seconds: float) -> None:
        """Every route in turn from a few threads, until `seconds` pass or each hit its cap."""
        deadline = time.monotonic() + seconds
        counter = itertools.count()

        def work() -> None:
            while time.monotonic() < deadline:
                index = next(counter)
                if index >= RACE_CAP * len(self.routes):
                    return
                self.probe(self.routes[index % len(self.routes)], index // len(self.routes))

        with ThreadPoolExecutor(RACE_WORKERS) as pool:
            for future in [pool.submit(work) for _ in range(RACE_WORKERS)]:
                future.result()

    def count_damage(self, counted: Any) -> None:
        """Deletes and uploads that escaped left their mark in the outside directory: as the
        swapper `counted` it once stopped, else (it stopped on its own) counted now."""
        if "delete" not in self.routes:
            return
        damage = counted if isinstance(counted, dict) else None
        if damage is None:
            damage = python_json(self.sandbox, RACE_DAMAGE, self.outside, str(RACE_VICTIMS))
        self.escapes["delete"] += damage["delete"]
        self.escapes["upload"] += damage["upload"]


def listed_names(response: Response) -> set[str]:
    listing = response.json()
    if not isinstance(listing, list):
        return set()
    return {str(entry.get("name")) for entry in listing if isinstance(entry, dict)}


def wait_for(sandbox: Sandbox, path: str, what: str) -> None:
    deadline = time.monotonic() + START_WAIT
    while not sandbox.exists(path).object().get("exists"):
        expect(time.monotonic() < deadline, f"{what} did not start within {START_WAIT:.0f}s")
        time.sleep(0.05)


def check_race(sandbox: Sandbox) -> str:
    token = f"bsi-race-{secrets.token_hex(6)}"
    root = sandbox.workspace
    layout = python_json(sandbox, RACE_SETUP, root, token, str(RACE_VICTIMS))
    expect(
        isinstance(layout, dict) and {"outside", "name", "writable"} <= layout.keys(),
        f"the race's setup printed {short(layout)}",
    )
    race = Race(sandbox, token, layout)
    with ThreadPoolExecutor(1) as pool:
        swapper = pool.submit(
            sandbox.python,
            SWAPPER,
            f"{root}/{token}",
            str(START_WAIT + 30),
            race.outside if "delete" in race.routes else "",
            str(RACE_VICTIMS),
            timeout_seconds=90,
        )
        try:
            wait_for(sandbox, f"{token}/started", "the swapping command")
            race.hammer(RACE_SECONDS)
        finally:
            sandbox.upload(f"{token}/stop", b"")
            swapped = swapper.result()
    sandbox.execute(["rm", "-rf", f"{root}/{token}"])
    try:
        swaps = json.loads(swapped["stdout"])
    except ValueError:
        swaps = None
    if not (isinstance(swaps, dict) and isinstance(swaps.get("swaps"), int)):
        swaps = {"swaps": 0, "errno": short(swapped["stderr"][-300:] or swapped["stdout"])}
    race.count_damage(swaps.get("damage"))
    if layout["writable"]:
        sandbox.execute(["rm", "-rf", race.outside])
    expect(swaps["swaps"] > 0, f"the directory was never swapped (renameat2: {swaps['errno']})")
    escaped = {route: found for route, found in race.escapes.items() if found}
    expect(
        not escaped,
        "escaped outside the workspace: "
        + "; ".join(
            f"{route} {len(found)} of {race.attempts[route]} ({short(found[:3], 60)})"
            for route, found in escaped.items()
        ),
    )
    expect(not race.errors, f"HTTP 500 during the race: {'; '.join(race.errors[:3])}")
    counts = ", ".join(f"{route} {count}" for route, count in race.attempts.items())
    scope = "" if layout["writable"] else " (read routes only: nothing outside is writable)"
    return f"{swaps['swaps']} swaps of a directory and a symlink out; 0 escapes in {counts}{scope}"


DETACHER = """
import os, subprocess, sys
seconds = sys.argv[1]
if os.fork() == 0:  # the classic double-fork daemon
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", seconds])
    os._exit(0)
os.wait()
subprocess.Popen(["sleep", seconds], start_new_session=True)  # holds stdout open
print("detached", flush=True)
if sys.argv[2] == "wait":
    os.execvp("sleep", ["sleep", seconds])
"""
SURVIVORS = """
import json, os, sys
seconds, variable = sys.argv[1], sys.argv[2].encode()
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0].decode()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\\0")
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read().split(b"\\0")
    except OSError:
        continue
    if state != "Z" and (seconds.encode() in argv or variable in environ):
        found.append(f"pid {pid} " + b" ".join(argv).decode("utf-8", "replace").strip())
print(json.dumps(found))
"""
DETACHED_VARIABLE = "BSI_VERIFY_DETACHED"
DETACH_TIMEOUT = 1  # what the timing-out run asks for
REPLY_SLACK = 10.0  # how much later than expected a reply may come back
CLEANUP_WAIT = 5.0


def detach(sandbox: Sandbox, mode: str, seconds: str, token: str) -> tuple[dict[str, Any], float]:
    """Start the three detached sleeps, then exit (`mode` "exit") or time out ("wait")."""
    command = [
        "sh", "-c", 'setsid sleep "$0" & exec python3 -c "$1" "$0" "$2"', seconds, DETACHER, mode,
    ]  # fmt: skip
    started = time.monotonic()
    result = sandbox.execute(
        command,
        timeout_seconds=DETACH_TIMEOUT if mode == "wait" else 30,
        env={DETACHED_VARIABLE: token},
    )
    return result, time.monotonic() - started


def survivors(sandbox: Sandbox, seconds: str, token: str) -> list[str]:
    """Processes still carrying the sleeps' argument or the run's variable, after a grace."""
    deadline = time.monotonic() + CLEANUP_WAIT
    while (left := python_json(sandbox, SURVIVORS, seconds, f"{DETACHED_VARIABLE}={token}")) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.25)
    expect(isinstance(left, list), f"the process listing printed {short(left)}, not a list")
    return left


def check_detached(sandbox: Sandbox) -> str:
    seconds = str(10**6 + secrets.randbelow(9 * 10**6))  # unique in /proc: the sleeps' marker
    token = secrets.token_hex(8)
    result, exited = detach(sandbox, "exit", seconds, token)
    expect(
        result["exit_code"] == 0 and result["stdout"] == "detached\n",
        f"the detaching command gave exit_code {result['exit_code']},"
        f" stdout {short(result['stdout'])}, stderr {short(result['stderr'][-300:])}",
    )
    expect(
        exited < REPLY_SLACK,
        f"the reply waited {exited:.1f}s for detached children holding its output",
    )
    left = survivors(sandbox, seconds, token)
    expect(not left, f"{len(left)} detached processes outlived their command: {short(left)}")
    result, timed = detach(sandbox, "wait", seconds, token)
    expect(
        result.get("timed_out") is True and result["exit_code"] == contract.TIMEOUT_EXIT_CODE,
        f"the waiting command was not timed out: exit_code {result['exit_code']},"
        f" timed_out {short(result.get('timed_out', 'missing'))}",
    )
    expect(
        timed < DETACH_TIMEOUT + REPLY_SLACK,
        f"timeout_seconds={DETACH_TIMEOUT} answered only after {timed:.1f}s",
    )
    left = survivors(sandbox, seconds, token)
    expect(not left, f"{len(left)} detached processes survived the timeout: {short(left)}")
    return (
        "setsid &, double-fork daemon, start_new_session: none left after an exit (reply in"
        f" {exited:.1f}s) or a {DETACH_TIMEOUT}s timeout (reply in {timed:.1f}s)"
    )


FLOOD = (
    "import sys\nchunk = bytes([int(sys.argv[2])]) * (1 << 20)\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    sys.stdout.buffer.write(chunk); sys.stderr.buffer.write(chunk)\n"
)
NATIVE_FLOOD = (2, 10, 0xFF)  # commands at once, MiB per stream (the stream cap), the byte
# Emulated (arm64 under qemu), where decoding invalid UTF-8 crawls: one command of 0x01, which
# JSON escapes 6-fold, so 3 MiB passes the reply's encoded budget (16 MiB per stream) too.
EMULATED_FLOOD = (1, 3, 0x01)
REPLY_LIMIT = 40 * MIB  # one reply; the unbounded encoding of 2 x 10 MiB of 0xff is > 60 MiB
HEALTH_LIMIT = 1.0  # seconds, natively
RSS_LIMIT = 256 * MIB  # natively; under qemu-user the figure is the emulator's
NATIVE_START = 0.1  # seconds a native `python3 -c pass` round trip takes at most
# The server's (the command's parent's) peak RSS in kB, read by sh alone (Pythons start slowly)
PEAK_RSS = [
    "sh", "-c",
    'while read -r key kb _; do case $key in VmHWM:) echo "$kb";; esac; done < /proc/$PPID/status',
]  # fmt: skip


def slowness(sandbox: Sandbox) -> float:
    """How much slower than an idle native machine this sandbox starts a Python: it stretches
    a latency deadline only (load or emulation), never decides which bounds apply."""
    started = time.monotonic()
    sandbox.python("pass")
    return max(1.0, (time.monotonic() - started) / NATIVE_START)


def check_flood(sandbox: Sandbox) -> str:
    emulated = sandbox.machine.emulated
    slow = slowness(sandbox)
    commands, mib, byte = EMULATED_FLOOD if emulated else NATIVE_FLOOD
    health_limit = HEALTH_LIMIT * slow
    latencies: list[float] = []
    done = threading.Event()

    def health() -> None:
        while not done.is_set():
            started = time.monotonic()
            try:
                status = sandbox.health(timeout=30).status
            except OSError:
                status = 0
            latencies.append(time.monotonic() - started if status == 200 else float("inf"))
            time.sleep(0.05)

    def flood(_: int) -> Response:
        argv = ["python3", "-c", FLOOD, str(mib), str(byte)]
        payload = {"command": argv, "timeout_seconds": 120}
        return sandbox.request("POST", contract.EXECUTE, json.dumps(payload).encode(), timeout=300)

    watcher = threading.Thread(target=health, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(commands) as pool:
            replies = list(pool.map(flood, range(commands)))
    finally:
        done.set()
        watcher.join()
    for response in replies:
        expect(response.status == 200, f"a flood got HTTP {response.status}")
        expect(
            len(response.body) <= REPLY_LIMIT,
            f"a reply to 2 x {mib} MiB of {byte:#04x} is {len(response.body) / MIB:.1f} MiB",
        )
        reply = response.object()
        expect(reply.get("exit_code") == 0, f"a flood exited {short(reply.get('exit_code'))}")
        expect(
            isinstance(reply.get("truncated"), dict) and any(reply["truncated"].values()),
            f"a cut reply does not say so: truncated is {short(reply.get('truncated'))}",
        )
    slowest = max(latencies, default=float("inf"))
    expect(
        slowest < health_limit,
        f"GET / took {slowest:.2f}s during the flood"
        f" (limit {health_limit:.1f}s; {sandbox.machine})",
    )
    read = sandbox.execute(PEAK_RSS)
    printed, limit = read["stdout"].strip(), f"limit {RSS_LIMIT / MIB:.0f} MiB"
    peak = int(printed) * 1024 if printed.isdigit() else None  # None: no /proc, or other output
    expect(  # natively there is always a /proc: a peak that cannot be read would leave no bound
        emulated or peak is not None,
        f"the server's peak RSS could not be read ({limit}): {short(printed or read['stderr'])}",
    )
    expect(
        emulated or (peak or 0) < RSS_LIMIT,
        f"the server's peak RSS reached {(peak or 0) / MIB:.0f} MiB ({limit}; {sandbox.machine})",
    )
    rss = f"{peak / MIB:.0f} MiB" if peak is not None else "not readable"
    largest = max(len(response.body) for response in replies)
    return (
        f"{commands} x 2 x {mib} MiB of {byte:#04x}: replies of at most {largest / MIB:.1f} MiB,"
        f" truncated; GET / within {slowest:.2f}s (limit {health_limit:.1f}s: python3 starts"
        f" {slow:.1f}x as slowly as when idle natively); server peak RSS {rss}"
        f" ({'not bounded' if emulated else limit}); {sandbox.machine}"
    )


HARDENING: tuple[tuple[str, Callable[[Sandbox], str]], ...] = (
    ("race", check_race),
    ("detached", check_detached),
    ("flood", check_flood),
)
