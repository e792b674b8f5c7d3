"""Issue 46's split run against one job: a two-arch build in one job vs plan, both parts at
once (each its own engine, plan copy and empty cache), then merge.

Both runs push the same set on the same two-arch base to repositories of their own. On this
machine both engines are amd64, so each emulates arm64 the same way: the ratio shows what the
split costs or saves in orchestration, not what a native arm64 runner saves. Prints each step's
wall time and the ratio split / one job. Needs the engine, the local test registry
(.test-env.json), the index, and a second engine for the arm64 part (--engine2, e.g. the
tests' unix:///run/bsi-engine2/docker.sock; without it both parts run on the default engine).

    .venv/bin/python benchmarks/parts.py --base-image HOST/REPO:TAG [-r FILE] [--engine2 URL]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN = uuid.uuid4().hex[:8]


def tool(args: list[str], env: dict[str, str]) -> float:
    """One CLI run's wall time; the run's failure ends the benchmark."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "builder", *args], env=env, capture_output=True, text=True, cwd=REPO
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(args[:3])} failed:\n{result.stdout[-2000:]}{result.stderr}")
    return elapsed


def environment() -> dict[str, str]:
    test_env = json.loads((REPO / ".test-env.json").read_text())
    user, password = test_env["registry_user"], test_env["registry_password"]
    return {**os.environ, "BSI_REGISTRY_USER": user, "BSI_REGISTRY_PASSWORD": password}


def split_run(work: Path, common: list[str], repository: str, args: argparse.Namespace) -> dict:
    """Plan, both parts at once, merge: each step's wall time."""
    env = environment()
    plan = work / "plan"
    cold = ["--cache-dir", str(work / "plan-cache")]  # as the one job's
    steps = {
        "plan": tool(
            [*common, "--push", repository, "--no-build", "--output", str(plan), *cold], env
        )
    }
    jobs = []
    for arch in ("amd64", "arm64"):
        copy = shutil.copytree(plan, work / arch / "plan")
        engine = ["--engine", f"arm64={args.engine2}"] if arch == "arm64" and args.engine2 else []
        jobs.append((arch, ["part", str(copy), "--arch", arch, "--push", repository,
                            "--cache-dir", str(work / arch / "cache"), *engine]))  # fmt: skip
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        took = dict(
            zip([a for a, _ in jobs], pool.map(lambda j: tool(j[1], env), jobs), strict=True)
        )
    steps["parts (both at once)"] = time.perf_counter() - started
    steps |= {f"  part {arch}": seconds for arch, seconds in took.items()}
    (plan / "parts").mkdir()
    for arch in ("amd64", "arm64"):
        shutil.copy(work / arch / "plan" / "parts" / f"{arch}.json", plan / "parts")
    steps["merge"] = tool(["merge", str(plan), "--push", repository], env)
    return steps


def remove_tags(marks: tuple[str, ...], engine2: str | None) -> None:
    """The local tags this run made, on each engine it used (by tag: the images stay if
    another tag holds them)."""
    for host in ("", engine2) if engine2 else ("",):  # "": the default engine
        env = {**os.environ, "DOCKER_HOST": host} if host else dict(os.environ)
        listed = subprocess.run(
            ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        tags = [t for t in listed.stdout.split() if any(t.startswith(m) for m in marks)]
        if tags:
            subprocess.run(["docker", "rmi", *tags], env=env, capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", required=True, help="a two-arch base in the registry")
    parser.add_argument("-r", "--requirement", type=Path, help="default: six")
    parser.add_argument("--engine2", help="the arm64 part's engine URL")
    args = parser.parse_args()
    registry = json.loads((REPO / ".test-env.json").read_text())["registry"]
    with tempfile.TemporaryDirectory(prefix="bsi-bench-parts-") as scratch:
        work = Path(scratch)
        requirements = args.requirement or work / "requirements.txt"
        if args.requirement is None:
            requirements.write_text("six\n")
        common = ["-r", str(requirements), "--base-image", args.base_image]
        one = tool([*common, "--push", f"{registry}/bsi-bench-parts-{RUN}/one",
                    "--output", str(work / "one"), "--cache-dir", str(work / "one-cache"),
                    "--tag", f"bsi-bench-parts-{RUN}:one"], environment())  # fmt: skip
        split = split_run(work, common, f"{registry}/bsi-bench-parts-{RUN}/split", args)
        extras = json.loads((work / "plan" / "plan.json").read_text())["plan_id"]["extras_hash"]
        remove_tags((f"bsi-bench-parts-{RUN}:", f"sandbox-extension:x{extras}-"), args.engine2)
    print(f"one job (two arches, cold cache): {one:7.1f} s")
    for step, seconds in split.items():
        print(f"split {step:<24} {seconds:7.1f} s")
    total = sum(s for step, s in split.items() if not step.startswith("  "))
    print(f"split total: {total:.1f} s; split / one job: {total / one:.2f}")


if __name__ == "__main__":
    main()
