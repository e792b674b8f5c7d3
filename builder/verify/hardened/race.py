"""The race check: a command swaps a workspace directory with a symlink to outside while the
file routes and /execute's cwd are hammered inside that directory.

The swap is renameat2 RENAME_EXCHANGE in a loop; every file route and /execute's cwd are used
inside the swapped directory from a few threads: nothing outside may be read, listed, found,
deleted or written, and no command may start outside. It hammers for a fixed time rather than a
fixed count, because it runs in every verification, under arm64 emulation too.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

from builder import contract
from builder.verify.client import Response, Sandbox, python_json
from builder.verify.report import expect, short

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


class RaceLayout(TypedDict):
    """What the race's setup command printed: the paths it made, and whether writes race."""

    outside: str
    name: str
    writable: bool


class Race:
    """One race: the layout a setup command made, and what the hammering found per route."""

    def __init__(self, sandbox: Sandbox, token: str, layout: RaceLayout) -> None:
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
