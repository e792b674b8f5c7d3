"""A source build runs the team's build backend on the runner: it sees what reaching an index
takes, never the variables a CI runner keeps its keys in (a real `uv build` of an in-tree
backend that writes down what it was given)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.cache.mark import opened
from builder.errors import UserError
from builder.resolve.index import build_tree

BACKEND = """\
import json, os
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open({seen!r}, "w") as f:
        json.dump(dict(os.environ), f)
    raise RuntimeError("this backend builds nothing")
"""


def test_a_build_backend_sees_no_secret_of_the_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = tmp_path / "seen.json"
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "bsi-env"\nversion = "1.0"\n'
    )
    (project / "backend.py").write_text(BACKEND.format(seen=str(seen)))
    monkeypatch.setenv("CI_SIGNING_PASSPHRASE", "runner-held-passphrase")
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", "runner-held-password")
    with pytest.raises(UserError, match="building a wheel from source failed"):
        build_tree(project, opened(tmp_path / "cache"), "r.txt:1")
    environment = json.loads(seen.read_text())
    assert "CI_SIGNING_PASSPHRASE" not in environment
    assert "BSI_REGISTRY_PASSWORD" not in environment
    assert environment["SOURCE_DATE_EPOCH"] == "315532800"  # what the tool sets still reaches it
    assert "PATH" in environment
