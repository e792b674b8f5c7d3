"""A plan-only run (--no-build) against a base only the local engine holds: probed through the
engine, so the plan is made for that base's facts, not the reference base's shipped profile.

The stand-in base is tagged here with facts the shipped profile lacks: `six` 1.16.0 in
/app/deps (PYTHONPATH), run as 65532. A plan of `six` must then take it from the base.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.resolve.target import REFERENCE_BASE, shipped_facts

pytestmark = pytest.mark.usefixtures("package_index")


@pytest.fixture(scope="module")
def local_base(
    docker_client, test_env: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The stand-in with six 1.16.0's dist-info in /app/deps, tagged under a name no registry
    holds: only this engine has it."""
    context = tmp_path_factory.mktemp("local-base")
    info = context / "deps" / "six-1.16.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: six\nVersion: 1.16.0\n")
    (context / "deps" / "six.py").write_text("")
    (context / "Dockerfile").write_text(
        f"FROM {test_env['base_image']}\n"
        "COPY deps /app/deps\n"
        "ENV PYTHONPATH=/app/deps\n"
        "USER 65532:65532\n"
    )
    tag = f"bsi-versions-local-base:{uuid.uuid4().hex[:8]}"
    image, _ = docker_client.images.build(path=str(context), tag=tag, rm=True)
    yield tag
    docker_client.images.remove(image.id, force=True)


def plan(tmp_path: Path, cache: Path, base: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "requirements.txt").write_text("six\n")
    out = tmp_path / "context"
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(tmp_path / "requirements.txt"),
         "--base-image", base, "--arch", "amd64", "--no-build", "--output", str(out),
         "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return result, out


def test_a_base_only_the_engine_holds_is_probed_for_a_plan(
    local_base: str, shared_cache: Path, tmp_path: Path
) -> None:
    assert "six" not in shipped_facts().distributions  # what the fallback would plan against
    result, out = plan(tmp_path, shared_cache, local_base)
    assert result.returncode == 0, result.stderr
    assert "shipped profile" not in result.stdout + result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["base"]["distributions"] == {"six": "1.16.0"}
    assert report["base"]["pythonpath"] == "/app/deps"
    amd64 = report["architectures"]["amd64"]
    assert amd64["provided_by_base"] == ["six==1.16.0"]
    assert amd64["packages"] == []


def test_a_base_no_engine_holds_is_planned_against_the_profile_with_a_warning(
    docker_client, shared_cache: Path, tmp_path: Path
) -> None:
    missing = f"bsi-versions-absent:{uuid.uuid4().hex[:8]}"
    result, _ = plan(tmp_path, shared_cache, missing)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
    assert [w for w in warnings if missing in w and REFERENCE_BASE in w], result.stdout
    assert f"note: no engine holds {missing}" not in result.stdout
