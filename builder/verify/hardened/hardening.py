"""Adversarial checks: what a hostile command does to the server, run against every image.

This module holds the detached and flood checks, and what the others share (how slowly the
sandbox starts a Python, the GET / deadline).

  race      a command swaps a workspace directory with a symlink to outside (renameat2
            RENAME_EXCHANGE) while every file route and /execute's cwd are hammered inside that
            directory: nothing outside is read, listed, found, deleted or written, no cwd outside
            (its own module, `race`)
  starve    the sandbox's own code holds a few hundred half-sent connections to its server:
            the platform is still served (its own module, `starve`)
  detached  `setsid sleep &`, a double-fork daemon and a start_new_session child outlive
            neither a command that exits nor one that times out, and do not delay the reply
  flood     2 concurrent commands each writing 2 x 10 MiB of 0xff: bounded, truncated replies,
            GET / answering within a second meanwhile, the server's peak RSS under 256 MiB
            (emulated: one command of 2 x 3 MiB of 0x01, RSS reported but not bounded)

Each is bounded in time (a few seconds natively) because it runs in every verification, under
arm64 emulation too: the race hammers for a fixed time rather than a fixed count, and the flood
and the starve check scale their health deadline by how slowly the sandbox starts a Python (load
or emulation); which bounds apply is the Sandbox's `machine` (never that timing), so a loaded
native sandbox keeps them.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from builder import contract
from builder.verify.client import ExecuteReply, Response, Sandbox, python_json
from builder.verify.report import expect, short

MIB = 1024 * 1024

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
REPLY_SLACK = 10.0  # how much later than expected a reply may come back, natively and idle
EXIT_TIMEOUT = 30.0  # beyond the slack: what the exiting run asks for, so a server that waits
# for the detached children until it gives up answers "timed out", never a late success
CLEANUP_WAIT = 5.0  # seconds killed processes may take to disappear, natively and idle


def detach(
    sandbox: Sandbox, mode: str, seconds: str, token: str, slack: float
) -> tuple[ExecuteReply, float]:
    """Start the three detached sleeps, then exit (`mode` "exit") or time out ("wait")."""
    command = [
        "sh",
        "-c",
        'setsid sleep "$0" & exec python3 -c "$1" "$0" "$2"',
        seconds,
        DETACHER,
        mode,
    ]
    started = time.monotonic()
    result = sandbox.execute(
        command,
        timeout_seconds=DETACH_TIMEOUT if mode == "wait" else slack + EXIT_TIMEOUT,
        env={DETACHED_VARIABLE: token},
    )
    return result, time.monotonic() - started


def leftovers(sandbox: Sandbox, listing: str, *args: str) -> list[Any]:
    """What the process `listing` script still prints once killed processes had their grace
    to disappear (and be reaped): CLEANUP_WAIT natively, stretched by the slowness, because
    under emulation or load the reaping and each listing's own Python start come later. The
    slowness is measured only when the first listing finds something: a sandbox that left
    nothing pays one listing, not another Python start."""
    left = python_json(sandbox, listing, *args)
    if left:
        deadline = time.monotonic() + CLEANUP_WAIT * slowness(sandbox)
        while left and time.monotonic() < deadline:
            time.sleep(0.25)
            left = python_json(sandbox, listing, *args)
    expect(isinstance(left, list), f"the process listing printed {short(left)}, not a list")
    return left


def survivors(sandbox: Sandbox, seconds: str, token: str) -> list[str]:
    """Processes still carrying the sleeps' argument or the run's variable, after a grace."""
    return leftovers(sandbox, SURVIVORS, seconds, f"{DETACHED_VARIABLE}={token}")


def check_detached(sandbox: Sandbox) -> str:
    seconds = str(10**6 + secrets.randbelow(9 * 10**6))  # unique in /proc: the sleeps' marker
    token = secrets.token_hex(8)
    # Each run starts several Pythons: under emulation or load the reply comes later for that
    # alone, so the slack stretches as the other latency deadlines do (never below idle native).
    slack = REPLY_SLACK * slowness(sandbox)
    result, exited = detach(sandbox, "exit", seconds, token, slack)
    expect(
        result["exit_code"] == 0 and result["stdout"] == "detached\n",
        f"the detaching command gave exit_code {result['exit_code']},"
        f" stdout {short(result['stdout'])}, stderr {short(result['stderr'][-300:])}",
    )
    expect(
        exited < slack,
        f"the reply waited {exited:.1f}s for detached children holding its output"
        f" (limit {slack:.0f}s)",
    )
    left = survivors(sandbox, seconds, token)
    expect(not left, f"{len(left)} detached processes outlived their command: {short(left)}")
    result, timed = detach(sandbox, "wait", seconds, token, slack)
    expect(
        result.get("timed_out") is True and result["exit_code"] == contract.TIMEOUT_EXIT_CODE,
        f"the waiting command was not timed out: exit_code {result['exit_code']},"
        f" timed_out {short(result.get('timed_out', 'missing'))}",
    )
    expect(
        timed < DETACH_TIMEOUT + slack,
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
PEAK_RSS = (
    "sh",
    "-c",
    'while read -r key kb _; do case $key in VmHWM:) echo "$kb";; esac; done < /proc/$PPID/status',
)


STALL_FACTOR = 3.0  # the one reply allowed past the limit must still come within this many


def health_problem(latencies: Sequence[float], limit: float, during: str) -> str | None:
    """What is wrong with the GET / latencies taken `during` an attack, if anything: every
    reply but one within `limit`, and that one within STALL_FACTOR times it. One reply is let
    off because a busy machine (a build beside the verification) stalls a single request now
    and then; a server the attack slows down is slow on many, and one it stalls is stalled for
    longer."""
    ordered = sorted(latencies, reverse=True)
    if not ordered:
        return f"no GET / was answered during {during}"
    if math.isinf(ordered[0]):  # the flood's watcher notes a reply other than 200 so
        return f"a GET / was not answered with 200 during {during}"
    if ordered[0] >= limit * STALL_FACTOR:
        return f"GET / took {ordered[0]:.2f}s during {during}"
    if len(ordered) > 1 and ordered[1] >= limit:
        return (
            f"{sum(x >= limit for x in ordered)} GET / took {limit:.1f}s or longer during {during}"
        )
    return None


def expect_responsive(
    sandbox: Sandbox, latencies: Sequence[float], slow: float, during: str
) -> float:
    """Fail the check unless the GET / `latencies` taken `during` an attack meet the health
    deadline, stretched by the larger of `slow` (measured before) and the slowness now; the
    deadline, for the check's summary."""
    limit = HEALTH_LIMIT * max(slow, slowness(sandbox))  # load that came meanwhile counts too
    problem = health_problem(latencies, limit, during)
    expect(problem is None, f"{problem} (limit {limit:.1f}s; {sandbox.machine})")
    return limit


