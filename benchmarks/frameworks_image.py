"""A framework set's image: build-sandbox-image beside a hand-written pip Dockerfile, in bytes and
build time.

The set defaults to PyPI's `sentence-transformers` (torch with its CUDA wheels: about 3 GB to
download, over 6 GB installed). Each side builds once, cold (a base made for this run, so BuildKit
holds nothing it could reuse; an empty wheel cache), for amd64, without verification (the
hand-written side verifies nothing). The hand-written Dockerfile is the operator's recipe: a
builder stage doing `pip install --target /app/deps-extra` from the index (the machine's CA
bundle as a BuildKit secret), copied into the final stage, with the apt packages the tool's plan
found typed in by hand (none, if it found none).

Printed for each image: its build wall time, its bytes as the engine stores them (uncompressed)
and above the base, and the gzip bytes of its layers above the base, every layer compressed the
same way (this tool's push format, level 1, from `docker save`): roughly what a node pulls. For
the tool's image also what its plan holds of GPU-only wheels (nvidia-*, cuda-*, triton).

    .venv/bin/python benchmarks/frameworks_image.py --base-image bsi-reference:test [-r FILE]

Needs the engine, the reference base and the index, and about 20 GB of free disk at its peak
(each image is removed once measured, and the tool's cache with it). BuildKit's cache keeps the
hand-written builder stage (several GB) until the engine's own collection: it is not pruned (see
build_vs_handwritten.py for why).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO, NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from build_vs_handwritten import CA_BUNDLE, DOCKER, derived_base, handwritten  # noqa: E402

from builder.layers.gzipped import compress_stream  # noqa: E402

DEFAULT_SET = "sentence-transformers\n"
GPU_ONLY = ("nvidia-", "cuda-", "triton")  # distribution names a CPU sandbox never loads


class Measured(NamedTuple):
    """One image's figures."""

    seconds: float
    size: int  # the engine's uncompressed size, base included
    added: int  # above the base
    added_gzip: int  # gzip of the layers above the base
    layers: int  # layers above the base


class _Hashing:
    """A reader that hashes what passes through it: a `docker save` member's diff ID."""

    def __init__(self, source: IO[bytes]) -> None:
        self.source, self.digest = source, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.digest.update(data)
        return data


def layer_gzip_sizes(image: str) -> dict[str, int]:
    """Each layer's gzip size in the tool's push format, by diff ID, read from `docker save`."""
    sizes: dict[str, int] = {}
    save = subprocess.Popen([DOCKER, "save", image], stdout=subprocess.PIPE)
    assert save.stdout is not None
    with tarfile.open(fileobj=save.stdout, mode="r|") as archive:
        for member in archive:
            if not (member.isfile() and member.name.endswith("layer.tar")):
                continue
            source = archive.extractfile(member)
            assert source is not None
            hashing = _Hashing(source)
            compressed = sum(len(piece) for piece in compress_stream(hashing))
            sizes[f"sha256:{hashing.digest.hexdigest()}"] = compressed
    if save.wait() != 0:
        sys.exit(f"error: docker save {image} failed")
    return sizes


def inspected(image: str) -> dict:
    result = subprocess.run(
        [DOCKER, "image", "inspect", image], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)[0]


def measure(image: str, base: dict, seconds: float) -> Measured:
    """`image`'s sizes against `base` (its inspection), and then the image removed."""
    found = inspected(image)
    base_layers = set(base["RootFS"]["Layers"])
    own = [layer for layer in found["RootFS"]["Layers"] if layer not in base_layers]
    gzipped = layer_gzip_sizes(image)
    subprocess.run([DOCKER, "rmi", "-f", image], check=True, stdout=subprocess.DEVNULL)
    return Measured(
        seconds=seconds,
        size=found["Size"],
        added=found["Size"] - base["Size"],
        added_gzip=sum(gzipped[layer] for layer in own),
        layers=len(own),
    )


class Work(NamedTuple):
    """What one build took of the whole machine (the engine's work too): busy core-seconds
    (idle, iowait and steal left out) and bytes written to its disks."""

    core_seconds: float
    written: int


