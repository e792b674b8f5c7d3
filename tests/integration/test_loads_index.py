"""Against the real index: run-time loads found in real code, sizes and stale picks reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.plans import reference_profile

from builder.cache import Cache
from builder.config import RunSettings
from builder.orchestration.prepare import Grounds, prepare
from builder.plan.plan import Plan

pytestmark = pytest.mark.usefixtures("package_index")


def plan(tmp_path: Path, requirements: str) -> tuple[Plan, dict]:
    (tmp_path / "requirements.txt").write_text(requirements)
    base = reference_profile()
    settings = RunSettings((tmp_path / "requirements.txt",), base.pinned, output=tmp_path / "out")
    result = prepare(settings, Grounds(base, ("amd64",), Cache(tmp_path / "cache")))
    return result, json.loads((tmp_path / "out" / "report.json").read_text())


def test_psycopg_needs_libpq5_from_its_find_library_call(tmp_path: Path) -> None:
    result, report = plan(tmp_path, "psycopg\n")
    amd64 = report["architectures"]["amd64"]
    assert "libpq5" in amd64["apt_packages"]
    (libpq,) = [lib for lib in amd64["native_libraries"] if lib["package"] == "libpq5"]
    assert libpq["how"] == "loaded at run time"
    assert any("psycopg/pq/misc.py:" in by for by in libpq["needed_by"]), libpq
    assert any("psycopg.pq.version()" in check for check in result.runtime_checks)
    sizes = {p["name"]: p["size"] for p in amd64["packages"]}
    assert sizes["psycopg"]["download"] > 100_000
    assert sizes["psycopg"]["installed"] > sizes["psycopg"]["download"]
    assert amd64["size"]["download"] == sum(s["download"] for s in sizes.values())


def test_pyvips_resolves_to_3x_built_from_source_with_libvips(tmp_path: Path) -> None:
    result, report = plan(tmp_path, "pyvips\n")
    amd64 = report["architectures"]["amd64"]
    versions = {p["name"]: p["version"] for p in amd64["packages"]}
    assert int(versions["pyvips"].split(".")[0]) >= 3
    assert "libvips42t64" in amd64["apt_packages"]
    assert any(w.startswith("note: pyvips==3") for w in result.warnings), result.warnings


def test_a_pin_to_the_old_pyvips_stays_with_a_note(tmp_path: Path) -> None:
    result, report = plan(tmp_path, "pyvips==2.1.0\n")
    versions = {p["name"]: p["version"] for p in report["architectures"]["amd64"]["packages"]}
    assert versions["pyvips"] == "2.1.0"
    (line,) = [w for w in result.warnings if "pyvips" in w]
    assert line.startswith("note: pyvips==2.1.0 is pinned; newest release: 3.")
