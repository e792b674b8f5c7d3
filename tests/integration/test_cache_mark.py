"""A real plan (--no-build, the real package index) pointed at a project folder, then at an empty
directory: the folder is refused before any work and kept whole; the empty directory becomes a
marked cache holding uv's cache, which `cache` counts and `cache clean` removes, the mark kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.clirun import assert_one_error_line

from builder.cache.layout import TAG
from builder.cache.mark import SIGNATURE

pytestmark = pytest.mark.usefixtures("package_index")


def builder(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", *args], capture_output=True, text=True, cwd=cwd
    )


def plan(tmp_path: Path, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "requirements.txt").write_text("six\n")
    return builder(
        tmp_path, "-r", "requirements.txt", "--output", "context", "--cache-dir", str(cache_dir),
        "--no-build", "--arch", "amd64",
    )  # fmt: skip


def files(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(path): (path.lstat().st_mode, path.read_bytes() if path.is_file() else b"")
        for path in sorted(root.rglob("*"))
    }


def test_a_plan_refuses_a_project_folder_and_marks_an_empty_directory(tmp_path: Path) -> None:
    folder = tmp_path / "myproject"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "setup.py").write_text("from setuptools import setup\n")
    (folder / "setup.py").chmod(0o444)
    before = files(folder)
    refused = plan(tmp_path, folder)
    assert_one_error_line(refused, f"cache directory {folder}:", "not a build-sandbox-image cache")
    assert files(folder) == before and not (tmp_path / "context").exists()

    empty = tmp_path / "fresh"
    empty.mkdir()
    made = plan(tmp_path, empty)
    assert made.returncode == 0, made.stderr
    assert (empty / TAG).read_text().splitlines()[0] == SIGNATURE
    assert (empty / "uv").is_dir()  # uv's cache: here, not in ~/.cache/uv
    shown = json.loads(builder(tmp_path, "cache", "--json", "--cache-dir", str(empty)).stdout)
    assert shown["kinds"]["uv"]["entries"] == 1 and shown["kinds"]["uv"]["size"] > 0
    assert shown["unknown"] == [] and shown["kinds"]["unknown"]["entries"] == 0

    cleaned = builder(tmp_path, "cache", "clean", "--cache-dir", str(empty))
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (empty / "uv").exists() and (empty / TAG).exists()
    again = plan(tmp_path, empty)  # a cleaned cache is still the tool's
    assert again.returncode == 0, again.stderr
