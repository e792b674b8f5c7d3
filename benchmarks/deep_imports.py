"""What deep imports and use checks add to verification time (issue 49; goal: at most 25 % more
on the example set).

Builds the example set (examples/requirements.txt) on a base with the tool, without its own
verification, then verifies the image twice on the local engine, as `verify -r` would: once
importing the distributions' top-level modules only, once with every module of them imported
(deep imports, the permissive re-run of what failed) and their use checks. Prints both times,
the ratio, and the deep-import figures per distribution. On a busy machine one run of each is
noise: --rounds N interleaves N of each (the order alternating) and gives medians.

    .venv/bin/python benchmarks/deep_imports.py [--base bsi-reference:test] [--image TAG]
        [--rounds 3] [-r examples/popular-requirements.txt]

`--image` verifies an image already built from the set instead of building one; `-r` measures
another set (examples/popular-requirements.txt: a code interpreter's 20 libraries). Needs the
engine, and the package index to build.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from builder.resolve.requirements import distribution_names
from builder.verify.deep.imports import DeepOptions
from builder.verify.report import VerifyReport
from builder.verify.run import Installed, verify_image

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "requirements.txt"


def build(base: str, tag: str, requirements: Path) -> None:
    """The set's image, built by the tool as an operator would, left unverified."""
    with tempfile.TemporaryDirectory() as directory:
        command = [
            sys.executable, "-m", "builder", "-r", str(requirements), "--base-image", base,
            "--tag", tag, "--output", str(Path(directory) / "context"), "--no-verify",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"the build failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")


def timed(tag: str, installed: Installed) -> tuple[float, VerifyReport]:
    started = time.monotonic()
    report = verify_image(tag, installed=installed)
    return time.monotonic() - started, report


def rounds(tag: str, distributions: list[str], count: int) -> tuple[float, float, VerifyReport]:
    """The median verification time without and with deep imports over `count` interleaved
    rounds (the order alternating), and the last deep report."""
    plain, deep, report = [], [], None
    for number in range(count):
        for kind in ("plain", "deep") if number % 2 == 0 else ("deep", "plain"):
            options = DeepOptions() if kind == "deep" else None
            seconds, found = timed(tag, Installed(distributions, deep=options))
            (deep if options else plain).append(seconds)
            report = found if options else report
    assert report is not None
    return statistics.median(plain), statistics.median(deep), report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="bsi-reference:test")
    parser.add_argument("--image", help="an image already built from the set")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("-r", "--requirements", type=Path, default=EXAMPLE)
    arguments = parser.parse_args()
    tag = arguments.image or f"bsi-bench-deep-{uuid.uuid4().hex[:8]}:bench"
    if not arguments.image:
        build(arguments.base, tag, arguments.requirements)
    distributions = distribution_names(arguments.requirements)
    try:
        plain, deep, report = rounds(tag, distributions, arguments.rounds)
    finally:
        if not arguments.image:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
    print(f"{arguments.requirements.name}: {', '.join(distributions)}")
    print(f"{arguments.rounds} round(s), medians")
    print(f"verify, top-level imports: {plain:.1f} s")
    print(f"verify, deep imports and use checks: {deep:.1f} s")
    example = arguments.requirements.resolve() == EXAMPLE
    goal = "goal: at most 1.25" if example else "no goal: measured"
    print(f"ratio: {deep / plain:.2f} ({goal})")
    show(report)


def show(report: VerifyReport) -> None:
    for figures in report.deep:
        print(
            f"  {figures.distribution}: {figures.imported} imported, {figures.failed} failed,"
            f" {figures.informational} informational, {figures.skipped} skipped,"
            f" {figures.unreached} unreached, {figures.seconds} s"
        )
    for check in report.checks:
        if check.name.startswith(("deep-", "absent ", "use ")):
            print(f"  {report.status(check).name}  {check.name}  {check.detail}")


if __name__ == "__main__":
    main()
