"""The disk a cold build takes at its peak: build-sandbox-image beside a hand-written Dockerfile.

For each set (the example's, and a larger one of a few hundred MB), both build cold on bases made
for this run (so BuildKit reuses no snapshot) with empty caches, and a sampler reads, every
`--every` seconds, the disk the build uses: the tool's cache and the build context (one `du`,
so a blob hard-linked into the context counts once) plus what the engine's store grew by since
the build began. It prints each peak beside the image's size, the cache the build left (its
default bound is far above these sets: nothing is pruned), and the ratio to the hand-written
build's peak. The peak comes before the build's closing prune: a bound lowers what stays, not it.

The engine's store is measured with `du` of its root directory: on a shared machine another
build's writes meanwhile count too (they only add), so `--repeat N` builds each N times and
keeps the least peak; on a quiet engine one run is enough. BuildKit's cache is never pruned
(see build_vs_handwritten.py): the run's images are removed at its end, their build records
stay, reclaimable.

    .venv/bin/python benchmarks/footprint.py --base-image python:3.13-slim-trixie [-r FILE]

Our peak is also given taken apart, as it was at that sample: the cache, the context, the
engine store's tmp/ (what `docker load` copies an archive to before reading it) and the rest of
the store (the image's layers).

Needs the engine (run as a user who can read its root directory), the base and the index.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_vs_handwritten import CA_BUNDLE, DOCKER, REPO, derived_base
from build_vs_handwritten import handwritten as handwritten_dockerfile

LARGER = "scipy\nscikit-learn\nmatplotlib\nsympy\nstatsmodels\n"  # about 400 MB installed


@dataclass
class Peak:
    """The largest disk use the sampler saw, what it was made of then, and the engine store's
    at the start."""

    parts: dict[str, list[Path]]  # name -> directories counted whole (the cache, the context)
    store: Path
    every: float
    peak: int = 0
    at_peak: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base = du([self.store])
        self.tmp_base = du([self.store / "tmp"])
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self._measure()
            if self.stopped.wait(self.every):
                return

    def _measure(self) -> None:
        found = {name: du(paths) for name, paths in self.parts.items()}
        tmp = max(0, du([self.store / "tmp"]) - self.tmp_base)  # docker load's copies
        found["engine store: tmp/"] = tmp
        found["engine store: the rest"] = max(0, du([self.store]) - self.base - tmp)
        if sum(found.values()) > self.peak:
            self.peak, self.at_peak = sum(found.values()), found

    def __enter__(self) -> Peak:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join()
        self._measure()


def du(paths: list[Path]) -> int:
    """Bytes on disk under `paths`, each file once (hard links counted once across them), on
    their own file system only: a running container's overlay mount under the engine's root
    (`merged/`) is a view of layers counted already, not disk of its own."""
    existing = [str(path) for path in paths if path.exists()]
    if not existing:
        return 0
    out = subprocess.run(
        ["du", "-x", "-s", "-c", "-B1", *existing], capture_output=True, text=True, check=False
    ).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def store_root() -> Path:
    out = subprocess.run(
        [DOCKER, "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def image_size(tag: str) -> int:
    out = subprocess.run([DOCKER, "image", "inspect", tag], capture_output=True, text=True)
    return int(json.loads(out.stdout)[0]["Size"])


def ours(requirements: Path, base: str, work: Path, every: float) -> dict[str, int]:
    tag = f"bsi-footprint-{uuid.uuid4().hex[:8]}:ours"
    cache, context = work / "cache", work / "context"
    command = [sys.executable, "-m", "builder", "-r", str(requirements), "--base-image", base,
               "--tag", tag, "--no-verify", "--output", str(context),
               "--cache-dir", str(cache)]  # fmt: skip
    with Peak({"cache": [cache], "context": [context]}, store_root(), every) as peak:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    found = {"peak": peak.peak, "image": image_size(tag), "cache_left": du([cache])}
    found |= {f"at the peak, {name}": size for name, size in peak.at_peak.items()}
    subprocess.run([DOCKER, "rmi", "-f", tag], capture_output=True, check=False)
    return found


def handwritten(requirements: Path, base: str, apt: list[str], work: Path, every: float) -> int:
    tag = f"bsi-footprint-{uuid.uuid4().hex[:8]}:hand"
    hand = work / "handwritten"
    hand.mkdir(exist_ok=True)
    (hand / "Dockerfile").write_text(handwritten_dockerfile(apt))
    (hand / "requirements.txt").write_text(requirements.read_text())
    command = [DOCKER, "build", "-q", "-t", tag, "--build-arg", f"BASE_IMAGE={base}",
               "--secret", f"id=ca,src={CA_BUNDLE}", str(hand)]  # fmt: skip
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    with Peak({"context": [hand]}, store_root(), every) as peak:
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([DOCKER, "rmi", "-f", tag], capture_output=True, check=False)
    return peak.peak


def least(name: str, requirements: Path, base: str, every: float, repeat: int) -> None:
    """`one_set` `repeat` times, printing the run with the least peak of ours."""
    runs = [one_set(requirements, base, every) for _ in range(repeat)]
    found = min((run[0] for run in runs), key=lambda one: one["peak"])
    show(name, requirements, found, min(run[1] for run in runs))


def one_set(requirements: Path, base: str, every: float) -> tuple[dict[str, int], int]:
    run = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="bsi-footprint-") as temp:
        work = Path(temp)
        bases = {}
        for who in ("ours", "hand"):
            bases[who] = f"bsi-footprint-{run}/{who}:1"
            derived_base(base, bases[who], f"{run}-{who}", work)
        found = ours(requirements, bases["ours"], work, every)
        report = json.loads((work / "context" / "report.json").read_text())
        apt = list(report["architectures"]["amd64"]["apt_packages"])
        hand = handwritten(requirements, bases["hand"], apt, work, every)
        for tag in bases.values():
            subprocess.run([DOCKER, "rmi", "-f", tag], capture_output=True, check=False)
    return found, hand


def show(name: str, requirements: Path, found: dict[str, int], hand: int) -> None:
    def mb(size: int) -> str:
        return f"{size / 1e6:9.1f} MB"

    print(f"{name}: {requirements}")
    print(f"  image size                        {mb(found['image'])}")
    print(f"  peak, build-sandbox-image         {mb(found['peak'])}")
    for name, size in found.items():
        if name.startswith("at the peak, "):
            print(f"    {name.removeprefix('at the peak, '):32}{mb(size)}")
    print(f"  peak, hand-written pip Dockerfile {mb(hand)}")
    print(f"  cache the build left              {mb(found['cache_left'])}")
    print(f"  ratio peak / image                {found['peak'] / found['image']:9.2f}x")
    print(f"  ratio peak / hand-written peak    {found['peak'] / hand:9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", required=True)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--sets", choices=("both", "example", "larger"), default="both")
    parser.add_argument("--repeat", type=int, default=1, help="keep the least peak of N runs")
    parser.add_argument("-r", type=Path, help="this set alone (e.g. benchmarks/interpreter-40.txt)")
    args = parser.parse_args()
    if args.r:
        least(args.r.name, args.r, args.base_image, args.every, args.repeat)
        return
    if args.sets != "larger":
        example = REPO / "examples" / "requirements.txt"
        least("example", example, args.base_image, args.every, args.repeat)
    if args.sets != "example":
        with tempfile.TemporaryDirectory(prefix="bsi-footprint-set-") as temp:
            larger = Path(temp) / "requirements.txt"
            larger.write_text(LARGER)
            least("larger", larger, args.base_image, args.every, args.repeat)


if __name__ == "__main__":
    main()
