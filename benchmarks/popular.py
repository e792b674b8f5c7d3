"""No surprise at first use, across PyPI's most downloaded projects (issue 55): each planned alone.

Plans each project of a list alone, plan-only (`--no-build`) for amd64 on the reference base
(its shipped facts, as a run without `--base-image` plans; or the base given), one CLI run
after the other with one tool cache, and prints for each: planned or refused, the refusal's
`error:` line, the GPU warning when there is one, the apt packages a plan requires, and its
time. Then the counts and the plan times (median, p90). The list is
`benchmarks/popular-300.txt` by default: PyPI's 300 most downloaded projects, in the order of
their downloads (taken from a ranking of the 15,000 most downloaded, 2026-12).

    .venv/bin/python benchmarks/popular.py [--list FILE] [--first N] [--base-image REF]
                                           [--cache-dir DIR] [--json FILE]

The downloaded wheels and the layers written are removed after each project (torch's CUDA
wheels alone are 3 GB), the cache's records (resolutions, inspections) kept: a project that
shares a dependency with an earlier one downloads it again but does not inspect it again, as a
second plan on a CI runner whose cache kept its records would. Needs the index.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_LIST = HERE / "popular-300.txt"
TOOL = (sys.executable, "-m", "builder")


@dataclass
class Outcome:
    """One project's plan: refused with its error line, or planned with what it requires."""

    name: str
    seconds: float
    error: str = ""  # the `error:` line of a refusal
    apt: list[str] = field(default_factory=list)  # the apt packages the plan installs
    gpu: str = ""  # the GPU warning, when the plan says one


def projects(path: Path, first: int | None) -> list[str]:
    names = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    names = [name for name in names if name]
    return names[:first] if first else names


def plan_one(name: str, work: Path, cache: Path, base: str | None) -> Outcome:
    """One CLI plan of `name` alone, in a directory of its own, then its wheels removed."""
    directory = work / "run"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    (directory / "requirements.txt").write_text(f"{name}\n")
    command = [*TOOL, "-r", "requirements.txt", "--no-build", "--arch", "amd64",
               "--output", "context", "--cache-dir", str(cache)]  # fmt: skip
    command += ["--base-image", base] if base else []
    start = time.perf_counter()
    result = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    shutil.rmtree(cache / "blobs", ignore_errors=True)  # wheels and layer tars
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Outcome(name, seconds, error=errors[0] if errors else last)
    report = json.loads((directory / "context" / "report.json").read_text())
    record = report["architectures"]["amd64"]
    output = result.stdout + result.stderr
    gpu = [line for line in output.splitlines() if "GPU" in line and line.startswith("warning:")]
    return Outcome(name, seconds, apt=record["apt_packages"], gpu=gpu[0] if gpu else "")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def report(outcomes: list[Outcome]) -> None:
    for outcome in outcomes:
        state = "refused" if outcome.error else "planned"
        apt = " ".join(outcome.apt) if outcome.apt else "-"
        print(f"{outcome.name:32} {state:8} {outcome.seconds:7.1f} s  apt: {apt}", flush=True)
        for line in (outcome.error, outcome.gpu):
            if line:
                print(f"    {line}")
    refused = [o for o in outcomes if o.error]
    times = [o.seconds for o in outcomes]
    print(f"\n{len(outcomes) - len(refused)} planned, {len(refused)} refused of {len(outcomes)}")
    print(f"with apt packages: {sum(1 for o in outcomes if o.apt)};"
          f" with a GPU warning: {sum(1 for o in outcomes if o.gpu)}")  # fmt: skip
    if times:
        slowest = max(outcomes, key=lambda o: o.seconds)
        print(f"plan time: median {statistics.median(times):.1f} s, p90"
              f" {percentile(times, 0.9):.1f} s, max {slowest.seconds:.1f} s ({slowest.name}),"
              f" total {sum(times):.0f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", type=Path, default=DEFAULT_LIST, help="one project a line")
    parser.add_argument("--first", type=int, help="only the first N of the list")
    parser.add_argument("--base-image", help="a base to probe (default: the reference base)")
    parser.add_argument("--cache-dir", type=Path, help="the tool cache (default: a fresh one)")
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bsi-popular-") as scratch:
        work = Path(scratch)
        cache = args.cache_dir or work / "cache"
        outcomes = []
        for name in projects(args.list, args.first):
            outcomes.append(plan_one(name, work, cache, args.base_image))
            last = outcomes[-1]
            print(f"# {name}: {'refused' if last.error else 'planned'} ({last.seconds:.1f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
    report(outcomes)
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))


if __name__ == "__main__":
    main()
