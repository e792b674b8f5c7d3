"""On the engine: psycopg, pure Python, gets libpq5 from its find_library call, and the image
passes verify with a check that really loads libpq."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.images import build, docker, run_hardened

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")


def test_psycopg_image_loads_libpq(tmp_path: Path, reference_image: str, test_env: dict) -> None:
    tag = "bsi-e2e/psycopg:test"
    result = build(tmp_path, tmp_path / "cache", reference_image, "psycopg\n", tag)
    try:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        assert "libpq.so.5 -> libpq5" in result.stdout
        report = json.loads((tmp_path / "context" / "report.json").read_text())
        checks = {c["name"]: c for c in report["image"]["verification"]["checks"]}
        runtime = [c for name, c in checks.items() if name.startswith("check ")]
        assert runtime and all(c["passed"] for c in runtime), runtime
        run = run_hardened(test_env, tag, "import psycopg; print(psycopg.pq.version())")
        assert run.returncode == 0, run.stderr
        assert int(run.stdout.strip()) >= 170000  # trixie's libpq 17
    finally:
        docker(test_env, "rmi", "-f", tag, check=False)
