"""On the engine: the plan's own advice drops xgboost's GPU-only NCCL runtime, and the image
still works.

xgboost's Linux wheels depend on `nvidia-nccl-cu13` (hundreds of MB that do nothing without a
GPU). The plan's GPU warning offers a uv override for it (nothing in the set links NCCL); the
test takes the override lines from that warning, and the image built with them must lack the
library, stop warning about it, pass verify and train a model when run hardened (XGBClassifier
is xgboost's scikit-learn API, so scikit-learn is requested too).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.images import build, docker, run_hardened

from builder.plan.gpu import is_gpu_only

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")

GPU_DEPENDENCY = "nvidia-nccl-cu13"  # what xgboost 3.x's manylinux wheels require
TRAIN = (
    "import numpy as np, xgboost\n"
    "X = np.random.default_rng(0).random((64, 4)); y = (X[:, 0] > 0.5).astype(int)\n"
    "model = xgboost.XGBClassifier(n_estimators=2).fit(X, y)\n"
    "print('trained', len(model.predict(X)))\n"
)


def test_override_drops_gpu_dependency_and_image_verifies(
    tmp_path: Path, reference_image: str, test_env: dict
) -> None:
    planned = build(
        tmp_path, tmp_path / "cache", reference_image, "xgboost\nscikit-learn\n", "unused",
        "--arch", "amd64", "--no-build",
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    (warning,) = [line for line in planned.stderr.splitlines() if "only works on a GPU" in line]
    advice = re.findall(r"`([^`]+ ; python_version < '0')`", warning)
    assert advice == [f"{GPU_DEPENDENCY} ; python_version < '0'"], warning
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("".join(f"{line}\n" for line in advice))
    tag = "bsi-e2e/xgboost-cpu:test"
    result = build(
        tmp_path, tmp_path / "cache", reference_image, "xgboost\nscikit-learn\n", tag,
        "--override", str(overrides), "--arch", "amd64",
    )  # fmt: skip
    try:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        report = json.loads((tmp_path / "context" / "report.json").read_text())
        packages = {p["name"] for p in report["architectures"]["amd64"]["packages"]}
        assert {"xgboost", "scikit-learn"} <= packages
        assert not any(is_gpu_only(name) for name in packages), packages
        assert GPU_DEPENDENCY not in result.stdout + result.stderr  # summary and warnings
        assert "only works on a GPU" not in result.stderr
        verification = report["image"]["verification"]
        assert verification["passed"] is True, verification
        assert "import xgboost" in {c["name"] for c in verification["checks"]}
        run = run_hardened(test_env, tag, TRAIN)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "trained 64"
    finally:
        docker(test_env, "rmi", "-f", tag, check=False)
