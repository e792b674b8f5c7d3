"""Issue 22's fleet ratio: one `rebuild` of N templates against N separate `rebuild` runs.

N templates (default 4) share most of their distributions (COMMON) and add one of their own;
each is built once onto platform version 1.0 (untimed set-up, which also warms the tool's
cache). Then, per round, each side gets fresh copies of the pipeline directories (config,
requirements, state, template) and of the warm cache, and moves every template onto 1.1 (a
base one small layer newer: the rebase path, as a platform patch is):

- fleet:    `rebuild --config t0 ... --config tN-1 --platform-version 1.1 --jobs J`
- separate: N `rebuild --config tI --platform-version 1.1` processes one after the other, as
            a pipeline's loop over its configs runs them, on one cache.

The rounds alternate which side goes first (round 1 fleet first, round 2 separate first), so
what the first side leaves in the registry or the engine (the new base's layers, the rebased
images' blobs) helps each side alike. Both sides are checked to have rebased every template.
Needs the engine, the local test registry (.test-env.json) and the index.

    .venv/bin/python benchmarks/fleet.py [--base-image bsi-reference:test] [-n 4] [--jobs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from upgrade import derived_base, push  # noqa: E402

COMMON = ["numpy", "requests", "pyyaml", "attrs", "jinja2", "click"]
OWN = ["tabulate", "toolz", "more-itertools", "python-dateutil", "six", "idna", "packaging"]


def run(command: list[str], env: dict[str, str], cwd: Path) -> float:
    """Seconds `command` took; a failure ends the benchmark with its output."""
    start = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(command[3:6])} failed:\n{result.stdout[-3000:]}{result.stderr}")
    return elapsed


def pipelines(work: Path, n: int, runtime: str, sandbox: str) -> list[str]:
    """N pipeline directories under `work`/setup; their config paths, relative to it."""
    configs = []
    for index in range(n):
        here = work / "setup" / f"t{index}"
        here.mkdir(parents=True)
        (here / "requirements.txt").write_text("\n".join([*COMMON, OWN[index % len(OWN)]]) + "\n")
        shutil.copy(REPO / "examples" / "sandbox-template.yaml", here / "sandbox-template.yaml")
        (here / "cfg.toml").write_text(
            'requirements = ["requirements.txt"]\n'
            f'base-repository = "{runtime}"\n'
            'platform-version = "1.0"\n'
            'architectures = ["amd64"]\n'
            f'repository = "{sandbox}-t{index}"\n'
            'template = "sandbox-template.yaml"\n'
        )
        configs.append(f"t{index}/cfg.toml")
    return configs


def fresh_copy(work: Path, name: str) -> tuple[Path, Path]:
    """A copy of the pipelines (files copied) and of the warm cache (hard links: the cache
    only ever renames new files into place, so a link is never written through)."""
    side = work / name
    shutil.copytree(work / "setup", side / "pipelines")
    shutil.copytree(work / "cache", side / "cache", copy_function=os.link)
    return side / "pipelines", side / "cache"


def rebased(pipelines: Path, configs: list[str]) -> None:
    for config in configs:
        state = json.loads((pipelines / config).with_name("cfg.state.json").read_text())
        if (state["platform_version"], state["path"]) != ("1.1", "rebase"):
            sys.exit(f"error: {config} ended at {state['platform_version']} by {state['path']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument("-n", type=int, default=4, help="templates in the fleet")
    parser.add_argument("--jobs", type=int, default=4, help="the fleet's --jobs")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    test_env = json.loads((REPO / ".test-env.json").read_text())
    host, user = test_env["registry"], test_env["registry_user"]
    password = test_env["registry_password"]
    stamp = uuid.uuid4().hex[:8]
    tool = [sys.executable, "-m", "builder", "rebuild"]
    env = {**os.environ, "BSI_REGISTRY_USER": user, "BSI_REGISTRY_PASSWORD": password}
    env |= {"DOCKER_BUILDKIT": "1"}
    with tempfile.TemporaryDirectory(prefix="bsi-bench-fleet-") as temp:
        work = Path(temp)
        runtime = f"{host}/bsi-bench-fleet-{stamp}/runtime"
        derived_base(args.base_image, f"{runtime}:1.0", f"{stamp}-1.0", work)
        derived_base(f"{runtime}:1.0", f"{runtime}:1.1", f"{stamp}-1.1", work)
        for version in ("1.0", "1.1"):
            push(f"{runtime}:{version}", user, password)
        configs = pipelines(work, args.n, runtime, f"{host}/bsi-bench-fleet-{stamp}/sandbox")
        every = [a for config in configs for a in ("--config", config)]
        setup = [*tool, *every, "--platform-version", "1.0", "--cache-dir", str(work / "cache")]
        spent = run(setup, env, work / "setup")
        print(f"set-up: {args.n} templates built onto 1.0 in {spent:.1f} s (untimed below)")

        times: dict[str, list[float]] = {"fleet": [], "separate": []}
        for round_ in range(args.rounds):
            order = ("fleet", "separate") if round_ % 2 == 0 else ("separate", "fleet")
            for side in order:
                pipes, cache = fresh_copy(work, f"{side}-{round_}")
                onto = ["--platform-version", "1.1", "--cache-dir", str(cache)]
                if side == "fleet":
                    spent = run([*tool, *every, *onto, "--jobs", str(args.jobs)], env, pipes)
                else:
                    spent = sum(run([*tool, "--config", c, *onto], env, pipes) for c in configs)
                rebased(pipes, configs)
                times[side].append(spent)
            fleet, separate = times["fleet"][-1], times["separate"][-1]
            print(
                f"round {round_ + 1} ({order[0]} first): fleet {fleet:6.1f} s"
                f"   separate {separate:6.1f} s   ratio {fleet / separate:5.2f}x"
            )
    fleet, separate = sum(times["fleet"]), sum(times["separate"])
    print(f"templates: {args.n} (common: {' '.join(COMMON)}; one own each), --jobs {args.jobs}")
    print(
        f"fleet {fleet:6.1f} s   {args.n} separate runs {separate:6.1f} s   "
        f"ratio {fleet / separate:5.2f}x (target <= 0.5x; sums of {args.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
