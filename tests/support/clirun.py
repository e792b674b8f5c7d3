"""The CLI run as a user runs it, for the tests of bad input: one `error:` line, no secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SECRET = "s3cr3t-Value-0f-The-CI"


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", "--cache-dir", str(tmp_path / "cache"), "--no-build",
         *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "CI_TOKEN": SECRET, "BSI_DEBUG": ""},
        timeout=600,  # a run that waits forever (a FIFO read) fails the test, not the suite
    )  # fmt: skip


def assert_one_error_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert SECRET not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def requirements(tmp_path: Path, data: bytes, name: str = "requirements.txt") -> str:
    (tmp_path / name).write_bytes(data)
    return name
