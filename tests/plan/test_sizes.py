"""Sizes per distribution and in total; GPU-only distributions flagged with their size."""

from __future__ import annotations

from pathlib import Path

from support.plans import TAG, plan_for, reference_profile
from support.wheelfactory import make_wheel

from builder.cli.summary import summary
from builder.plan.plan import Plan


def test_sizes_per_distribution_and_total(tmp_path: Path) -> None:
    small = make_wheel(tmp_path, "small", "1.0", "py3-none-any", {"small/__init__.py": b"x" * 10})
    big = make_wheel(tmp_path, "big", "2.0", "py3-none-any", {"big/data.py": b"0" * 500_000})
    arch = plan_for(tmp_path, [small, big])
    by_name = {w.name: w for w in arch.wheels}
    assert by_name["big"].size == big.stat().st_size < by_name["big"].installed_size
    assert by_name["big"].installed_size > 500_000
    plan = Plan(reference_profile(), "base", (arch,), (), ())
    report = plan.to_dict()["architectures"]["amd64"]
    assert report["size"] == {
        "download": small.stat().st_size + big.stat().st_size,
        "installed": by_name["small"].installed_size + by_name["big"].installed_size,
    }
    assert report["packages"][1]["size"]["download"] == big.stat().st_size
    table = summary(plan)
    assert "download" in table and "installed" in table
    assert any(line.split()[:1] == ["total"] and "kB" in line for line in table.splitlines())


def test_gpu_only_dependency_is_flagged_with_its_size_and_the_cpu_build(tmp_path: Path) -> None:
    xgb = make_wheel(tmp_path, "xgboost", "3.0", TAG, {"xgboost/__init__.py": b""})
    nccl = make_wheel(
        tmp_path, "nvidia-nccl-cu13", "2.0", "py3-none-manylinux_2_18_x86_64",
        {"nvidia/nccl/data.bin": b"\0" * 300_000},
    )  # fmt: skip
    arch = plan_for(tmp_path, [xgb, nccl])
    (warning,) = arch.warnings
    assert warning.startswith("warning: nvidia-nccl-cu13==2.0 only works on a GPU")
    assert "MB installed); instead:" in warning
    assert "xgboost → xgboost-cpu" in warning
    assert "nvidia-nccl-cu13 ; python_version < '0'" in warning