def machine_counters() -> Work:
    """The machine's busy core-seconds and bytes written to disk since it started."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4] - fields[7]  # idle, iowait, steal
    sectors = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        parts = line.split()  # whole disks (vda, not vda1, already counted in vda)
        if Path(f"/sys/block/{parts[2]}").exists() and not parts[2].startswith(("loop", "ram")):
            sectors += int(parts[9])
    return Work(busy / os.sysconf("SC_CLK_TCK"), sectors * 512)


def timed(command: list[str], env: dict[str, str], work: list[Work]) -> float:
    """Run `command` to the end (failing loudly); its wall time. What the machine did
    meanwhile is appended to `work`."""
    start, before = time.perf_counter(), machine_counters()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: {command[0]} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    after = machine_counters()
    work.append(Work(after.core_seconds - before.core_seconds, after.written - before.written))
    return time.perf_counter() - start


def gpu_only_bytes(report: dict) -> tuple[int, int]:
    """(installed bytes of the GPU-only distributions, of every distribution) in the plan."""
    packages = report["architectures"]["amd64"]["packages"]
    total = sum(p["size"]["installed"] for p in packages)
    gpu = sum(p["size"]["installed"] for p in packages if p["name"].startswith(GPU_ONLY))
    return gpu, total


def tool_steps(report: dict) -> str:
    """Where the tool's run went: its steps to the build context (seconds from its start, as
    report.json's timeline has them), then the image's phases (seconds each)."""
    steps = ", ".join(
        f"{name} {began:.0f}-{ended:.0f}"
        for name, (began, ended) in report["timeline"]["steps"].items()
    )
    phases = report["image"]["arches"]["amd64"]["seconds"]
    spent = ", ".join(f"{phase} {seconds:.0f}" for phase, seconds in phases.items())
    return f"the tool's run: {steps} s from its start; then {spent} s"


def gb(size: int) -> str:
    return f"{size / 1e9:6.2f} GB"


def report_table(ours: Measured, hand: Measured) -> None:
    print(f"{'':22}{'build':>9}{'image':>12}{'above base':>13}{'gzip above':>13}{'layers':>8}")
    for name, m in (("build-sandbox-image", ours), ("hand-written pip", hand)):
        print(f"{name:22}{m.seconds:8.1f}s{gb(m.size):>12}{gb(m.added):>13}"
              f"{gb(m.added_gzip):>13}{m.layers:8}")  # fmt: skip
    print(f"{'ratio (hand / ours)':22}{hand.seconds / ours.seconds:8.2f}x"
          f"{hand.size / ours.size:11.2f}x{hand.added / ours.added:12.2f}x"
          f"{hand.added_gzip / ours.added_gzip:12.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", required=True)
    parser.add_argument("-r", type=Path, help="requirements (default: sentence-transformers)")
    args = parser.parse_args()
    requirements = args.r.read_text() if args.r else DEFAULT_SET
    run = uuid.uuid4().hex[:8]
    did: list[Work] = []  # what the machine did: ours, then the hand-written build
    own_base, hand_base = f"bsi-bench-{run}/own:1", f"bsi-bench-{run}/hand:1"
    with tempfile.TemporaryDirectory(prefix="bsi-bench-") as temp:
        work = Path(temp)
        try:
            derived_base(args.base_image, own_base, f"{run}-own", work)
            derived_base(args.base_image, hand_base, f"{run}-hand", work)
            base = inspected(own_base)
            env = {**os.environ, "UV_CACHE_DIR": str(work / "uv"), "DOCKER_BUILDKIT": "1"}
            (work / "requirements.txt").write_text(requirements)
            ours = [sys.executable, "-m", "builder", "-r", str(work / "requirements.txt"),
                    "--base-image", own_base, "--arch", "amd64", "--tag", f"bsi-bench-{run}/ours",
                    "--no-verify", "--output", str(work / "context"),
                    "--cache-dir", str(work / "cache")]  # fmt: skip
            ours_seconds = timed(ours, env, did)
            report = json.loads((work / "context" / "report.json").read_text())
            shutil.rmtree(work / "cache")  # gigabytes of wheels and layers: room for the next
            ours_measured = measure(f"bsi-bench-{run}/ours", base, ours_seconds)
            apt = report["architectures"]["amd64"]["apt_packages"]
            hand = work / "handwritten"
            hand.mkdir()
            (hand / "Dockerfile").write_text(handwritten(apt))
            (hand / "requirements.txt").write_text(requirements)
            theirs = [DOCKER, "build", "-t", f"bsi-bench-{run}/handwritten",
                      "--build-arg", f"BASE_IMAGE={hand_base}",
                      "--secret", f"id=ca,src={CA_BUNDLE}", str(hand)]  # fmt: skip
            hand_measured = measure(f"bsi-bench-{run}/handwritten", base, timed(theirs, env, did))
        finally:
            subprocess.run([DOCKER, "rmi", "-f", own_base, hand_base, f"bsi-bench-{run}/ours",
                            f"bsi-bench-{run}/handwritten"], capture_output=True)  # fmt: skip
    gpu, total = gpu_only_bytes(report)
    print(f"set: {' '.join(requirements.split())}  base: {args.base_image} ({gb(base['Size'])})")
    print(f"apt: {' '.join(apt) or 'none'}  distributions: "
          f"{len(report['architectures']['amd64']['packages'])}, installed {gb(total)}, "
          f"of which GPU-only wheels (nvidia-*, cuda-*, triton) {gb(gpu)}")  # fmt: skip
    report_table(ours_measured, hand_measured)
    for name, one in zip(("ours", "hand-written"), did, strict=True):
        print(f"{name}: the machine busy {one.core_seconds:.0f} core-seconds, wrote"
              f" {one.written / 1e9:.1f} GB to disk")  # fmt: skip
    print(f"the cores give {(os.cpu_count() or 1) * hand_measured.seconds:.0f} core-seconds in"
          f" the hand-written build's {hand_measured.seconds:.1f} s")  # fmt: skip
    print(tool_steps(report))


if __name__ == "__main__":
    main()
