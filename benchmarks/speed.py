"""Where a cold plan and a cold build spend their time, and what the start costs (issue 30).

One run of each, printed as tables; docs/performance.md has the figures and their reading.

(i)   A cold plan (`--no-build`) and a cold build (`--no-verify`, no push, on a base made for
      the run) of the same set, each with empty tool and uv caches, sampled by py-spy: every
      thread and every Python subprocess, waiting included. For each: the wall; the CPU of the
      tool and the processes it waited for (uv, the inspection workers; not the engine's);
      thread-seconds by phase summed over every thread, waiting on I/O included (above the
      wall: work that overlapped; a phase is the innermost builder module on a sampled stack);
      and the lines of builder code the main thread spent most of its wall in (what the run
      waits on).
(ii)  The bytecode compile alone, cold: one worker against one per core (bytecode.COMPILERS),
      each distribution in its own fresh interpreter either way.
(iii) The start: `--help` and `import builder.cli.app` (the least of 5), and a no-change
      rerun of the build (median of 5).

    .venv/bin/python benchmarks/speed.py [--base-image bsi-reference:test] [-r FILE]

Needs py-spy (the test extras), the engine, the reference base and the index.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from bytecode import (  # noqa: E402
    CREATED,
    DEFAULT_SET,
    build_command,
    compile_alone,
    remove_created,
    timed_cpu,
    wheels_of,
)
from upgrade import derived_base, timed  # noqa: E402

from builder.cache import Cache  # noqa: E402
from builder.layers.bytecode import COMPILERS  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"
RATE = 50  # samples per second and thread
# The innermost builder module on a stack names its phase: the first rule that matches wins.
PHASES = (
    ("imports at start", ("<module> (",)),
    ("base probe", ("builder/base/",)),
    ("resolution (uv), stale picks", ("resolve/uv.py", "resolve/stale.py")),
    ("downloads", ("resolve/index.py",)),
    (
        "wheel inspection: ELF, run-time loads",
        ("inspect/wheel_reader.py", "inspect/wheels.py", "inspect/elf.py"),
    ),
    ("wheel inspection: ELF, run-time loads", ("inspect/loads.py",)),
    ("planning: natives, Debian packages", ("builder/plan/",)),
    ("bytecode compile (waiting on the engine)", ("layers/bytecode.py",)),
    ("layer writing and hashing", ("layers/layer.py", "layers/extras.py", "builder/cache/")),
    ("gzip of layers for the push", ("layers/gzipped.py",)),
    ("BuildKit system stage", ("assemble/build.py", "orchestration/produce_build.py")),
    ("assembly: docker load and save", ("assemble/assemble.py", "assemble/saved.py")),
    ("orchestration: waiting on the steps above", ("builder/orchestration/",)),
    ("render, report, the rest of builder", ("builder/",)),
)


@dataclass(frozen=True)
class Profiled:
    """One profiled run: wall and CPU seconds, and seconds by phase."""

    wall: float
    cpu: float
    main: Counter[str]  # the main thread's wall seconds by its innermost builder frame
    threads: Counter[str]  # seconds by phase over every thread and Python subprocess


def phase_of(frames: list[str]) -> str | None:
    """The phase of one stack (root first), None for a thread with no builder frame (idle)."""
    ours = [frame for frame in frames if "/builder/" in frame]
    if not ours:
        return None
    innermost = ours[-1]
    if any(f.startswith("_find_and_load") for f in frames[frames.index(innermost) :]):
        return PHASES[0][0]  # importing, below a builder frame
    return next(name for name, marks in PHASES if any(mark in innermost for mark in marks))


def profiled(command: list[str], env: dict[str, str], work: Path) -> Profiled:
    """`command` under py-spy (raw samples, idle threads included), and what they say."""
    samples = work / f"samples-{uuid.uuid4().hex[:6]}.txt"
    spy = [str(PY_SPY), "record", "--format", "raw", "--output", str(samples), "--idle",
           "--threads", "--subprocesses", "--full-filenames",
           "--rate", str(RATE), "--"]  # fmt: skip
    wall, cpu = timed_cpu([*spy, *command], env)
    main: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in samples.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        phase = phase_of(frames)
        if phase is None:
            continue
        threads[phase] += int(count) / RATE
        # the tool's main thread (py-spy names a thread only when it can read the name)
        if " -m builder " in frames[0] and frames[2].startswith("_run_module_as_main"):
            innermost = [frame for frame in frames if "/builder/" in frame][-1]
            main[innermost.replace(f"{REPO}/", "")] += int(count) / RATE
    return Profiled(wall, cpu, main, threads)


def least(command: list[str], times: int) -> float:
    return min(timed(command, dict(os.environ), cwd=REPO) for _ in range(times))


def show(title: str, run: Profiled) -> None:
    busy = sum(run.threads.values())
    print(f"\n{title}: wall {run.wall:.1f} s, CPU {run.cpu:.1f} s (tool, uv, workers)")
    print(f"  thread-seconds in builder code: {busy:.1f} ({busy / run.wall:.2f}x the wall)")
    for phase in dict.fromkeys(name for name, _ in PHASES):
        if run.threads[phase]:
            print(f"  {phase:44s} {run.threads[phase]:6.1f} s")
    print("  where the main thread spent its wall:")
    for frame, seconds in run.main.most_common(8):
        print(f"    {seconds:6.1f} s  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument("-r", type=Path, help=f"requirements (default: {DEFAULT_SET.split()})")
    args = parser.parse_args()
    if not PY_SPY.exists():
        sys.exit("error: py-spy is not installed in this venv (pip install -e '.[test]')")
    names = " ".join((args.r.read_text() if args.r else DEFAULT_SET).split())
    print(f"set: {names}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    help_time = least([sys.executable, "-m", "builder", "--help"], 5)
    import_time = least([sys.executable, "-c", "import builder.cli.app"], 5)
    print(f"start: --help {help_time:.2f} s, import builder.cli.app {import_time:.2f} s"
          f" (least of 5; target for --help 0.3 s)")  # fmt: skip
    client = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="bsi-speed-") as temp:
        work = Path(temp)
        requirements = work / "requirements.txt"
        requirements.write_text(names.replace(" ", "\n") + "\n")
        base = f"bsi-bench-speed-{uuid.uuid4().hex[:8]}/base:1"
        derived_base(args.base_image, base, base, work)
        CREATED.append(base)
        try:
            for kind, extra in (("plan", ("--no-build",)), ("build", ())):
                (work / kind).mkdir()
                env = {**os.environ, "UV_CACHE_DIR": str(work / kind / "uv")}
                command = build_command(requirements, base, work / kind, *extra)
                show(f"cold {kind}", profiled(command, env, work / kind))
            rerun = statistics.median(timed(command, env, cwd=REPO) for _ in range(5))
            print(f"\nno-change rerun of the build: {rerun:.2f} s (median of 5; target 1.0 s)")
            report = json.loads((work / "build" / "context" / "report.json").read_text())
            wheels = wheels_of(report, Cache(work / "build" / "cache"))
            compiles = {
                workers: compile_alone(client, base, wheels, work / f"compile-{workers}", workers)
                for workers in (1, COMPILERS)
            }
        finally:
            remove_created(client)
    (one_wall, one_cpu), (many_wall, many_cpu) = compiles[1], compiles[COMPILERS]
    print(f"compile alone, cold, {len(wheels)} wheels: 1 worker {one_wall:.1f} s"
          f" ({one_cpu:.1f} CPU s); {COMPILERS} workers {many_wall:.1f} s"
          f" ({many_cpu:.1f} CPU s): {one_wall / many_wall:.2f}x;"
          f" load average {os.getloadavg()[0]:.1f} at the end")  # fmt: skip


if __name__ == "__main__":
    main()
