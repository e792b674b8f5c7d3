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
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument("-r", type=Path, help="requirements (default: the issue's 9-package set)")
    parser.add_argument("--repeat", type=int, default=3, help="plan-only runs of each (iii)")
    args = parser.parse_args()
    test_env = json.loads((REPO / ".test-env.json").read_text())
    host, user, password = (
        test_env["registry"],
        test_env["registry_user"],
        test_env["registry_password"],
    )
    run = uuid.uuid4().hex[:8]
    tool = [sys.executable, "-m", "builder"]
    with tempfile.TemporaryDirectory(prefix="bsi-bench-") as temp:
        work = Path(temp)
        requirements = work / "requirements.txt"
        requirements.write_text(args.r.read_text() if args.r else ISSUE_SET)
        names = " ".join(requirements.read_text().split())
        env = {**os.environ, "BSI_REGISTRY_USER": user, "BSI_REGISTRY_PASSWORD": password,
               "DOCKER_BUILDKIT": "1"}  # fmt: skip

        def fresh(name: str) -> tuple[dict[str, str], Path]:
            (work / name).mkdir()
            return {**env, "UV_CACHE_DIR": str(work / name / "uv")}, work / name / "cache"

        runtime = f"{host}/bsi-bench-{run}/runtime"
        derived_base(args.base_image, f"{runtime}:1.0", f"{run}-1.0", work)
        derived_base(f"{runtime}:1.0", f"{runtime}:1.1", f"{run}-1.1", work)
        for version in ("1.0", "1.1"):
            push(f"{runtime}:{version}", user, password)
        own_base, hand_base = f"bsi-bench-{run}/own:1", f"bsi-bench-{run}/hand:1"
        derived_base(args.base_image, own_base, f"{run}-own", work)
        derived_base(args.base_image, hand_base, f"{run}-hand", work)

        # (i) a cold full delivery, then the platform upgrade with the same extras
        (work / "pipeline").mkdir()
        config = work / "pipeline" / "config.toml"
        config.write_text(
            f'requirements = ["{requirements}"]\nbase-repository = "{runtime}"\n'
            f'platform-version = "1.0"\nrepository = "{host}/bsi-bench-{run}/sandbox"\n'
        )
        env_i, cache_i = fresh("i")
        rebuild = [*tool, "rebuild", "--config", str(config), "--cache-dir", str(cache_i)]
        cold_delivery = timed([*rebuild, "--platform-version", "1.0"], env_i)
        upgrade = timed([*rebuild, "--platform-version", "1.1"], env_i)
        image = json.loads((work / "pipeline" / "sandbox-image" / "report.json").read_text())
        image = image["image"]
        if image.get("path") != "rebase":
            sys.exit(f"error: the upgrade took the {image.get('path')} path, not rebase")

        # (ii) cold requirements -> built image, ours and hand-written; a no-change rerun
        env_ii, cache_ii = fresh("ii")
        ours = [*tool, "-r", str(requirements), "--base-image", own_base, "--tag",
                f"bsi-bench-{run}/ours", "--no-verify", "--output", str(work / "ii" / "context"),
                "--cache-dir", str(cache_ii)]  # fmt: skip
        ours_cold = timed(ours, env_ii)
        rerun = timed(ours, env_ii)
        report = json.loads((work / "ii" / "context" / "report.json").read_text())
        apt = " ".join(report["architectures"]["amd64"]["apt_packages"]) or "ca-certificates"
        hand = work / "handwritten"
        hand.mkdir()
        (hand / "Dockerfile").write_text(HANDWRITTEN.replace("{apt}", apt))
        (hand / "requirements.txt").write_text(requirements.read_text())
        hand_cold = timed([DOCKER, "build", "-t", f"bsi-bench-{run}/hand", "--build-arg",
                           f"BASE_IMAGE={hand_base}", "--secret", f"id=ca,src={CA_BUNDLE}",
                           str(hand)], env)  # fmt: skip

        # (iii) plan only, cold, against uv's own resolve and unpack: interleaved, so a change in
        # the index's speed during the run falls on both alike; the median of the runs counts
        uv = str(Path(sys.executable).parent / "uv")
        target = ["--python-platform", PLATFORM, "--python-version", "3.13", "--only-binary",
                  ":all:"]  # fmt: skip
        plans, uvs = [], []
        for attempt in range(args.repeat):
            env_iii, cache_iii = fresh(f"iii-{attempt}")
            plans.append(timed([*tool, "-r", str(requirements), "--base-image", f"{runtime}:1.0",
                                "--arch", "amd64", "--no-build", "--output",
                                str(work / f"iii-{attempt}" / "context"), "--cache-dir",
                                str(cache_iii)], env_iii))  # fmt: skip
            env_uv, _ = fresh(f"uv-{attempt}")
            env_uv["UV_PYTHON_DOWNLOADS"] = "never"
            lock = work / f"uv-{attempt}" / "lock.txt"
            spent = timed([uv, "pip", "compile", *target, "--generate-hashes", "-o", str(lock),
                           str(requirements)], env_uv)  # fmt: skip
            spent += timed([uv, "pip", "install", *target, "--target",
                            str(work / f"uv-{attempt}" / "t"), "--python", sys.executable, "-r",
                            str(lock)], env_uv)  # fmt: skip
            uvs.append(spent)
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
