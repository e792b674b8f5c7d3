"""Requirements to a built image: build-sandbox-image beside a hand-written Dockerfile.

Both run on the same engine in one run, cold (BuildKit cache pruned, empty wheel and uv
caches) and warm (the same build again). The hand-written Dockerfile is what an operator
writes today: a builder stage doing a plain `pip install --target` from the index, and the
apt packages typed in by hand (we give it the list our tool found, which it would not know).

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
RUN apt-get update && apt-get install -y --no-install-recommends {apt} \\
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /app/deps-extra /app/deps-extra
ENV PYTHONPATH=/app/deps:/app/deps-extra
USER 65532:65532
"""


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def prune() -> None:
    subprocess.run([DOCKER, "builder", "prune", "-af"], check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", required=True)
    parser.add_argument("-r", type=Path, default=REPO / "examples" / "requirements.txt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bsi-bench-") as temp:
        work = Path(temp)
        env = {**os.environ, "UV_CACHE_DIR": str(work / "uv"), "DOCKER_BUILDKIT": "1"}
        ours = [sys.executable, "-m", "builder", "-r", str(args.r), "--base-image", args.base_image,
                "--tag", "bsi-bench/ours", "--no-verify", "--output", str(work / "context"),
                "--cache-dir", str(work / "cache")]  # fmt: skip
        prune()
        ours_cold = timed(ours, env)
        ours_warm = timed(ours, env)
        report = json.loads((work / "context" / "report.json").read_text())
        apt = " ".join(report["architectures"]["amd64"]["apt_packages"]) or "ca-certificates"
        hand = work / "handwritten"
        hand.mkdir()
        (hand / "Dockerfile").write_text(HANDWRITTEN.replace("{apt}", apt))
        (hand / "requirements.txt").write_text(args.r.read_text())
        theirs = [DOCKER, "build", "-t", "bsi-bench/handwritten",
                  "--build-arg", f"BASE_IMAGE={args.base_image}",
                  "--secret", f"id=ca,src={CA_BUNDLE}", str(hand)]  # fmt: skip
        prune()
        hand_cold = timed(theirs, env)
        hand_warm = timed(theirs, env)
    print(f"requirements: {args.r}  base: {args.base_image}  apt: {apt}")
    print(f"{'':24}{'cold':>9}{'warm':>9}")
    print(f"{'build-sandbox-image':24}{ours_cold:8.1f}s{ours_warm:8.1f}s")
    print(f"{'hand-written pip':24}{hand_cold:8.1f}s{hand_warm:8.1f}s")
    print(f"{'ratio (hand / ours)':24}{hand_cold / ours_cold:8.2f}x{hand_warm / ours_warm:8.2f}x")


if __name__ == "__main__":
    main()
