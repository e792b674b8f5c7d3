"""Verify's `bytecode` check against the server process: which imported modules of the extras
were loaded from a valid `.pyc`, and the set's import time.

The server runs the host's python3, so the `.pyc` here are compiled by that interpreter through
the server itself, as the image's are by the base's; commands start in the workspace, so the
modules uploaded there import, and the workspace stands in for the extras' root.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sandboxserver import ServerProcess

from builder.verify.client import Sandbox
from builder.verify.discovery import bytecode_check, import_checks, imported
from builder.verify.run import bytecode_required

COMPILE = (
    "import py_compile, sys;"
    "[py_compile.compile(f, doraise=True,"
    " invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH) for f in sys.argv[1:]]"
)


@pytest.fixture()
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    process = ServerProcess(workspace)
    try:
        yield Sandbox(process.port, workspace=str(workspace))
    finally:
        process.stop()


def _upload(sandbox: Sandbox, files: dict[str, str]) -> None:
    for name, text in files.items():
        assert sandbox.upload(name, text.encode()).status == 200


def test_modules_without_valid_bytecode_are_named(sandbox: Sandbox) -> None:
    root = sandbox.workspace
    _upload(
        sandbox,
        {
            "fast_bsi/__init__.py": "VALUE = 1\n",
            "fast_bsi/inner.py": "from . import VALUE\n",
            "slow_bsi/__init__.py": "VALUE = 2\n",
            "stale_bsi/__init__.py": "VALUE = 3\n",
        },
    )
    compiled = sandbox.python(
        COMPILE,
        f"{root}/fast_bsi/__init__.py",
        f"{root}/fast_bsi/inner.py",
        f"{root}/stale_bsi/__init__.py",
    )
    assert compiled["exit_code"] == 0, compiled["stderr"]
    _upload(sandbox, {"stale_bsi/__init__.py": "VALUE = 4  # edited after compiling\n"})
    modules = ["fast_bsi.inner", "slow_bsi", "stale_bsi"]
    lines, summary = imported(sandbox, modules, root=root)
    assert all(lines[m]["ok"] for m in modules), lines
    assert summary is not None
    assert summary["modules"] == 4
    assert summary["missing"] == ["slow_bsi/__init__.py", "stale_bsi/__init__.py"]
    assert not list(Path(root, "slow_bsi").glob("__pycache__/*")), "nothing written"
    check = bytecode_check(summary, required=True)
    assert not check.passed
    assert "2 of 4 modules" in check.detail and "slow_bsi/__init__.py" in check.detail
    assert bytecode_check(summary, required=False).passed


def test_every_module_from_bytecode_passes_and_names_the_time(sandbox: Sandbox) -> None:
    root = sandbox.workspace
    _upload(sandbox, {"fast_bsi/__init__.py": "VALUE = 1\n"})
    compiled = sandbox.python(COMPILE, f"{root}/fast_bsi/__init__.py")
    assert compiled["exit_code"] == 0, compiled["stderr"]
    lines, summary = imported(sandbox, ["fast_bsi", "json"], root=root)
    assert lines["fast_bsi"]["ok"] and lines["json"]["ok"]
    assert summary is not None and summary["modules"] == 1 and summary["missing"] == []
    # what the import read, for report.json's lazy first-import bytes: the stdlib's files and
    # the C library the loader mapped, resolved; the workspace (the command's cwd) is no part
    # of an image
    reads = summary.get("reads") or []
    assert any("/json/" in path for path in reads), reads
    assert any(Path(path).name.startswith(("libc.so", "libc-")) for path in reads), reads
    assert reads == sorted(reads) and all(Path(path).resolve() == Path(path) for path in reads)
    assert not any(path.startswith(root) for path in reads), reads
    check = bytecode_check(summary, required=True)
    assert check.passed
    assert "1 modules" in check.detail and "the set imported in" in check.detail


def test_no_summary_fails_only_when_bytecode_is_required() -> None:
    assert not bytecode_check(None, required=True).passed
    assert bytecode_check(None, required=False).passed


def test_the_set_import_time_is_in_the_table_whatever_the_label(sandbox: Sandbox) -> None:
    """An image built with --no-bytecode (label "none") or by another tool gets the bytecode
    line too, reported only, so the table always says what importing the set costs a command;
    only a label naming an interpreter makes a module compiled from source fail it."""
    assert bytecode_required("0" * 64) is True
    assert bytecode_required("none") is False and bytecode_required(None) is False
    _upload(sandbox, {"slow_bsi/__init__.py": "VALUE = 2\n"})
    checks = import_checks(sandbox, ["slow_bsi", "json"], bytecode=bytecode_required("none")).checks
    assert [check.name for check in checks] == ["import slow_bsi", "import json", "bytecode"]
    line = checks[-1]
    assert line.passed and re.search(r"; the set imported in \d+(\.\d+)? s$", line.detail), line
