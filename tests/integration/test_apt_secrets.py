"""Apt secrets reach every apt step that needs them, and no pushed blob: a pipeline config's,
on both rebuild paths; a plan's, on a runner's part, which is refused without them.

`apt-ca-bundle` in the config is the CLI's --apt-ca-bundle: a BuildKit secret mounted for
apt-get. The full build's system stage and the rebase's one-step apt build both mount it; the
bundle (with a marker line) must appear in neither image's layers nor configs in the registry.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.machine import Registry
from support.registryhelp import registry_get

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

RUN = uuid.uuid4().hex[:8]


def push(client: Any, registry: Registry, ref: str) -> None:
    repository, _, tag = ref.rpartition(":")
    auth = {"username": registry.user, "password": registry.password}
    for event in client.api.push(repository, tag=tag, auth_config=auth, stream=True, decode=True):
        assert "error" not in event, event


def blobs_of(registry: Registry, reference: str) -> list[bytes]:
    """The config and every layer (uncompressed) of the amd64 image `reference` names."""
    repository, digest = reference.split("/", 1)[1].split("@")
    with registry_get(registry, f"/v2/{repository}/manifests/{digest}") as response:
        manifest = json.load(response)
    if "manifests" in manifest:  # an index: its amd64 image
        (entry,) = [m for m in manifest["manifests"] if m["platform"]["architecture"] == "amd64"]
        with registry_get(registry, f"/v2/{repository}/manifests/{entry['digest']}") as response:
            manifest = json.load(response)
    found = []
    for descriptor in [manifest["config"], *manifest["layers"]]:
        with registry_get(registry, f"/v2/{repository}/blobs/{descriptor['digest']}") as response:
            data = response.read()
        found.append(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return found


def test_apt_secrets_from_the_config_reach_both_paths_and_no_blob(
    tmp_path: Path,
    test_env: dict,
    registry: Registry,
    reference_image: str,
    docker_client: Any,
    shared_cache: Path,
) -> None:
    runtime = f"{registry.host}/bsi-aptsec-{RUN}/runtime"
    for version in ("1.0", "1.1"):  # two platform versions: the second differs by one file
        context = tmp_path / f"base-{version}"
        context.mkdir()
        (context / "Dockerfile").write_text(
            f"FROM {reference_image}\nUSER 0:0\nRUN echo {RUN}-{version} > /etc/bsi-version\n"
            "USER 65532:65532\n"
        )
        subprocess.run([test_env["docker"], "build", "-q", "-t", f"{runtime}:{version}",
                        str(context)], check=True, capture_output=True,
                       env={**os.environ, "DOCKER_BUILDKIT": "1"})  # fmt: skip
        push(docker_client, registry, f"{runtime}:{version}")
    marker = f"bsi-apt-ca-marker-{RUN}"
    bundle = Path(test_env["ca_bundle"]).read_text() + f"\n# {marker}\n"
    (tmp_path / "corp-ca.pem").write_text(bundle)
    (tmp_path / "requirements.txt").write_text("python-magic==0.4.27\n")  # needs libmagic1t64
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'requirements = ["requirements.txt"]\nbase-repository = "{runtime}"\n'
        f'platform-version = "1.0"\nrepository = "{registry.host}/bsi-aptsec-{RUN}/sandbox"\n'
        'apt-ca-bundle = "corp-ca.pem"\narchitectures = ["amd64"]\n'
    )
    env = {**os.environ, "BSI_REGISTRY_USER": registry.user}
    env |= {"BSI_REGISTRY_PASSWORD": registry.password, "UV_CACHE_DIR": str(tmp_path / "uv")}
    pushed = []
    for version, path in (("1.0", "build"), ("1.1", "rebase")):
        result = subprocess.run(
            [sys.executable, "-m", "builder", "rebuild", "--config", str(config),
             "--platform-version", version, "--cache-dir", str(shared_cache)],
            capture_output=True, text=True, env=env, timeout=900,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        assert f"upgrade path: {path}" in result.stdout
        report = json.loads((tmp_path / "sandbox-image" / "report.json").read_text())
        pushed.append(report["image"]["pushed"])
    dockerfile = (tmp_path / "sandbox-image" / "Dockerfile").read_text()
    assert "--mount=type=secret,id=apt-ca" in dockerfile
    assert "CAInfo=/run/secrets/apt-ca" in dockerfile
    assert len(set(pushed)) == 2
    for reference in pushed:
        blobs = blobs_of(registry, reference)
        assert any(b"libmagic" in blob for blob in blobs[1:]), "no apt layer in the image"
        assert not any(marker.encode() in blob for blob in blobs), f"{reference} holds the CA"
    config_history = json.loads(blobs_of(registry, pushed[1])[0])["history"]
    assert any("--mount=type=secret,id=apt-ca" in h.get("created_by", "") for h in config_history)


def test_a_runners_part_is_given_the_plans_apt_secrets(
    tmp_path: Path,
    test_env: dict,
    registry: Registry,
    reference_image: str,
    docker_client: Any,
    shared_cache: Path,
) -> None:
    """The plan's Dockerfile mounts the secrets the planning run was given: `part` without them
    is one line naming the flag, with them it builds and pushes, and no blob holds the bundle."""
    runtime = f"{registry.host}/bsi-aptsec-{RUN}/part-runtime:1.0"
    docker_client.images.get(reference_image).tag(runtime)
    push(docker_client, registry, runtime)
    marker = f"bsi-apt-ca-part-{RUN}"
    bundle = tmp_path / "corp-ca.pem"
    bundle.write_text(Path(test_env["ca_bundle"]).read_text() + f"\n# {marker}\n")
    (tmp_path / "requirements.txt").write_text("python-magic==0.4.27\n")  # needs libmagic1t64
    repository, plan = f"{registry.host}/bsi-aptsec-{RUN}/part", tmp_path / "plan"
    env = {**os.environ, "BSI_REGISTRY_USER": registry.user}
    env |= {"BSI_REGISTRY_PASSWORD": registry.password, "BSI_CACHE_DIR": str(shared_cache)}

    def tool(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True,
                              text=True, env=env, timeout=900)  # fmt: skip

    planned = tool(
        "-r", str(tmp_path / "requirements.txt"), "--base-image", runtime, "--arch", "amd64",
        "--apt-ca-bundle", str(bundle), "--push", repository, "--no-build", "--output", str(plan),
    )  # fmt: skip
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-2000:]
    part = ("part", str(plan), "--arch", "amd64", "--push", repository)
    refused = tool(*part)
    assert refused.returncode == 1 and not (plan / "parts").exists()
    assert refused.stderr.strip().splitlines() == [
        "error: the plan's apt step mounts apt-ca: give --apt-ca-bundle FILE"
    ]
    built = tool(*part, "--apt-ca-bundle", str(bundle))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-2000:]
    digest = json.loads((plan / "parts" / "amd64.json").read_text())["digest"]
    blobs = blobs_of(registry, f"{repository}@{digest}")
    assert any(b"libmagic" in blob for blob in blobs[1:]), "no apt layer in the image"
    assert not any(marker.encode() in blob for blob in blobs), "the part's image holds the CA"
