"""A verification's report, and the names it imports: decided without an image (the report of a
real verification is tests/integration/test_reference_image.py's)."""

from __future__ import annotations

from builder.verify.discovery import importable
from builder.verify.report import Check, VerifyReport


def test_importable_names():
    names = ["numpy", "numpy.libs", "_cffi_backend", "tests", "__editable__", "a-b", "x/y"]
    assert importable(names) == ["numpy", "_cffi_backend"]


def test_report_passes_only_when_every_check_passes():
    assert not VerifyReport("img").passed
    report = VerifyReport("img", [Check("health", True, "ok"), Check("timeout", False, "exit 1")])
    assert not report.passed
    assert [check.name for check in report.failed] == ["timeout"]
    assert "FAIL  timeout" in report.table()
    assert report.to_dict()["passed"] is False
