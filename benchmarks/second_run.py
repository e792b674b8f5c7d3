"""Time a cold run and a second run of the same input; print the ratio.

Cold means an empty wheel/inspection cache and an empty uv cache, as on a fresh CI runner.
The goal (issue 2) is a second run at least 5x faster than the first.

    .venv/bin/python benchmarks/second_run.py [-r examples/requirements.txt] [--arch amd64 ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed_run(requirements: Path, arches: list[str], workdir: Path, env: dict[str, str]) -> float:
    command = [
        sys.executable,
        "-m",
        "builder",
        "-r",
        str(requirements),
        "--no-build",
        "--output",
        str(workdir / "context"),
        "--cache-dir",
        str(workdir / "cache"),
    ]
    command += [f"--arch={arch}" for arch in arches]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", type=Path, default=REPO / "examples" / "requirements.txt")
    parser.add_argument("--arch", action="append", default=None)
    args = parser.parse_args()
    arches = args.arch or ["amd64", "arm64"]
    with tempfile.TemporaryDirectory(prefix="bsi-bench-") as temp:
        workdir = Path(temp)
        env = {**os.environ, "UV_CACHE_DIR": str(workdir / "uv-cache")}
        first = timed_run(args.r, arches, workdir, env)
        second = timed_run(args.r, arches, workdir, env)
    print(f"requirements: {args.r} arches: {' '.join(arches)}")
    print(f"first run (cold caches): {first:7.2f} s")
    print(f"second run (same input): {second:7.2f} s")
    print(f"ratio first/second:      {first / second:7.1f}x (goal: >= 5x)")


if __name__ == "__main__":
    main()
