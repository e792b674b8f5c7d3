"""The oldest Python the project admits (``requires-python``) is one its code runs on.

Two checks hold the floor, each catching what the other cannot:

- here, vermin reads every file (the integration tests included, which no fast run executes)
  for a module, function, keyword or syntax newer than the floor's minor release (a 3.12
  ``itertools.batched``, a PEP 695 ``type`` statement), and every tool told the floor agrees;
- ``make test-oldest`` (in CI) runs the fast tier on Debian 12's own python3, 3.11.2: what
  only a patch release added (``tarfile``'s ``filter=``, 3.11.4) passes vermin and fails there.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SPECIFIER = PYPROJECT["project"]["requires-python"]
FLOOR = tuple(int(part) for part in re.fullmatch(r">=(\d+)\.(\d+)", SPECIFIER).groups())  # type: ignore[union-attr]
CHECKED = ("builder", "scripts", "tests", "benchmarks", "vulture_allowlist.py")
VERMIN = str(Path(sys.executable).with_name("vermin"))


def vermin(*paths: str | Path) -> subprocess.CompletedProcess[str]:
    target = f"-t={FLOOR[0]}.{FLOOR[1]}-"
    argv = [VERMIN, target, "--no-tips", "--violations", "--eval-annotations", "-q", *paths]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)


def test_no_file_needs_a_python_newer_than_the_floor(tmp_path: Path) -> None:
    canary = tmp_path / "newer.py"
    canary.write_text("import itertools\nprint(list(itertools.batched('abc', 2)))\n")
    caught = vermin(canary)
    assert caught.returncode != 0 and "itertools.batched" in caught.stdout, caught  # it can fail
    found = vermin(*CHECKED)
    assert (found.returncode, found.stdout, found.stderr) == (0, "", ""), found.stdout


def test_every_tool_is_told_the_same_floor() -> None:
    major, minor = FLOOR
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    setup = (REPO / "scripts" / "setup-env.sh").read_text()
    assert f"sys.version_info < ({major}, {minor})" in setup
    assert f'need >= {major}.{minor}"' in setup
    # as `make test-oldest` reads it (sed), to know the interpreter it runs is of the floor
    assert f'\nrequires-python = "{SPECIFIER}"\n' in (REPO / "pyproject.toml").read_text()
