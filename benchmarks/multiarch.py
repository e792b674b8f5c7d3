"""Both arches against amd64 only, in one run, and the share of the time spent under emulation.

Each measured build starts from a base no image was built from before (the two-arch base given,
relabelled per run and pushed as a new index), so BuildKit's cache cannot hide the apt step.
The tool runs as a user runs it (build, verify hardened, no push); its output is timestamped
line by line: BuildKit's `#N DONE <s>` lines give each arm64 step's time, and an arm64 RUN step
outside the builder stage is emulated, as is the arm64 verification.

    BSI_REGISTRY_USER=… BSI_REGISTRY_PASSWORD=… .venv/bin/python benchmarks/multiarch.py \\
        --base 127.0.0.1:5000/team/runtime:1.0 [-r requirements.txt]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from builder.assemble.build import BuildSpec, build_image  # noqa: E402
from builder.assemble.from_engine import push_engine_images  # noqa: E402
from builder.credentials import from_environment, registry  # noqa: E402
from builder.engines.connection import engine_client  # noqa: E402
from builder.oci.name import ImageRef  # noqa: E402

STEP = re.compile(r"^\[arm64\] #(\d+) \[(.+?)\] (RUN .*)$")
DONE = re.compile(r"^\[arm64\] #(\d+) DONE ([0-9.]+)s$")


def fresh_base(base: str, arches: list[str], temp: Path) -> str:
    """`base` with a new label per arch, pushed as a new index: nothing is cached for it."""
    client = engine_client()
    if client is None:
        sys.exit("no Docker engine")
    ref = ImageRef.parse(base, "--base")
    run = uuid.uuid4().hex[:8]
    (temp / "Dockerfile").write_text(f"ARG BASE\nFROM ${{BASE}}\nLABEL bench.run={run}\n")
    login = from_environment()
    images = {
        arch: build_image(
            temp,
            BuildSpec(
                tag=f"bsi-bench-{run}:{arch}",
                platform=f"linux/{arch}",
                build_args={"BASE": base},
                logins={ref.registry: login} if login else None,
            ),
            open("/dev/null", "w"),  # noqa: SIM115
        )
        for arch in arches
    }
    repository = ImageRef.parse_repository(f"{ref.registry}/bsi-bench-{run}/base")
    push_engine_images(client, images, registry(repository), ["1.0"], ref)
    return f"{repository}:1.0"


def timed(requirements: Path, base: str, arches: list[str], work: Path) -> tuple[float, float]:
    """Wall time of one run and the seconds of it spent under emulation."""
    command = [sys.executable, "-m", "builder", "-r", str(requirements), "--base-image", base,
               "--output", str(work / "context"), "--cache-dir", str(work / "cache")]  # fmt: skip
    command += [f"--arch={arch}" for arch in arches]
    start = time.perf_counter()
    steps: dict[str, str] = {}
    emulated = 0.0
    verify_start = None
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        if match := STEP.match(line):
            steps[match.group(1)] = match.group(2)
        elif (match := DONE.match(line)) and not steps.get(match.group(1), "builder").startswith(
            "builder"
        ):
            emulated += float(match.group(2))
        elif line.startswith("verifying arm64"):
            verify_start = time.perf_counter()
        elif verify_start is not None and line.startswith("verify "):
            emulated += time.perf_counter() - verify_start
            verify_start = None
    if process.wait() != 0:
        sys.exit(f"{' '.join(command)} failed")
    return time.perf_counter() - start, emulated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a two-arch reference base (host/repo:tag)")
    parser.add_argument("-r", type=Path, default=None, help="requirements (default: lightgbm)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bsi-bench-") as temp:
        work = Path(temp)
        requirements = args.r or work / "requirements.txt"
        if args.r is None:
            requirements.write_text("lightgbm\n")
        (work / "base").mkdir()
        results = {}
        for arches in (["amd64"], ["amd64", "arm64"]):
            base = fresh_base(args.base, arches, work / "base")
            results[" + ".join(arches)] = timed(requirements, base, arches, work)
    amd64, _ = results["amd64"]
    both, emulated = results["amd64 + arm64"]
    print(f"requirements: {requirements.name if args.r else 'lightgbm'}; base {args.base}")
    print(f"amd64 only:      {amd64:7.1f} s (build + verify, cold apt step)")
    print(f"amd64 + arm64:   {both:7.1f} s ({both / amd64:.1f}x)")
    print(f"under emulation: {emulated:7.1f} s ({100 * emulated / both:.0f}% of the two-arch run:")
    print("                 arm64 RUN steps of the final stage + arm64 verification)")


if __name__ == "__main__":
    main()
