"""How deep imports classify a failing module: by cause, from the hardened and permissive runs."""

from __future__ import annotations

import json

import pytest

from builder.verify.deep.causes import (
    Cause,
    DeepRun,
    Outcome,
    classify,
    failure_checks,
    figures_of,
    information_checks,
    parsed,
)
from builder.verify.deep.imports import DeepOptions, summary_check
from builder.verify.report import Check, DeepFigures, Status, VerifyReport, noted

READ_ONLY = "OSError: [Errno 30] Read-only file system: '/app/deps-extra/pkg/cache.nbi'"
ABSENT = "ModuleNotFoundError: No module named 'tkinter'"
NATIVE = "OSError: libsndfile.so.1: cannot open shared object file: No such file or directory"
OBJC = "AttributeError: /usr/bin/python3: undefined symbol: objc_getClass"
OLD_LIB = "AttributeError: /usr/lib/x86_64-linux-gnu/libfoo.so.1: undefined symbol: foo_new"
SLOW = "the import did not end within 60 s"


def failed(module: str, error: str, missing: str | None = None) -> Outcome:
    return Outcome(module, False, error, missing)


@pytest.mark.parametrize(
    ("hardened", "permissive", "cause"),
    [
        (Outcome("pkg.a", True), None, Cause.IMPORTED),
        (failed("pkg.a", READ_ONLY), Outcome("pkg.a", True), Cause.SANDBOX_ONLY),
        # failing otherwise when permissive is still the sandbox's doing
        (failed("pkg.a", READ_ONLY), failed("pkg.a", "KeyError: 'x'"), Cause.SANDBOX_ONLY),
        (failed("pkg.a", READ_ONLY), None, Cause.UNCOMPARED),
        (failed("pkg.a", READ_ONLY), Outcome("pkg.a", False, unreached=True), Cause.UNCOMPARED),
        # a native library is the plan's miss, whatever the permissive run says
        (failed("pkg.a", NATIVE), failed("pkg.a", NATIVE), Cause.NATIVE_LIBRARY),
        # a symbol another OS's library has, asked of the process itself: the same both ways
        (failed("pkg.osx", OBJC), failed("pkg.osx", OBJC), Cause.SAME_BOTH),
        # ... but a library that loaded and lacks a newer symbol is the plan's miss
        (failed("pkg.a", OLD_LIB), failed("pkg.a", OLD_LIB), Cause.NATIVE_LIBRARY),
        # given up hardened, imported permissive: slow (a loaded machine), information
        (failed("pkg.a", SLOW), Outcome("pkg.a", True), Cause.SLOW),
        (failed("pkg.a", SLOW), failed("pkg.a", SLOW), Cause.SAME_BOTH),  # hangs everywhere
        (
            failed("pkg.a", ABSENT, "tkinter"),
            failed("pkg.a", ABSENT, "tkinter"),
            Cause.ABSENT_MODULE,
        ),
        # absent only hardened: the sandbox hides it
        (failed("pkg.a", ABSENT, "tkinter"), Outcome("pkg.a", True), Cause.SANDBOX_ONLY),
        (failed("pkg.a", "RuntimeError: x"), failed("pkg.a", "RuntimeError: x"), Cause.SAME_BOTH),
        (Outcome("pkg.a", False, unreached=True), None, Cause.UNREACHED),
    ],
)
def test_a_failure_is_classified_by_its_cause(
    hardened: Outcome, permissive: Outcome | None, cause: Cause
) -> None:
    assert classify(hardened, permissive) is cause


def test_only_the_images_and_the_sandboxs_causes_fail() -> None:
    assert {c for c in Cause if c.failure} == {
        Cause.NATIVE_LIBRARY,
        Cause.SANDBOX_ONLY,
        Cause.UNCOMPARED,
    }
    assert {c for c in Cause if c.information} == {
        Cause.ABSENT_MODULE,
        Cause.SAME_BOTH,
        Cause.SLOW,
    }


def run_of(*outcomes: Outcome, finished: bool = True) -> DeepRun:
    modules = [o.module for o in outcomes]
    return DeepRun(
        listed={"pkg": modules}, skipped={"pkg": 1}, finished=finished,
        outcomes={o.module: o for o in outcomes}, seconds=1.5,
    )  # fmt: skip


def test_absent_modules_are_grouped_by_the_module_missing() -> None:
    run = run_of(
        failed("pkg.tk1", ABSENT, "tkinter"),
        failed("pkg.tk2", ABSENT, "tkinter"),
        failed("pkg.wx", "ModuleNotFoundError: No module named 'wx'", "wx"),
        failed("pkg.bad", "RuntimeError: x"),
    )
    causes = {name: classify(o, o) for name, o in run.outcomes.items()}
    checks = information_checks(run, causes)
    assert [(c.name, c.detail, c.info, c.passed) for c in checks] == [
        ("absent tkinter", "not in the image; needed by 2: pkg.tk1, pkg.tk2", True, True),
        ("absent wx", "not in the image; needed by 1: pkg.wx", True, True),
        (
            "deep-import pkg.bad",
            "fails the same way hardened and permissive: RuntimeError: x",
            True,
            True,
        ),
    ]
    assert failure_checks(run, causes, run.outcomes) == []


