"""Against the real index: a uv override drops xgboost's GPU-only NCCL runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.plans import reference_profile

from builder.cache import Cache
from builder.plan.gpu import is_gpu_only
from builder.resolve.requirements import read_requirements
from builder.resolve.target import ARCHES, Target
from builder.resolve.uv import resolve

pytestmark = pytest.mark.usefixtures("package_index")


def test_override_drops_the_nccl_dependency(tmp_path: Path) -> None:
    requirements_file = tmp_path / "requirements.txt"
    requirements_file.write_text("xgboost\n")
    requirements = read_requirements((requirements_file,), ())
    target = Target(reference_profile(), (ARCHES["amd64"],))
    cache = Cache(tmp_path / "cache")
    plain = resolve(requirements, target, ARCHES["amd64"], cache)
    gpu = [p.name for p in plain.packages if is_gpu_only(p.name)]
    assert gpu and all(name.startswith("nvidia-nccl-") for name in gpu)
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("".join(f"{name} ; python_version < '0'\n" for name in gpu))
    dropped = resolve(requirements, target, ARCHES["amd64"], cache, overrides=(overrides,))
    names = {p.name for p in dropped.packages}
    assert "xgboost" in names and not any(is_gpu_only(name) for name in names)
