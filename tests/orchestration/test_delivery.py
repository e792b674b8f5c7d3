"""What a build's verification asks of each arch's image beyond the named imports."""

from __future__ import annotations

from pathlib import Path

from support.plans import plan_for
from support.wheelfactory import make_wheel

from builder.orchestration.delivery import installed_on
from builder.verify.deep.imports import DeepOptions


def test_each_arch_deep_imports_what_was_asked_for_that_it_installs(tmp_path: Path) -> None:
    """pkg-b is asked for but installed on another arch only; dep is installed, not asked for."""
    files = {"pkg-a": {"pkg_a/x.py": b""}, "dep": {"dep/x.py": b""}}
    wheels = [make_wheel(tmp_path / "w", n, "1.0", "py3-none-any", f) for n, f in files.items()]
    installed = installed_on(plan_for(tmp_path, wheels), ("pkg-a", "pkg-b"), ("pkg_a.x",))
    assert list(installed.distributions) == ["pkg-a"]
    assert installed.deep == DeepOptions(skip=("pkg_a.x",))
    assert list(installed.programs) == []
