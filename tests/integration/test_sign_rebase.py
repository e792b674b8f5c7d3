"""A rebase signs its new digest: the real rebase producer, the one delivery, the real cosign.

The reference base is pushed, an image on it with a deps-extra layer written by digest (the
previous image), then rebased onto the same base with a signing key: the delivery verifies the
rebased image hardened, attaches its real SBOM and provenance (read out of the engine image),
and signs the new digest and attests both documents before the tag moves. cosign then accepts
the signature and both attestations; `verify --key` through the CLI accepts it, and refuses
the previous image, which nothing signed.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from support.plans import run_settings
from support.rebasing import Previous, own_base, previous_image, rebase_plan, remove_loaded
from support.registryhelp import tool

from builder.engines.per_arch import Engines
from builder.oci.mutate import ConfigChange
from builder.oci.name import ImageRef
from builder.orchestration.delivery import Delivery, Outcome, Run, deliver
from builder.orchestration.prepare import Finish
from builder.orchestration.produce_rebase import Previous as Start
from builder.orchestration.produce_rebase import RebaseProducer
from builder.publish.publisher import Target
from builder.reporter import QUIET
from builder.sign.keys import load_signing_key

MODULE = "bsi_signed_marker"  # in the deps-extra layer: the verification imports it
PASSPHRASE = "bsi-rebase-sign-passphrase"
CHANGE = ConfigChange(
    env={"PYTHONPATH": "$PYTHONPATH:/app/deps-extra"},
    user="65532:65532",
    labels={"org.opencontainers.image.version": "v1-xsigned"},
    created="2024-06-01T12:00:00Z",
)


@pytest.fixture
def previous(
    tmp_path: Path,
    registry: Any,
    pushed_reference: str,
    docker_client: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Previous]:
    """The session's reference base mounted in a repository of the test's own, and an unsigned
    image on it whose top layer is deps-extra."""
    own = own_base(registry, pushed_reference, "bsi-sign", monkeypatch)
    found = previous_image(own, tmp_path, MODULE, CHANGE)
    yield found
    remove_loaded(docker_client, found)


def signed_rebase(previous: Previous, target: str, client: Any, key_file: Path) -> Outcome:
    """The rebase producer on the previous image's own base, then the delivery with a key."""
    plan = rebase_plan(previous.base_tag, previous.base_digest, (previous.module,))
    finished = Finish({}, previous.labels, "2024-07-01T00:00:00Z", previous.cache)
    run = Run(Engines.local(client), previous.cache, QUIET)
    repository = ImageRef.parse_repository(target)
    start = Start(ImageRef.parse(previous.image), previous.base_digest)
    key = load_signing_key(key_file)
    with RebaseProducer(start, plan, finished, repository, run) as producer:
        push = Target(repository, "v2-xsigned")
        return deliver(
            producer, plan, Delivery(run_settings(output=previous.output), push=push, sign=key), run
        )


def test_a_rebase_signs_and_attests_its_new_digest(
    previous: Previous,
    registry: Any,
    docker_client: docker.DockerClient,
    test_env: dict,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cosign = test_env["cosign"]
    monkeypatch.setenv("COSIGN_PASSWORD", PASSPHRASE)
    made = subprocess.run(
        [cosign, "generate-key-pair"], cwd=tmp_path, capture_output=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    target = f"{registry.host}/{previous.image.split('/')[1]}/signed"
    result = signed_rebase(previous, target, docker_client, tmp_path / "cosign.key")
    assert result.path == "rebase" and result.verification is not None
    assert result.verification.passed and result.pushed is not None
    rebased = result.pushed.reference
    config = tmp_path / "docker-config"
    config.mkdir()
    auth = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    env = {**os.environ, "DOCKER_CONFIG": str(config), "HOME": str(tmp_path)}
    flags = ["--insecure-ignore-tlog", "--allow-insecure-registry", "--allow-http-registry"]
    public = str(tmp_path / "cosign.pub")
    for check in (
        ["verify"],
        ["verify-attestation", "--type", "slsaprovenance1"],
        ["verify-attestation", "--type", "cyclonedx"],
    ):
        found = subprocess.run(
            [cosign, *check, "--key", public, *flags, rebased],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert found.returncode == 0, (check, found.stderr)

    unsigned = tool(registry, "verify", previous.image, "--key", public)
    assert unsigned.returncode == 1
    (line,) = unsigned.stderr.strip().splitlines()
    assert line.startswith("error: ") and f"{previous.image}: not signed by" in line, line
    assert unsigned.stdout == ""  # refused before anything ran or printed
    signed = tool(registry, "verify", rebased, "--key", public, "--json")
    assert signed.returncode == 0, signed.stderr
    assert json.loads(signed.stdout)["passed"] is True
