"""Issue 30's targets in one run: where the operator waits, against what they would use instead.

For each set (the 9-distribution upgrade set and the 16-distribution bytecode set), cold means
empty tool and uv caches and a base made for that build (so BuildKit holds no snapshot of it):

(i)   plan only (`--no-build`, a base in the test registry) against uv's own resolve
      (`uv pip compile`) + download and unpack (`uv pip install --target`), interleaved,
      --rounds of each; the medians and their ratio (target <= 1.3x);
(ii)  cold requirements -> verified image (no push) against the hand-written multi-stage
      Dockerfile (`pip install`, which compiles bytecode too); beside it the same cold build
      without verification (target >= 2x faster, for the verified image); and where the
      verified build's time went (report.json's `seconds`: build, load, facts, verify);
(iii) the peak memory of that cold build: the largest sum of proportional set sizes (PSS: a
      page shared by n processes counts 1/n in each) over the tool's process tree (the tool, uv,
      its inspection workers, the verification's clients; not the engine's processes, where
      BuildKit, the compile container and the sandbox under test run), sampled every 0.1 s
      (target <= 500 MB);
(iv)  a second template sharing most of its set (the set without its last name, plus `rich`):
      its plan and build (`--no-verify`: its own image is verified whatever it shares) in the
      first build's caches and on its base, against its own cold plan and build (target
      <= 0.5x);
(v)   a no-change rerun of the first build (`--no-verify`), median of 5 (target <= 1.0 s);
      and `build-sandbox-image --help`, the least of 5 (target <= 0.3 s).

    .venv/bin/python benchmarks/speed_targets.py [--base-image bsi-reference:test] [--rounds 2]

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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from build_vs_handwritten import CA_BUNDLE, DOCKER, HANDWRITTEN, derived_base  # noqa: E402
from bytecode import DEFAULT_SET  # noqa: E402
from upgrade import ISSUE_SET, PLATFORM, push, timed  # noqa: E402

TOOL = [sys.executable, "-m", "builder"]
UV = str(Path(sys.executable).parent / "uv")
SECOND_ADDS = "rich"  # pure Python with a few dependencies of its own (pygments is large)


@dataclass(frozen=True)
class Measured:
    """One command's run: wall and CPU seconds (it and the processes it waited for), and the
    peak of its process tree's summed proportional set size in bytes."""

    wall: float
    cpu: float
    peak: int


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

    def sample() -> None:
        nonlocal peak
        while process.poll() is None:
            peak = max(peak, tree_pss(process.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, err = process.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    if process.returncode != 0:
        sys.exit(f"error: {' '.join(command[:6])} ... failed:\n{err.decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measured(wall, cpu, peak)


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

    def handwritten(self, requirements: Path, apt: str) -> Measured:
        hand, env = self.fresh(f"hand-{uuid.uuid4().hex[:6]}")
        (hand / "Dockerfile").write_text(HANDWRITTEN.replace("{apt}", apt))
        (hand / "requirements.txt").write_text(requirements.read_text())
        tag = f"bsi-speed-hand-{uuid.uuid4().hex[:8]}"
        self.images.append(tag)
        return measured([DOCKER, "build", "-t", tag, "--build-arg", f"BASE_IMAGE={self.base()}",
                         "--secret", f"id=ca,src={CA_BUNDLE}", str(hand)], env)  # fmt: skip

    def remove_images(self) -> None:
        for image in self.images:
            subprocess.run([DOCKER, "rmi", "-f", image], capture_output=True)


def plan_against_uv(
    bench: Bench, requirements: Path, rounds: int
) -> tuple[list[float], list[float]]:
    """(i): cold plans and cold uv runs, interleaved."""
    registry_base = bench.base(pushed=True)
    target = ["--python-platform", PLATFORM, "--python-version", "3.13", "--only-binary", ":all:"]
    plans, uvs = [], []
    for _ in range(rounds):
        where, env = bench.fresh(f"plan-{uuid.uuid4().hex[:6]}")
        plans.append(timed([*TOOL, "-r", str(requirements), "--base-image", registry_base,
                            "--arch", "amd64", "--no-build", "--output", str(where / "context"),
                            "--cache-dir", str(where / "cache")], env, cwd=REPO))  # fmt: skip
        where, env = bench.fresh(f"uv-{uuid.uuid4().hex[:6]}")
        lock = where / "lock.txt"
        spent = timed([UV, "pip", "compile", *target, "--generate-hashes", "-o", str(lock),
                       str(requirements)], env)  # fmt: skip
        spent += timed([UV, "pip", "install", *target, "--target", str(where / "t"), "--python",
                        sys.executable, "-r", str(lock)], env)  # fmt: skip
        uvs.append(spent)
    return plans, uvs


def one_set(bench: Bench, names: list[str], rounds: int) -> None:
    label = f"{len(names)} names ({' '.join(names)})"
    requirements = bench.work / f"requirements-{len(names)}-{uuid.uuid4().hex[:4]}.txt"
    requirements.write_text("\n".join(names) + "\n")
    second = requirements.with_name(f"second-{requirements.name}")
    second.write_text("\n".join([*names[:-1], SECOND_ADDS]) + "\n")

    plans, uvs = plan_against_uv(bench, requirements, rounds)
    first, env_first = bench.fresh(f"first-{uuid.uuid4().hex[:6]}")
    first_base = bench.base()
    cold = measured(bench.ours(requirements, first_base, first), env_first)
    report = json.loads((first / "context" / "report.json").read_text())
    distributions = len(report["architectures"]["amd64"]["packages"])
    apt = " ".join(report["architectures"]["amd64"]["apt_packages"]) or "ca-certificates"
    hand = bench.handwritten(requirements, apt)
    unverified_where, env_unverified = bench.fresh(f"unverified-{uuid.uuid4().hex[:6]}")
    unverified = measured(
        bench.ours(requirements, bench.base(), unverified_where, "--no-verify"), env_unverified
    )
    rerun_command = bench.ours(requirements, first_base, first, "--no-verify")
    measured(rerun_command, env_first)  # once: the same plan and image under a --no-verify run
    reruns = [timed(rerun_command, env_first, cwd=REPO) for _ in range(5)]
    second_cold_where, env_second = bench.fresh(f"second-{uuid.uuid4().hex[:6]}")
    second_cold = measured(
        bench.ours(second, bench.base(), second_cold_where, "--no-verify"), env_second
    )
    # the second template on the first one's base and in its caches, as a platform's would be
    second_warm = measured(bench.ours(second, first_base, first, "--no-verify"), env_first)

    plan, uv = statistics.median(plans), statistics.median(uvs)
    each = " ".join(f"{t:.1f}" for t in plans), " ".join(f"{t:.1f}" for t in uvs)
    print(f"\nset of {label}: {distributions} distributions")
    print(f"(i)   plan only, cold: ours {plan:6.1f} s   uv {uv:6.1f} s   {plan / uv:5.2f}x"
          f" (target <= 1.3x; medians of {rounds}: ours"
          f" {each[0]}, uv {each[1]})")  # fmt: skip
    print(f"(ii)  cold -> verified image: ours {cold.wall:6.1f} s   hand-written {hand.wall:6.1f} s"
          f"   {hand.wall / cold.wall:5.2f}x faster (target >= 2x); unverified ours"
          f" {unverified.wall:.1f} s: {hand.wall / unverified.wall:.2f}x")  # fmt: skip
    spent = report["image"]["seconds"]  # this arch's phases, as report.json records them
    phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in spent.items())
    planned = cold.wall - sum(spent.values())
    print(f"      the verified build's {cold.wall:.1f} s: plan and layers {planned:.1f} s,"
          f" {phases}")  # fmt: skip
    peaks = cold.peak / 2**20, unverified.peak / 2**20
    print(f"(iii) peak memory of the cold build: {peaks[0]:.0f} MiB (target <= 500 MB;"
          f" unverified {peaks[1]:.0f} MiB); the tool's CPU {cold.cpu:.1f} s")  # fmt: skip
    print(f"(iv)  second template (+{SECOND_ADDS}, -{names[-1]}): after the first"
          f" {second_warm.wall:6.1f} s, cold {second_cold.wall:6.1f} s:"
          f" {second_warm.wall / second_cold.wall:5.2f}x (target <= 0.5x)")  # fmt: skip
    print(f"(v)   no-change rerun: {statistics.median(reruns):.2f} s median of 5"
          f" ({' '.join(f'{t:.2f}' for t in reruns)}; target <= 1.0 s)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument("--rounds", type=int, default=2, help="plan-only runs of each (i)")
    parser.add_argument("--sets", default="9,16", help="which sets: 9, 16 or both")
    args = parser.parse_args()
    test_env = json.loads((REPO / ".test-env.json").read_text())
    login = (test_env["registry_user"], test_env["registry_password"])
    help_time = min(timed([*TOOL, "--help"], dict(os.environ), cwd=REPO) for _ in range(5))
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f};"
          f" --help {help_time:.2f} s (least of 5; target <= 0.3 s)")  # fmt: skip
    sets = {"9": ISSUE_SET.split(), "16": DEFAULT_SET.split()}
    with tempfile.TemporaryDirectory(prefix="bsi-speed-") as temp:
        bench = Bench(Path(temp), args.base_image, test_env["registry"], login)
        try:
            for name in args.sets.split(","):
                one_set(bench, sets[name], args.rounds)
        finally:
            bench.remove_images()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
