"""Two cold full builds of one requirements file give the same /app/deps-extra layers.

Separate tool caches and separate uv caches, and the second build on another base (the
reference plus one layer, as a platform upgrade would be): the engine holds the same diff IDs
for the extras layers of both images, and the registry the same blob digests, which are the
ones report.json names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.machine import Registry
from support.registryhelp import registry_get

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

RUN = uuid.uuid4().hex[:8]


def docker(test_env: dict, *args: str) -> str:
    return subprocess.run(
        [test_env["docker"], *args], capture_output=True, text=True, check=True, timeout=600
    ).stdout


def build(
    registry: Registry, work: Path, base: str, repository: str
) -> tuple[dict, subprocess.CompletedProcess[str]]:
    work.mkdir()
    (work / "requirements.txt").write_text("beautifulsoup4==4.12.3\n")
    env = {
        **os.environ,
        "BSI_REGISTRY_USER": registry.user,
        "BSI_REGISTRY_PASSWORD": registry.password,
    }
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(work / "requirements.txt"),
         "--base-image", base, "--tag", f"bsi-repro-{RUN}/{work.name}:test",
         "--output", str(work / "context"), "--cache-dir", str(work / "cache"),
         "--push", repository, "--no-verify"],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return json.loads((work / "context" / "report.json").read_text()), result


def test_two_cold_builds_on_two_bases_give_the_same_extras_layers(
    tmp_path: Path, test_env: dict, registry: Registry, reference_image: str
) -> None:
    bump = tmp_path / "bump"
    bump.mkdir()
    (bump / "stamp").write_text(RUN)
    (bump / "Dockerfile").write_text(f"FROM {reference_image}\nCOPY stamp /etc/bsi-stamp\n")
    upgraded = f"bsi-repro-{RUN}/base:2"
    docker(test_env, "build", "-q", "-t", upgraded, str(bump))
    seen = []
    for name, base in (("first", reference_image), ("second", upgraded)):
        repository = f"{registry.host}/bsi-repro-{RUN}/{name}"
        report, _ = build(registry, tmp_path / name, base, repository)
        image = report["image"]
        layers = json.loads(docker(test_env, "image", "inspect", image["id"]))[0]["RootFS"]
        path = repository.split("/", 1)[1]
        with registry_get(registry, f"/v2/{path}/manifests/{image['pushed'].split('@')[1]}") as r:
            pushed = [layer["digest"] for layer in json.loads(r.read())["layers"]]
        recorded = report["architectures"]["amd64"]["extras_layers"]
        diff_ids = [one["diff_id"] for one in recorded]
        assert layers["Layers"][-len(recorded) :] == diff_ids
        assert pushed[-len(recorded) :] == [one["digest"] for one in recorded]
        below = layers["Layers"][: -len(recorded)]
        seen.append((image["id"], below, diff_ids, pushed[-len(recorded) :]))
    (first_id, first_layers, *first_top), (second_id, second_layers, *second_top) = seen
    assert first_id != second_id and first_layers != second_layers  # other bases
    assert first_top == second_top  # same diff ID in the engine, same blob in the registry
    docker(test_env, "rmi", "-f", upgraded, f"bsi-repro-{RUN}/first:test")
    docker(test_env, "rmi", "-f", f"bsi-repro-{RUN}/second:test")