def test_a_sandbox_only_failure_names_the_module_and_both_runs() -> None:
    run = run_of(Outcome("pkg", True, seconds=0.25), failed("pkg.jit", READ_ONLY))
    second = {"pkg.jit": Outcome("pkg.jit", True)}
    causes = {name: classify(o, second.get(name)) for name, o in run.outcomes.items()}
    (check,) = failure_checks(run, causes, second)
    assert check.name == "deep-import pkg.jit" and not check.passed
    assert check.detail == (
        f"fails only in the hardened sandbox: {READ_ONLY}; as root, writable, it imports"
    )
    figures = figures_of("pkg", run, causes)
    assert (figures.imported, figures.failed, figures.informational, figures.skipped) == (
        1,
        1,
        0,
        1,
    )
    assert figures.seconds == 0.25
    summary = summary_check(run, causes, DeepOptions(skip=("pkg.old*",)))
    assert not summary.passed
    assert summary.detail == (
        "1 of 2 modules of 1 distributions imported, 1 failed, 0 informational in 1.5 s;"
        " 1 skipped by --skip-module pkg.old*"
    )


def test_a_run_cut_by_its_budget_is_information_and_counts_what_it_left() -> None:
    run = run_of(Outcome("pkg", True), Outcome("pkg.late", False, unreached=True))
    run.listed["pkg"].append("pkg.never")  # listed, never reported: the command was killed
    causes = {name: classify(o, None) for name, o in run.outcomes.items()}
    summary = summary_check(run, causes, DeepOptions(skip=("pkg.x",)))
    assert summary.passed and summary.info
    assert summary.detail.endswith("; the time budget cut it: 2 modules not imported")
    assert figures_of("pkg", run, causes).unreached == 2


def test_a_run_without_its_summary_fails() -> None:
    run = run_of(Outcome("pkg", True), finished=False)
    summary = summary_check(run, {"pkg": Cause.IMPORTED}, DeepOptions())
    assert not summary.passed and "ended without its summary" in summary.detail


def test_the_scripts_lines_are_read_until_one_is_cut_short() -> None:
    lines = [
        json.dumps({"distribution": "pkg", "modules": ["pkg", "pkg.a"], "skipped": 2}),
        json.dumps({"distribution": "gone", "modules": [], "absent": True, "skipped": 0}),
        json.dumps({"module": "pkg", "ok": True, "seconds": 0.5}),
        json.dumps({"module": "pkg.a", "ok": False, "error": ABSENT, "missing": "tkinter"}),
        json.dumps({"done": {"seconds": 2.0, "cut": False}}),
        '{"module": "pkg.b", "ok"',
        json.dumps({"module": "pkg.c", "ok": True}),
    ]
    run = parsed(lines)
    assert run.listed == {"pkg": ["pkg", "pkg.a"], "gone": []} and run.absent == ["gone"]
    assert run.skipped == {"pkg": 2, "gone": 0} and run.finished and run.seconds == 2.0
    assert run.outcomes == {
        "pkg": Outcome("pkg", True, seconds=0.5),
        "pkg.a": Outcome("pkg.a", False, ABSENT, "tkinter"),
    }


def test_information_passes_unless_strict_and_the_summary_line_counts_deep_imports() -> None:
    figures = DeepFigures("pkg", imported=5, failed=0, informational=2, unreached=0, skipped=1,
                          seconds=1.25)  # fmt: skip
    checks = [Check("deep-imports", True, "fine"), noted(Check("absent tk", True, "needed"), "")]
    report = VerifyReport("image", checks, deep=[figures])
    assert [report.status(c) for c in checks] == [Status.PASS, Status.INFO] and report.passed
    assert report.table().splitlines()[-1] == (
        "2/2 checks passed, 1 for information; deep imports of 1 distributions:"
        " 5 modules imported, 0 failed, 2 informational (1.2 s)"
    )
    assert report.to_dict()["deep_imports"] == [
        {"distribution": "pkg", "imported": 5, "failed": 0, "informational": 2, "unreached": 0,
         "skipped": 1, "seconds": 1.25}
    ]  # fmt: skip
    assert report.to_dict()["checks"][1]["status"] == "info"
    strict = VerifyReport("image", checks, strict=True)
    assert [c.name for c in strict.failed] == ["absent tk"] and not strict.passed
    assert "deep_imports" not in strict.to_dict()
    merged = VerifyReport.merged("set", [("amd64", report), ("arm64", report)])
    assert merged is not None
    assert [f.distribution for f in merged.deep] == ["[amd64] pkg", "[arm64] pkg"]


def test_the_error_line_names_the_first_failures_and_counts_the_rest() -> None:
    """A strict run's deep imports can fail dozens of modules: the one error line names a
    few, the table lists all."""
    few = [Check(f"deep-import pkg.m{i}", False, "x") for i in range(3)]
    assert VerifyReport("image", few).failed_names() == (
        "deep-import pkg.m0, deep-import pkg.m1, deep-import pkg.m2"
    )
    many = [Check("import pkg", True, "ok"), *(Check(f"m{i}", False, "x") for i in range(40))]
    assert VerifyReport("image", many).failed_names() == "m0, m1, m2, m3, m4, m5 and 34 more"
