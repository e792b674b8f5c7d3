"""Issue 11's three ratios in one run: platform upgrade, cold build, plan only.

(i)   a platform upgrade with unchanged extras (`rebuild`, rebase path: apt layer rebuilt,
      deps-extra reused, verify, push) against a cold full delivery of the same set (build,
      verify, push); and the bytes the upgrade pushed against the image's size.
(ii)  cold requirements -> built image (`--no-verify`, no push) against a hand-written
      multi-stage Dockerfile with a plain `pip install`; and a no-change rerun.
(iii) plan only (`--no-build`), cold, against uv's own resolve + unpack of the same set: the
      median of --repeat interleaved runs of each (the index's speed varies within minutes).

Cold: empty tool and uv caches, and every build on a base made for this run (the reference plus
a layer naming the run), so no image in the engine holds a snapshot BuildKit could reuse.
BuildKit's cache is not pruned (see build_vs_handwritten: a prune beside another build crashed
the shared engine). Needs the engine, the local test registry (.test-env.json) and the index.

    .venv/bin/python benchmarks/upgrade.py [--base-image bsi-reference:test] [-r FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from build_vs_handwritten import CA_BUNDLE, DOCKER, HANDWRITTEN, derived_base  # noqa: E402

ISSUE_SET = (
    "beautifulsoup4\nlightgbm\nscikit-learn\nxgboost\nopencv-python-headless\nlxml\npyarrow\n"
    "matplotlib\npython-magic\n"
)
PLATFORM = "x86_64-manylinux_2_40"


def timed(command: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(command[:4])} failed:\n{result.stdout[-2000:]}{result.stderr}")
    return elapsed


def push(tag: str, user: str, password: str) -> None:
    import docker

    client = docker.from_env()
    repository, _, name = tag.rpartition(":")
    auth = {"username": user, "password": password}
    for event in client.api.push(repository, tag=name, auth_config=auth, stream=True, decode=True):
        if "error" in event:
            sys.exit(f"error: pushing {tag}: {event['error']}")


@dataclass(frozen=True)
class Bench:
    """What every measure of one run shares: its scratch directory, its id, the requirements,
    the registry, and the environment the tool and Docker run with."""

    work: Path
    run: str
    requirements: Path
    host: str
    env: dict[str, str]
    tool: tuple[str, ...] = (sys.executable, "-m", "builder")

    def fresh(self, name: str) -> tuple[dict[str, str], Path]:
        """A directory `name` of its own, with an empty uv cache and an empty tool cache."""
        (self.work / name).mkdir()
        return {
            **self.env,
            "UV_CACHE_DIR": str(self.work / name / "uv"),
        }, self.work / name / "cache"


def measure_upgrade(bench: Bench, runtime: str) -> tuple[float, float, dict[str, Any]]:
    """(i) A cold full delivery on platform 1.0, then the upgrade to 1.1 with the same extras:
    both times and the upgrade's report (which must have taken the rebase path)."""
    (bench.work / "pipeline").mkdir()
    config = bench.work / "pipeline" / "config.toml"
    config.write_text(
        f'requirements = ["{bench.requirements}"]\nbase-repository = "{runtime}"\n'
        f'platform-version = "1.0"\nrepository = "{bench.host}/bsi-bench-{bench.run}/sandbox"\n'
    )
    env_i, cache_i = bench.fresh("i")
    rebuild = [*bench.tool, "rebuild", "--config", str(config), "--cache-dir", str(cache_i)]
    cold_delivery = timed([*rebuild, "--platform-version", "1.0"], env_i)
    upgrade = timed([*rebuild, "--platform-version", "1.1"], env_i)
    report = json.loads((bench.work / "pipeline" / "sandbox-image" / "report.json").read_text())
    image: dict[str, Any] = report["image"]
    if image.get("path") != "rebase":
        sys.exit(f"error: the upgrade took the {image.get('path')} path, not rebase")
    return cold_delivery, upgrade, image


def measure_build(bench: Bench, own_base: str, hand_base: str) -> tuple[float, float, float]:
    """(ii) Cold requirements -> built image, ours then a no-change rerun, then the
    hand-written Dockerfile with the same apt packages: the three times."""
    env_ii, cache_ii = bench.fresh("ii")
    ours = [*bench.tool, "-r", str(bench.requirements), "--base-image", own_base, "--tag",
            f"bsi-bench-{bench.run}/ours", "--no-verify", "--output",
            str(bench.work / "ii" / "context"), "--cache-dir", str(cache_ii)]  # fmt: skip
    ours_cold = timed(ours, env_ii)
    rerun = timed(ours, env_ii)
    report = json.loads((bench.work / "ii" / "context" / "report.json").read_text())
    apt = " ".join(report["architectures"]["amd64"]["apt_packages"]) or "ca-certificates"
    hand = bench.work / "handwritten"
    hand.mkdir()
    (hand / "Dockerfile").write_text(HANDWRITTEN.replace("{apt}", apt))
    (hand / "requirements.txt").write_text(bench.requirements.read_text())
    hand_cold = timed([DOCKER, "build", "-t", f"bsi-bench-{bench.run}/hand", "--build-arg",
                       f"BASE_IMAGE={hand_base}", "--secret", f"id=ca,src={CA_BUNDLE}",
                       str(hand)], bench.env)  # fmt: skip
    return ours_cold, rerun, hand_cold


