"""Issue 36's bad day for a fleet: N templates moved to a new platform version through a proxy
that fails about 20 % of the tool's requests once and 10 % twice, against the same through a
clean proxy.

The local test registry is reached through tests/support/faultproxy.py for the whole run (the
bases, the set-up, both sides), so every reference names the proxy. N templates (default 4,
benchmarks/fleet.py's pipelines) are built onto platform version 1.0 (untimed set-up, which
warms the tool's cache); then each side gets fresh copies of the pipelines and of the warm
cache, its own target repositories (so neither finds the other's pushes), and runs one
`rebuild --config t0 ... --platform-version 1.1 --jobs J` (the rebase path): first the clean
side, then the flaky one (seeded: the same faults on every run). Both must rebase every
template. Prints each side's wall time, the requests and the faults the proxy injected,
and the ratio, from this one run. Needs the engine, the local test registry
(.test-env.json) and the index.

    .venv/bin/python benchmarks/flaky_fleet.py [--base-image bsi-reference:test] [-n 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))
from fleet import fresh_copy, pipelines, rebased, run  # noqa: E402
from support.faultproxy import FaultProxy, Plan  # noqa: E402
from upgrade import derived_base, push  # noqa: E402


def retargeted(pipes: Path, configs: list[str], side: str) -> None:
    """Each template pushes to a repository of this side's own."""
    for config in configs:
        path = pipes / config
        text = path.read_text()
        path.write_text(re.sub(r'(repository = "[^"]*)-t(\d+)"', rf'\1-{side}-t\2"', text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument("-n", type=int, default=4, help="templates in the fleet")
    parser.add_argument("--jobs", type=int, default=4, help="the fleet's --jobs")
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args()
    test_env = json.loads((REPO / ".test-env.json").read_text())
    user, password = test_env["registry_user"], test_env["registry_password"]
    proxy = FaultProxy(test_env["registry"])
    stamp = uuid.uuid4().hex[:8]
    tool = [sys.executable, "-m", "builder", "rebuild"]
    env = {**os.environ, "BSI_REGISTRY_USER": user, "BSI_REGISTRY_PASSWORD": password}
    env |= {"DOCKER_BUILDKIT": "1"}
    made: list[str] = []  # the bases' tags, removed at the end
    try:
        with tempfile.TemporaryDirectory(prefix="bsi-bench-flaky-") as temp:
            work = Path(temp)
            direct = f"{test_env['registry']}/bsi-bench-flaky-{stamp}/runtime"
            derived_base(args.base_image, f"{direct}:1.0", f"{stamp}-1.0", work)
            derived_base(f"{direct}:1.0", f"{direct}:1.1", f"{stamp}-1.1", work)
            for version in ("1.0", "1.1"):  # pushed past the proxy (the engine's is chunked)
                push(f"{direct}:{version}", user, password)
            runtime = f"{proxy.host}/bsi-bench-flaky-{stamp}/runtime"  # what the tool is given
            made += [
                f"{name}:{version}" for name in (direct, runtime) for version in ("1.0", "1.1")
            ]
            sandbox = f"{proxy.host}/bsi-bench-flaky-{stamp}/sandbox"
            configs = pipelines(work, args.n, runtime, sandbox)
            every = [a for config in configs for a in ("--config", config)]
            setup = [*tool, *every, "--platform-version", "1.0", "--cache-dir", str(work / "cache")]
            spent = run(setup, env, work / "setup")
            print(f"set-up: {args.n} templates built onto 1.0 in {spent:.1f} s (untimed below)")
            times: dict[str, float] = {}
            for side, plan in (
                ("clean", Plan()),
                ("flaky", Plan(seed=args.seed, once=0.2, twice=0.1)),
            ):
                pipes, cache = fresh_copy(work, side)
                retargeted(pipes, configs, side)
                proxy.replan(plan)
                mark = len(proxy.log)
                onto = ["--platform-version", "1.1", "--cache-dir", str(cache)]
                start = time.perf_counter()
                run([*tool, *every, *onto, "--jobs", str(args.jobs)], env, pipes)
                times[side] = time.perf_counter() - start
                rebased(pipes, configs)
                seen = proxy.log[mark:]
                faults = sum(one.action != "forward" for one in seen)
                print(
                    f"{side:5}: {args.n} templates rebased in {times[side]:6.1f} s;"
                    f" {len(seen)} requests, {faults} faults injected"
                )
    finally:
        proxy.close()
        subprocess.run(["docker", "rmi", *made], capture_output=True, check=False)
    print(
        f"flaky {times['flaky']:6.1f} s   clean {times['clean']:6.1f} s   "
        f"ratio {times['flaky'] / times['clean']:5.2f}x (one run each; every template rebased)"
    )


if __name__ == "__main__":
    main()
