"""Issue 38's targets (and issue 30's) in one run: where the operator waits, against what
they would use instead.

For each set (by default issue 38's six names; also the 9-distribution upgrade set and the
16-distribution bytecode set), cold means empty tool and uv caches and a base made for that
build (so BuildKit holds no snapshot of it):

(i)   plan only (`--no-build`, a base in the test registry) against uv's own resolve
      (`uv pip compile`) + download and unpack (`uv pip install --target`), interleaved,
      --rounds of each; the medians and their ratio (target <= 1.3x); and the last plan's
      timeline (report.json's `timeline`: each step, each wheel's arrival, inspection and
      layer) beside how busy the machine's cores were in each second;
(ii)  cold requirements -> image (`--no-verify`, no push) against the hand-written multi-stage
      Dockerfile (`pip install`, which compiles bytecode too; target >= 2x faster), with its
      timeline (each wheel's compile too); then the same cold build verified, against the same
      hand-written build (target >= 1.0x), and where its time went (report.json's `seconds`:
      build, load, facts, verify);
(iii) the peak memory of the cold builds: the largest sum of proportional set sizes (PSS: a
      page shared by n processes counts 1/n in each) over the tool's process tree (the tool, uv,
      its inspection workers, the verification's clients; not the engine's processes, where
      BuildKit, the compile container and the sandbox under test run), sampled every 0.1 s
      (target <= 500 MB);
(iv)  with --second: a second template sharing most of its set (the set without its last
      name, plus `rich`): its build (`--no-verify`) in the first build's caches and on its base,
      against its own cold build (target <= 0.5x);
(v)   a no-change rerun of the first build (`--no-verify`), median of 5; and
      `build-sandbox-image --help`, the least of 5 (both kept as they were);
(vi)  with --fresh-runner (issue 57): the cold verified build pushed to the test registry,
      then a fresh runner's build of the set with one distribution added (FRESH_ADDS): an
      empty cache directory, a base of its own (so BuildKit holds no apt stage for it, as on
      a new runner), `--cache-from` the first push, verified and pushed; against the
      hand-written Dockerfile's cold build of the new set (target <= 0.3x), with the number
      of distributions it reused and its timeline.

The 40-library set (`--sets 40`: benchmarks/interpreter-40.txt, a hosted code interpreter's)
is issue 57's: cold and verified against the hand-written build unverified (target >= 1.0x).

    .venv/bin/python benchmarks/speed_targets.py [--base-image bsi-reference:test] [--rounds 2]
        [--sets 6,9,16,40] [--second] [--fresh-runner] [--skip-plan] [--only-fresh]

Needs the engine, the reference base, the local test registry (.test-env.json) and the index.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from build_vs_handwritten import CA_BUNDLE, DOCKER, derived_base, handwritten  # noqa: E402
from bytecode import DEFAULT_SET  # noqa: E402
from upgrade import ISSUE_SET, PLATFORM, push, timed  # noqa: E402

TOOL = [sys.executable, "-m", "builder"]
UV = str(Path(sys.executable).parent / "uv")
# Issue 38's set: pure Python (sympy, beautifulsoup4), native wheels (scikit-learn, lightgbm)
# and one the reference base already holds (pandas).
SPEED_SET = "scikit-learn matplotlib sympy lightgbm beautifulsoup4 pandas"
SECOND_ADDS = "rich"  # pure Python with a few dependencies of its own (pygments is large)
FRESH_ADDS = "tabulate"  # (vi): the one distribution a team adds (pure Python, no dependency)
INTERPRETER_SET = REPO / "benchmarks" / "interpreter-40.txt"


@dataclass(frozen=True)
class Measured:
    """One command's run: wall and CPU seconds (it and the processes it waited for), the
    peak of its process tree's summed proportional set size in bytes, and how busy the whole
    machine's CPUs were in each second of it (0..1: every core busy; the engine's work too)."""

    wall: float
    cpu: float
    peak: int
    busy: tuple[float, ...] = ()

    def core_seconds(self, last: float | None = None) -> float:
        """The whole machine's busy core-seconds over the run (or its `last` seconds): the CPU
        work the run and everything beside it took, the engine's included."""
        seconds = self.busy if last is None else self.busy[-max(1, round(last)) :]
        return sum(seconds) * (os.cpu_count() or 1)


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core together, from /proc/stat. Busy leaves out idle,
    iowait and steal (time the hypervisor gave another machine: not this run's work)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4] + fields[7]  # idle, iowait and steal
    return sum(fields) - idle, sum(fields)


def tree_pss(root: int) -> int:
    """Proportional set size in bytes of `root` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone between the listing and the read
                continue
            children.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next(int(line.split()[1]) * 1024 for line in rollup.splitlines()
                      if line.startswith("Pss:"))  # fmt: skip
    return total


def measured(command: list[str], env: dict[str, str]) -> Measured:
    """Run `command` to the end (failing loudly), sampling its tree's memory meanwhile."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    peak = 0
    busy: list[float] = []

    def sample() -> None:
        nonlocal peak
        second, last = start, cpu_ticks()
        while process.poll() is None:
            peak = max(peak, tree_pss(process.pid))
            time.sleep(0.1)
            if time.perf_counter() - second >= 1.0:
                now = cpu_ticks()
                busy.append((now[0] - last[0]) / max(1, now[1] - last[1]))
                second, last = time.perf_counter(), now

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, err = process.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    if process.returncode != 0:
        sys.exit(f"error: {' '.join(command[:6])} ... failed:\n{err.decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measured(wall, cpu, peak, tuple(busy))


def show_timeline(report: dict[str, Any], measured: Measured | None = None) -> None:
    """report.json's `timeline`: each step's span, each wheel's stages (seconds from the run's
    start), and how busy the machine's cores were second by second: what the run waited on."""
    timeline = report.get("timeline") or {}
    steps = ", ".join(
        f"{name} {a:.1f}-{b:.1f}" for name, (a, b) in timeline.get("steps", {}).items()
    )
    print(f"      steps (s): {steps}")
    image = report.get("image", {}).get("seconds")
    if image:
        print(f"      then (s): {', '.join(f'{k} {v:.1f}' for k, v in image.items())}")
    print(f"      {'wheel':<44}{'arrived':>8}{'inspected':>10}{'laid out':>9}{'compiled':>9}")
    for wheel, stages in timeline.get("wheels", {}).items():
        cells = "".join(f"{stages[stage]:>{width}.1f}" if stage in stages else f"{'-':>{width}}"
                        for stage, width in (("arrived", 8), ("inspected", 10), ("laid_out", 9),
                                             ("compiled", 9)))  # fmt: skip
        print(f"      {wheel[:43]:<44}{cells}")
    if measured is not None and measured.busy:
        strip = " ".join(f"{round(100 * b):d}" for b in measured.busy)
        saturated = sum(1 for b in measured.busy if b >= 0.9)
        print(f"      machine CPU busy %, each second: {strip}")
        print(f"      every core busy (>= 90 %) for {saturated} of {len(measured.busy)} s")


class Bench:
    """One run's work directory, environment and the images it made (removed at the end)."""

    def __init__(self, work: Path, parent: str, registry: str, login: tuple[str, str]) -> None:
        self.work, self.parent, self.registry, self.login = work, parent, registry, login
        self.images: list[str] = []
        self.env = {**os.environ, "DOCKER_BUILDKIT": "1", "BSI_REGISTRY_USER": login[0],
                    "BSI_REGISTRY_PASSWORD": login[1]}  # fmt: skip

    def fresh(self, name: str) -> tuple[Path, dict[str, str]]:
        """A directory with its own empty tool and uv caches."""
        where = self.work / name
        where.mkdir()
        return where, {
            **self.env,
            "UV_CACHE_DIR": str(where / "uv"),
            "UV_PYTHON_DOWNLOADS": "never",
        }

    def base(self, pushed: bool = False) -> str:
        """A base made for one build: the parent and a layer naming it (pushed: to the registry)."""
        stamp = uuid.uuid4().hex[:8]
        tag = f"bsi-speed-{stamp}/base:1"
        tag = f"{self.registry}/{tag}" if pushed else tag
        derived_base(self.parent, tag, stamp, self.work)
        self.images.append(tag)
        if pushed:
            push(tag, *self.login)
        return tag

    def ours(self, requirements: Path, base: str, where: Path, *extra: str) -> list[str]:
        tag = f"bsi-speed-{uuid.uuid4().hex[:8]}"
        self.images.append(tag)
        return [*TOOL, "-r", str(requirements), "--base-image", base, "--tag", tag, "--output",
                str(where / "context"), "--cache-dir", str(where / "cache"), *extra]  # fmt: skip

    def repository(self) -> str:
        """A repository of the test registry of its own: what (vi) pushes to."""
        return f"{self.registry}/bsi-speed-{uuid.uuid4().hex[:8]}/sandbox"

    def handwritten(self, requirements: Path, apt: list[str]) -> Measured:
        """The hand-written Dockerfile's cold build, `apt` typed into its apt step."""
        hand, env = self.fresh(f"hand-{uuid.uuid4().hex[:6]}")
        (hand / "Dockerfile").write_text(handwritten(apt))
        (hand / "requirements.txt").write_text(requirements.read_text())
        tag = f"bsi-speed-hand-{uuid.uuid4().hex[:8]}"
        self.images.append(tag)
        return measured([DOCKER, "build", "-t", tag, "--build-arg", f"BASE_IMAGE={self.base()}",
                         "--secret", f"id=ca,src={CA_BUNDLE}", str(hand)], env)  # fmt: skip

    def remove_images(self) -> None:
        for image in self.images:
            subprocess.run([DOCKER, "rmi", "-f", image], capture_output=True)


@dataclass(frozen=True)
class PlanRuns:
    """(i)'s interleaved cold runs: ours and uv's walls, and our last run with its report."""

    ours: list[float]
    uv: list[float]
    last: Measured
    report: dict[str, Any]


def plan_against_uv(bench: Bench, requirements: Path, rounds: int) -> PlanRuns:
    """(i): cold plans and cold uv runs, interleaved."""
    registry_base = bench.base(pushed=True)
    target = ["--python-platform", PLATFORM, "--python-version", "3.13", "--only-binary", ":all:"]
    plans, uvs = [], []
    for _ in range(rounds):
        where, env = bench.fresh(f"plan-{uuid.uuid4().hex[:6]}")
        last = measured([*TOOL, "-r", str(requirements), "--base-image", registry_base,
                         "--arch", "amd64", "--no-build", "--output", str(where / "context"),
                         "--cache-dir", str(where / "cache")], env)  # fmt: skip
        plans.append(last.wall)
        report = json.loads((where / "context" / "report.json").read_text())
        where, env = bench.fresh(f"uv-{uuid.uuid4().hex[:6]}")
        lock = where / "lock.txt"
        spent = timed([UV, "pip", "compile", *target, "--generate-hashes", "-o", str(lock),
                       str(requirements)], env)  # fmt: skip
        spent += timed([UV, "pip", "install", *target, "--target", str(where / "t"), "--python",
                        sys.executable, "-r", str(lock)], env)  # fmt: skip
        uvs.append(spent)
    return PlanRuns(plans, uvs, last, report)


def fresh_runner(bench: Bench, requirements: Path, first_base: str) -> None:
    """(vi): the set pushed, then the set plus FRESH_ADDS built by a fresh runner (an empty
    cache, a base BuildKit has not seen) from that push, against the hand-written build."""
    repository = bench.repository()
    pushed_where, env = bench.fresh(f"pushed-{uuid.uuid4().hex[:6]}")
    seed = bench.ours(requirements, first_base, pushed_where, "--push", repository, "--no-verify")
    measured(seed, env)  # what a previous CI run pushed (verified or not: the same layers)
    pushed = json.loads((pushed_where / "context" / "report.json").read_text())["image"]["pushed"]
    added = requirements.with_name(f"added-{requirements.name}")
    added.write_text(requirements.read_text() + f"{FRESH_ADDS}\n")
    runner, env_runner = bench.fresh(f"runner-{uuid.uuid4().hex[:6]}")
    fresh = measured(
        bench.ours(added, bench.base(), runner, "--push", repository, "--cache-from", pushed),
        env_runner,
    )
    report = json.loads((runner / "context" / "report.json").read_text())
    hand = bench.handwritten(added, report["architectures"]["amd64"]["apt_packages"])
    seeded = report.get("cache_from") or {}
    reused = f"{seeded.get('reused', 0)} of {seeded.get('distributions', '?')} distributions"
    print(f"(vi)  fresh runner, +{FRESH_ADDS}, --cache-from the last push, verified and pushed:"
          f" {fresh.wall:6.1f} s, hand-written cold {hand.wall:6.1f} s:"
          f" {fresh.wall / hand.wall:5.2f}x (target <= 0.3x); reused {reused}")  # fmt: skip
    show_timeline(report, fresh)


def fresh_alone(bench: Bench, names: list[str]) -> None:
    """(vi) without (i)-(v): the set's first push on a base of its own, then the fresh runner."""
    requirements = bench.work / f"requirements-{len(names)}-{uuid.uuid4().hex[:4]}.txt"
    requirements.write_text("\n".join(names) + "\n")
    print(f"\nset of {len(names)} names")
    fresh_runner(bench, requirements, bench.base())


def one_set(
    bench: Bench, names: list[str], rounds: int, second_template: bool, fresh: bool = False
) -> None:
    label = f"{len(names)} names ({' '.join(names)})"
    requirements = bench.work / f"requirements-{len(names)}-{uuid.uuid4().hex[:4]}.txt"
    requirements.write_text("\n".join(names) + "\n")
    second = requirements.with_name(f"second-{requirements.name}")
    second.write_text("\n".join([*names[:-1], SECOND_ADDS]) + "\n")

    runs = plan_against_uv(bench, requirements, rounds)
    unverified_where, env_unverified = bench.fresh(f"unverified-{uuid.uuid4().hex[:6]}")
    unverified = measured(
        bench.ours(requirements, bench.base(), unverified_where, "--no-verify"), env_unverified
    )
    built = json.loads((unverified_where / "context" / "report.json").read_text())
    distributions = len(built["architectures"]["amd64"]["packages"])
    hand = bench.handwritten(requirements, built["architectures"]["amd64"]["apt_packages"])
    first, env_first = bench.fresh(f"first-{uuid.uuid4().hex[:6]}")
    first_base = bench.base()
    cold = measured(bench.ours(requirements, first_base, first), env_first)
    report = json.loads((first / "context" / "report.json").read_text())
    rerun_command = bench.ours(requirements, first_base, first, "--no-verify")
    measured(rerun_command, env_first)  # once: the same plan and image under a --no-verify run
    reruns = [timed(rerun_command, env_first, cwd=REPO) for _ in range(5)]

    plan, uv = statistics.median(runs.ours), statistics.median(runs.uv)
    each = " ".join(f"{t:.1f}" for t in runs.ours), " ".join(f"{t:.1f}" for t in runs.uv)
    print(f"\nset of {label}: {distributions} distributions")
    print(f"(i)   plan only, cold: ours {plan:6.1f} s   uv {uv:6.1f} s   {plan / uv:5.2f}x"
          f" (target <= 1.3x; medians of {rounds}: ours"
          f" {each[0]}, uv {each[1]}); the last plan:")  # fmt: skip
    show_timeline(runs.report, runs.last)
    print(f"(ii)  cold -> image (--no-verify): ours {unverified.wall:6.1f} s   hand-written"
          f" {hand.wall:6.1f} s   {hand.wall / unverified.wall:5.2f}x faster (target >= 2x);"
          f" the tool's CPU {unverified.cpu:.1f} s:")  # fmt: skip
    show_timeline(built, unverified)
    spent = report["image"]["seconds"]  # this arch's phases, as report.json records them
    phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in spent.items())
    planned = cold.wall - sum(spent.values())
    print(f"      cold -> verified image: ours {cold.wall:.1f} s: {hand.wall / cold.wall:.2f}x the"
          f" hand-written build's speed (target >= 1.0x); plan and layers {planned:.1f} s,"
          f" {phases}")  # fmt: skip
    peaks = cold.peak / 2**20, unverified.peak / 2**20
    capacity = hand.wall * (os.cpu_count() or 1)
    print(f"      machine CPU work (busy core-seconds): hand-written {hand.core_seconds():.0f},"
          f" ours unverified {unverified.core_seconds():.0f}, verified {cold.core_seconds():.0f}"
          f" (its verification {cold.core_seconds(spent.get('verify')):.0f}); the cores give"
          f" {capacity:.0f} in the hand-written build's {hand.wall:.1f} s")  # fmt: skip
    print(f"(iii) peak memory of the cold build: {peaks[0]:.0f} MiB (target <= 500 MB;"
          f" unverified {peaks[1]:.0f} MiB); the tool's CPU {cold.cpu:.1f} s")  # fmt: skip
    print(f"(v)   no-change rerun: {statistics.median(reruns):.2f} s median of 5"
          f" ({' '.join(f'{t:.2f}' for t in reruns)}; target <= 1.0 s)")  # fmt: skip
    if fresh:
        fresh_runner(bench, requirements, first_base)
    if not second_template:
        return
    second_cold_where, env_second = bench.fresh(f"second-{uuid.uuid4().hex[:6]}")
    second_cold = measured(
        bench.ours(second, bench.base(), second_cold_where, "--no-verify"), env_second
    )
    # the second template on the first one's base and in its caches, as a platform's would be
    second_warm = measured(bench.ours(second, first_base, first, "--no-verify"), env_first)
    print(f"(iv)  second template (+{SECOND_ADDS}, -{names[-1]}): after the first"
          f" {second_warm.wall:6.1f} s, cold {second_cold.wall:6.1f} s:"
          f" {second_warm.wall / second_cold.wall:5.2f}x (target <= 0.5x)")  # fmt: skip


def interpreter_set() -> list[str]:
    """The 40 names of benchmarks/interpreter-40.txt, its comments left out."""
    lines = (line.partition("#")[0].strip() for line in INTERPRETER_SET.read_text().splitlines())
    return [line for line in lines if line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument("--rounds", type=int, default=2, help="plan-only runs of each (i)")
    parser.add_argument("--sets", default="6", help="which sets, comma-separated: 6, 9, 16")
    parser.add_argument("--second", action="store_true", help="also (iv), a second template")
    parser.add_argument("--fresh-runner", action="store_true", help="also (vi), --cache-from")
    parser.add_argument("--skip-plan", action="store_true", help="(i) with one round only")
    parser.add_argument("--only-fresh", action="store_true", help="(vi) alone, on each set")
    args = parser.parse_args()
    test_env = json.loads((REPO / ".test-env.json").read_text())
    login = (test_env["registry_user"], test_env["registry_password"])
    help_time = min(timed([*TOOL, "--help"], dict(os.environ), cwd=REPO) for _ in range(5))
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f};"
          f" --help {help_time:.2f} s (least of 5; target <= 0.3 s)")  # fmt: skip
    sets = {"6": SPEED_SET.split(), "9": ISSUE_SET.split(), "16": DEFAULT_SET.split(),
            "40": interpreter_set()}  # fmt: skip
    rounds = 1 if args.skip_plan else args.rounds
    with tempfile.TemporaryDirectory(prefix="bsi-speed-") as temp:
        bench = Bench(Path(temp), args.base_image, test_env["registry"], login)
        try:
            for name in args.sets.split(","):
                if args.only_fresh:
                    fresh_alone(bench, sets[name])
                else:
                    one_set(bench, sets[name], rounds, args.second, args.fresh_runner)
        finally:
            bench.remove_images()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