def measure_plan(bench: Bench, base: str, repeat: int) -> tuple[list[float], list[float]]:
    """(iii) Plan only, cold, against uv's own resolve and unpack: interleaved, so a change in
    the index's speed during the run falls on both alike. Each run's times, ours and uv's."""
    uv = str(Path(sys.executable).parent / "uv")
    target = ["--python-platform", PLATFORM, "--python-version", "3.13", "--only-binary",
              ":all:"]  # fmt: skip
    plans, uvs = [], []
    for attempt in range(repeat):
        env_iii, cache_iii = bench.fresh(f"iii-{attempt}")
        plans.append(timed([*bench.tool, "-r", str(bench.requirements), "--base-image", base,
                            "--arch", "amd64", "--no-build", "--output",
                            str(bench.work / f"iii-{attempt}" / "context"), "--cache-dir",
                            str(cache_iii)], env_iii))  # fmt: skip
        env_uv, _ = bench.fresh(f"uv-{attempt}")
        env_uv["UV_PYTHON_DOWNLOADS"] = "never"
        lock = bench.work / f"uv-{attempt}" / "lock.txt"
        spent = timed([uv, "pip", "compile", *target, "--generate-hashes", "-o", str(lock),
                       str(bench.requirements)], env_uv)  # fmt: skip
        spent += timed([uv, "pip", "install", *target, "--target",
                        str(bench.work / f"uv-{attempt}" / "t"), "--python", sys.executable,
                        "-r", str(lock)], env_uv)  # fmt: skip
        uvs.append(spent)
    return plans, uvs


def prepare_bases(bench: Bench, base_image: str, runtime: str) -> tuple[str, str]:
    """Bases made for this run (so no snapshot in the engine is reused): the platform's 1.0
    and 1.1 in the registry, and one base each for our build and the hand-written one."""
    user, password = bench.env["BSI_REGISTRY_USER"], bench.env["BSI_REGISTRY_PASSWORD"]
    derived_base(base_image, f"{runtime}:1.0", f"{bench.run}-1.0", bench.work)
    derived_base(f"{runtime}:1.0", f"{runtime}:1.1", f"{bench.run}-1.1", bench.work)
    for version in ("1.0", "1.1"):
        push(f"{runtime}:{version}", user, password)
    own_base, hand_base = f"bsi-bench-{bench.run}/own:1", f"bsi-bench-{bench.run}/hand:1"
    derived_base(base_image, own_base, f"{bench.run}-own", bench.work)
    derived_base(base_image, hand_base, f"{bench.run}-hand", bench.work)
    return own_base, hand_base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument("-r", type=Path, help="requirements (default: the issue's 9-package set)")
    parser.add_argument("--repeat", type=int, default=3, help="plan-only runs of each (iii)")
    args = parser.parse_args()
    test_env = json.loads((REPO / ".test-env.json").read_text())
    with tempfile.TemporaryDirectory(prefix="bsi-bench-") as temp:
        work = Path(temp)
        requirements = work / "requirements.txt"
        requirements.write_text(args.r.read_text() if args.r else ISSUE_SET)
        env = {**os.environ, "BSI_REGISTRY_USER": test_env["registry_user"],
               "BSI_REGISTRY_PASSWORD": test_env["registry_password"],
               "DOCKER_BUILDKIT": "1"}  # fmt: skip
        bench = Bench(work, uuid.uuid4().hex[:8], requirements, test_env["registry"], env)
        runtime = f"{bench.host}/bsi-bench-{bench.run}/runtime"
        own_base, hand_base = prepare_bases(bench, args.base_image, runtime)
        cold_delivery, upgrade, image = measure_upgrade(bench, runtime)
        ours_cold, rerun, hand_cold = measure_build(bench, own_base, hand_base)
        plans, uvs = measure_plan(bench, f"{runtime}:1.0", args.repeat)
        names = " ".join(requirements.read_text().split())
    plan, uv_time = statistics.median(plans), statistics.median(uvs)
    pushed, size = image["bytes_pushed"], image["image_size"]
    print(f"set: {names}")
    print(f"(i)   cold delivery {cold_delivery:6.1f} s   upgrade (rebase) {upgrade:6.1f} s   "
          f"ratio {upgrade / cold_delivery:6.1%} (target <= 15 %)")  # fmt: skip
    print(f"      bytes pushed {pushed} of image {size}: {pushed / size:6.2%} (target <= 5 %)")
    print(f"(ii)  cold: ours {ours_cold:6.1f} s   hand-written {hand_cold:6.1f} s   "
          f"{hand_cold / ours_cold:5.2f}x faster (target >= 2x)")  # fmt: skip
    print(f"      no-change rerun {rerun:5.2f} s (target <= 1.0 s)")
    print(f"(iii) plan only, cold: ours {plan:6.1f} s   uv resolve + unpack {uv_time:6.1f} s   "
          f"{plan / uv_time:5.2f}x (target <= 1.2x; medians of {args.repeat})")  # fmt: skip
    each = [" ".join(f"{t:.1f}" for t in runs) for runs in (plans, uvs)]
    print(f"      each run: ours {each[0]} s; uv {each[1]} s")


if __name__ == "__main__":
    main()