def slowness(sandbox: Sandbox) -> float:
    """How much slower than an idle native machine this sandbox starts a Python: it stretches
    a latency deadline only (load or emulation), never decides which bounds apply. A check that
    times a stretch of work measures it before and after, and takes the larger: load that comes
    during the work (another engine's build, say) slows the replies and the Python alike."""
    started = time.monotonic()
    sandbox.python("pass")
    return max(1.0, (time.monotonic() - started) / NATIVE_START)


def check_flood(sandbox: Sandbox) -> str:
    """Commands each writing a stream cap's worth to stdout and stderr at once: each reply cut,
    saying so, within its size bound; GET / answered all along; the server's peak RSS bounded."""
    emulated = sandbox.machine.emulated
    slow = slowness(sandbox)
    commands, mib, byte = EMULATED_FLOOD if emulated else NATIVE_FLOOD
    replies, latencies = _flooded(sandbox, commands, mib, byte)
    for response in replies:
        _expect_cut_reply(response, mib, byte)
    slowest = max(latencies, default=float("inf"))
    health_limit = expect_responsive(sandbox, latencies, slow, "the flood")
    peak = _peak_rss(sandbox, emulated)
    rss = f"{peak / MIB:.0f} MiB" if peak is not None else "not readable"
    largest = max(len(response.body) for response in replies)
    limit = f"limit {RSS_LIMIT / MIB:.0f} MiB"
    return (
        f"{commands} x 2 x {mib} MiB of {byte:#04x}: replies of at most {largest / MIB:.1f} MiB,"
        f" truncated; GET / within {slowest:.2f}s (limit {health_limit:.1f}s: python3 starts"
        f" {health_limit / HEALTH_LIMIT:.1f}x as slowly as when idle natively);"
        f" server peak RSS {rss}"
        f" ({'not bounded' if emulated else limit}); {sandbox.machine}"
    )


def _flooded(
    sandbox: Sandbox, commands: int, mib: int, byte: int
) -> tuple[list[Response], list[float]]:
    """The replies to `commands` floods run at once, and the GET / latencies (inf: not 200)
    a watcher took until the last reply came."""
    latencies: list[float] = []
    done = threading.Event()
    watcher = threading.Thread(target=_watch_health, args=(sandbox, done, latencies), daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(commands) as pool:
            replies = list(pool.map(partial(_flood, sandbox, mib, byte), range(commands)))
    finally:
        done.set()
        watcher.join()
    return replies, latencies


def _watch_health(sandbox: Sandbox, done: threading.Event, latencies: list[float]) -> None:
    """Time GET / again and again until `done`, into `latencies` (the watcher thread's own)."""
    while not done.is_set():
        started = time.monotonic()
        try:
            status = sandbox.health(timeout=30).status
        except OSError:
            status = 0
        latencies.append(time.monotonic() - started if status == 200 else float("inf"))
        time.sleep(0.05)


def _flood(sandbox: Sandbox, mib: int, byte: int, _: int) -> Response:
    argv = ["python3", "-c", FLOOD, str(mib), str(byte)]
    payload = {"command": argv, "timeout_seconds": 120}
    return sandbox.request("POST", contract.EXECUTE, json.dumps(payload).encode(), timeout=300)


def _expect_cut_reply(response: Response, mib: int, byte: int) -> None:
    """A flood's reply: 200, within REPLY_LIMIT, the command's exit 0, and saying it was cut."""
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


def _peak_rss(sandbox: Sandbox, emulated: bool) -> int | None:
    """The server's peak RSS in bytes, within RSS_LIMIT natively; None where it cannot be
    read (emulated: under qemu-user the figure is the emulator's, and not bounded)."""
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
    return peak
