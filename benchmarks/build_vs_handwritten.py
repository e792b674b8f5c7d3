"""Requirements to a built image: build-sandbox-image beside a hand-written Dockerfile.

Both run on the same engine in one run, cold (each on a base made for this run, so BuildKit
holds no snapshot it could reuse; empty wheel and uv caches) and warm (the same build again).
The hand-written Dockerfile is what an operator writes today: a builder stage doing a plain
`pip install --target` from the index, and the apt packages typed in by hand (we give it the
list our tool found, which it would not know).

BuildKit's cache is not pruned: a `docker builder prune` while another build pulls crashed the
engine (dockerd 20.10, a nil dereference in the cache's GetByBlob) on the shared test machine,
and a base no image was built on before already leaves nothing to reuse.

    .venv/bin/python benchmarks/build_vs_handwritten.py --base-image bsi-reference:test

Needs the engine, the reference base (`build-sandbox-image base --tag ...`) and the index.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKER = "/usr/bin/docker"
CA_BUNDLE = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))

HANDWRITTEN = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS builder
USER 0:0
COPY requirements.txt /tmp/requirements.txt
RUN --mount=type=secret,id=ca,target=/tmp/ca.pem \\
    env -u PYTHONPATH PIP_CERT=/tmp/ca.pem PIP_BREAK_SYSTEM_PACKAGES=1 \\
    python3 -m pip install --no-cache-dir --target /app/deps-extra -r /tmp/requirements.txt

FROM ${BASE_IMAGE}
USER 0:0
{apt}COPY --from=builder /app/deps-extra /app/deps-extra
ENV PYTHONPATH=/app/deps:/app/deps-extra
USER 65532:65532
"""


def handwritten(apt: list[str]) -> str:
    """The hand-written Dockerfile, with an apt step for `apt` (none when it is empty)."""
    step = (
        f"RUN apt-get update && apt-get install -y --no-install-recommends {' '.join(apt)} \\\n"
        "    && rm -rf /var/lib/apt/lists/*\n"
    )
    return HANDWRITTEN.replace("{apt}", step if apt else "")


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def derived_base(parent: str, tag: str, stamp: str, work: Path) -> None:
    """`parent` plus one small layer naming this run: a base no existing image was built on."""
    context = work / f"base-{uuid.uuid4().hex[:6]}"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {parent}\nUSER 0:0\nRUN echo {stamp} > /etc/bsi-bench\nUSER 65532:65532\n"
    )
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    subprocess.run([DOCKER, "build", "-q", "-t", tag, str(context)], check=True, env=env,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", required=True)
    parser.add_argument("-r", type=Path, default=REPO / "examples" / "requirements.txt")
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    own_base, hand_base = f"bsi-bench-{run}/own:1", f"bsi-bench-{run}/hand:1"
    with tempfile.TemporaryDirectory(prefix="bsi-bench-") as temp:
        work = Path(temp)
        derived_base(args.base_image, own_base, f"{run}-own", work)
        derived_base(args.base_image, hand_base, f"{run}-hand", work)
        env = {**os.environ, "UV_CACHE_DIR": str(work / "uv"), "DOCKER_BUILDKIT": "1"}
        ours = [sys.executable, "-m", "builder", "-r", str(args.r), "--base-image", own_base,
                "--tag", f"bsi-bench-{run}/ours", "--no-verify", "--output",
                str(work / "context"), "--cache-dir", str(work / "cache")]  # fmt: skip
        ours_cold = timed(ours, env)
        ours_warm = timed(ours, env)
        report = json.loads((work / "context" / "report.json").read_text())
        packages = report["architectures"]["amd64"]["apt_packages"]
        apt = " ".join(packages) or "none"
        hand = work / "handwritten"
        hand.mkdir()
        (hand / "Dockerfile").write_text(handwritten(packages))
        (hand / "requirements.txt").write_text(args.r.read_text())
        theirs = [DOCKER, "build", "-t", f"bsi-bench-{run}/handwritten",
                  "--build-arg", f"BASE_IMAGE={hand_base}",
                  "--secret", f"id=ca,src={CA_BUNDLE}", str(hand)]  # fmt: skip
        hand_cold = timed(theirs, env)
        hand_warm = timed(theirs, env)
    print(f"requirements: {args.r}  base: {args.base_image}  apt: {apt}")
    print(f"{'':24}{'cold':>9}{'warm':>9}")
    print(f"{'build-sandbox-image':24}{ours_cold:8.1f}s{ours_warm:8.1f}s")
    print(f"{'hand-written pip':24}{hand_cold:8.1f}s{hand_warm:8.1f}s")
    print(f"{'ratio (hand / ours)':24}{hand_cold / ours_cold:8.2f}x{hand_warm / ours_warm:8.2f}x")


if __name__ == "__main__":
    main()
