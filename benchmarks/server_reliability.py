"""Reliability figures of the runtime server (issue 9), rerunnable by anyone:

    .venv/bin/python benchmarks/server_reliability.py [--attempts 2000] [--server PATH]

- symlink-swap race: attempts and escapes per route, while a process swaps workspace/d with a
  symlink to outside (renameat2 RENAME_EXCHANGE) in a loop;
- detached processes: survivors per daemon pattern (setsid, double fork, new session, ...);
- memory: the server's peak RSS with 8 concurrent commands each writing 2 x 10 MiB of 0xff,
  and the slowest ``GET /`` meanwhile;
- malformed requests: how many were tried, how many got a 5xx or no answer;
- starve (root only: the server gets its own network namespace): code on the server's side, as
  uid 65532, holds 300 half-sent connections (reopening each one the server closes) while,
  from outside, GET / is asked every 50 ms and /execute every 250 ms: what the outside got,
  and whether any of the attack's connections stayed held afterwards.

Run as root, the server runs as uid 65532 (as in the images) through ``setpriv``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import sandboxserver
from support.sandboxserver import (
    MIB,
    AsUser,
    NamespacedServer,
    RaceLayout,
    ServerProcess,
    as_sandbox_user,
    daemon_patterns,
    flood,
    give_to_sandbox_user,
    malformed_requests,
    race,
    run_daemon_pattern,
    sandbox_dir,
    send_raw,
    starve,
)


def user_workspace(base: Path, name: str) -> Path:
    """A fresh workspace under ``base`` that the sandbox user owns."""
    workspace = base / name
    workspace.mkdir()
    give_to_sandbox_user(workspace)
    return workspace


def measure_race(base: Path, attempts: int, user: AsUser) -> None:
    """The symlink-swap race, each route tried ``attempts`` times: attempts and escapes."""
    layout = RaceLayout(base / "race", victims=(attempts + 1) // 2)
    server = ServerProcess(layout.workspace, log=base / "race.log", **user)
    try:
        results = race(server, layout, attempts, swapper_prefix=user.get("prefix", ()))
    finally:
        server.stop()
    print("\nsymlink-swap race                attempts   escapes")
    for route, (tried, escapes) in results.items():
        print(f"  {route:<30} {tried:>8} {escapes:>9}")


def measure_daemons(base: Path, user: AsUser) -> None:
    """Each daemon pattern run once: how many of its processes outlived the command."""
    server = ServerProcess(user_workspace(base, "daemons"), log=base / "daemons.log", **user)
    total = 0
    print("\ndetached processes               survivors  reply s")
    try:
        for index in range(len(daemon_patterns("0"))):
            marker = str(secrets.randbelow(10**9))
            name, command, timeout = daemon_patterns(marker)[index]
            _, elapsed, left = run_daemon_pattern(server, command, timeout, marker)
            total += len(left)
            print(f"  {name:<30} {len(left):>9} {elapsed:>8.2f}")
    finally:
        server.stop()
    print(f"  {'total':<30} {total:>9}")


def measure_flood(base: Path, user: AsUser) -> None:
    """8 concurrent floods: the server's peak RSS, the slowest GET / and the largest reply."""
    server = ServerProcess(user_workspace(base, "flood"), log=base / "flood.log", **user)
    try:
        figures = flood(server, concurrent=8)
    finally:
        server.stop()
    print("\n8 concurrent floods of 2 x 10 MiB of 0xff")
    print(f"  server peak RSS                {figures['peak_rss'] / MIB:>8.1f} MiB")  # type: ignore[operator]
    print(f"  slowest GET / meanwhile        {figures['max_health_seconds']:>8.3f} s")
    print(f"  largest reply                  {figures['reply_bytes'] / MIB:>8.1f} MiB")  # type: ignore[operator]


def measure_malformed(base: Path, user: AsUser) -> None:
    """Every malformed request sent once: how many got a 5xx or no answer at all."""
    server = ServerProcess(user_workspace(base, "malformed"), log=base / "malformed.log", **user)
    try:
        statuses = [send_raw(server, data) for _, data in malformed_requests()]
        server.request("DELETE", "/files/a")  # the 1,000-deep upload
    finally:
        server.stop()
    bad = sum(1 for status in statuses if status >= 500 or status == 0)
    print("\nmalformed requests               tried   5xx/none")
    print(f"  {'':<30} {len(statuses):>5} {bad:>10}")


def measure_starve(base: Path, seconds: float, user: AsUser) -> None:
    """The starve attack from inside for ``seconds``: what the outside got meanwhile."""
    server = NamespacedServer(user_workspace(base, "starve"), log=base / "starve.log", **user)
    python = (*user.get("prefix", ()), str(user.get("python", "python3")))
    try:
        found = starve(server, 300, seconds, python)
    finally:
        server.stop()
    print(f"\nstarve: 300 half-sent connections from inside for {seconds:g} s")
    for label, value in (
        ("attack connections opened", found["opened"]),
        ("  refused with 503", found["refused"]),
        ("  most held open at once", found["held_max"]),
        ("  still held afterwards", found["left"]),
        ("GET / from outside", found["health"]),
        ("  not 200", found["health_not_200"]),
        ("  slowest (s)", f"{found['health_slowest']:.3f}"),
        ("/execute from outside", found["executes"]),
        ("  not 200", found["executes_not_200"]),
        ("  slowest (s)", f"{found['execute_slowest']:.3f}"),
    ):
        print(f"  {label:<30} {value:>9}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=2000, help="race attempts per route")
    parser.add_argument("--starve-seconds", type=float, default=10.0, help="how long to starve")
    parser.add_argument("--server", help="another server to measure (e.g. an older one)")
    args = parser.parse_args()
    if args.server:
        sandboxserver.SERVER = Path(args.server).resolve()
    user = as_sandbox_user()
    base = sandbox_dir()
    try:
        print(f"server: {sandboxserver.SERVER}  (uid {os.geteuid() if not user else 65532})")
        measure_race(base, args.attempts, user)
        measure_daemons(base, user)
        measure_flood(base, user)
        measure_malformed(base, user)
        if os.geteuid() != 0:
            print("\nstarve: skipped (the server's own network namespace needs root)")
            return 0
        measure_starve(base, args.starve_seconds, user)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
