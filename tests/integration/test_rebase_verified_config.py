"""A rebase verifies one config and pushes another document: they must be the same bytes.

`builder.orchestration.produce_rebase` docker-loads
`canonical(extend_config(base, [apt without a blob, deps]))` (the apt layer's blob is still
being gzipped: digest "", size 0) for builder.orchestration.delivery to verify,
which then pushes `append(base, [apt with its blob, deps])`. The config may depend only on
what both know (diff IDs, history), never on a blob's digest or size or the manifest's schema:
else the image id verified is not the config the cluster pulls, and the rebase refuses to tag.
That the two configs are the same bytes is tests/oci/test_pushed_config.py; here the guard
and a rebase through it, on the real engine and registry.
"""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from support.plans import run_settings
from support.rebasing import Previous, own_base, previous_image, rebase_plan, remove_loaded
from support.registryhelp import registry_get, registry_tags

import builder.orchestration.produce_rebase
from builder import credentials
from builder.attest import provenance, sbom
from builder.cache import Cache
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.oci.mutate import ConfigChange, NewLayer, append
from builder.oci.name import ImageRef
from builder.oci.referrers import attached_document, referrers
from builder.oci.remote import resolve
from builder.oci.v1 import (
    Image,
    Platform,
)
from builder.oci.ztoc import SOCI_INDEX
from builder.orchestration.delivery import Delivery, Outcome, Run, deliver
from builder.orchestration.prepare import Finish
from builder.orchestration.produce_rebase import Previous as Start
from builder.orchestration.produce_rebase import RebaseProducer
from builder.publish.publisher import Target
from builder.reporter import QUIET

CHANGE = ConfigChange(
    env={"PYTHONPATH": "$PYTHONPATH:/app/deps-extra"},
    user="65532:65532",
    labels={"org.opencontainers.image.version": "v2-xabc", "org.example.base": "r:v2"},
    created="2024-06-01T12:00:00Z",
)


# --- the guard, on the real engine and registry ---------------------------------------------

MODULE = "bsi_guard_marker"  # in the deps-extra layer: the verification imports it
EXTRAS = "ab" * 32  # the extras' hash: the tag's suffix
CREATED = "2024-07-01T00:00:00Z"


@pytest.fixture
def previous(
    tmp_path: Path,
    registry: Any,
    pushed_reference: str,
    docker_client: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Previous]:
    """The reference base in a repository of the test's own, and an image on it by digest
    whose top layer is deps-extra; afterwards the images the rebases loaded are removed."""
    own = own_base(registry, pushed_reference, "bsi-guard", monkeypatch)
    found = previous_image(own, tmp_path, MODULE, CHANGE)
    yield found
    remove_loaded(docker_client, found)


def rebase_onto_same_base(previous: Previous, target: str, client: docker.DockerClient) -> Outcome:
    """The rebase producer on the previous image's own base, no apt layer, then the one
    delivery: verify, push, tag."""
    plan = rebase_plan(previous.base_tag, previous.base_digest, (previous.module,))
    finished = Finish({}, previous.labels, CREATED, previous.cache)
    run = Run(Engines.local(client), previous.cache, QUIET)
    repository = ImageRef.parse_repository(target)
    start = Start(ImageRef.parse(previous.image), previous.base_digest)
    with RebaseProducer(start, plan, finished, repository, run) as producer:
        push = Target(repository, f"v1-x{EXTRAS[:12]}")
        return deliver(
            producer, plan, Delivery(run_settings(output=previous.output), push=push), run
        )


@pytest.mark.usefixtures("docker_client")
@pytest.mark.usefixtures("registry")
def test_a_pushed_config_other_than_the_verified_one_moves_no_tag(
    previous: Previous,
    registry: Any,
    docker_client: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The push side writes one label more than the loaded config (a divergence in `append`):
    the image is pushed by digest and verified, but no tag may name it. The same rebase without
    the divergence then does tag: the refusal was the guard's, not the setup's."""
    target = f"{registry.host}/{previous.image.split('/')[1]}/sandbox"
    repo = target.split("/", 1)[1]
    pushed: list[Image] = []

    def diverging(base: Image, layers: list[NewLayer], change: ConfigChange) -> Image:
        labels = {**change.labels, "org.example.diverged": "yes"}
        image = append(base, layers, replace(change, labels=labels))
        pushed.append(image)
        return image

    monkeypatch.setattr(builder.orchestration.produce_rebase, "append", diverging)
    with pytest.raises(UserError, match="the pushed config is not the one verified") as raised:
        rebase_onto_same_base(previous, target, docker_client)
    assert str(raised.value).startswith(f"rebase of {target}: ")
    (image,) = pushed
    with pytest.raises(urllib.error.HTTPError) as missing:  # refused before any write
        registry_get(registry, f"/v2/{repo}/manifests/{image.digest}")
    assert missing.value.code == 404
    assert registry_tags(registry, repo) == []
    assert registry_tags(registry, previous.base_tag.split("/", 1)[1].rsplit(":", 1)[0]) == ["v1"]

    monkeypatch.setattr(builder.orchestration.produce_rebase, "append", append)
    result = rebase_onto_same_base(previous, target, docker_client)
    assert result.verification is not None and result.verification.passed
    assert any(c.name == f"import {MODULE}" and c.passed for c in result.verification.checks)
    assert result.pushed is not None and result.pushed.digest != image.digest
    (tag,) = registry_tags(registry, repo)
    assert result.pushed.tags == (f"{target}:{tag}",)
    with registry_get(registry, f"/v2/{repo}/manifests/{tag}") as response:
        assert response.headers["Docker-Content-Digest"] == result.pushed.digest
    # the rebased image has its own SBOM and provenance, verified against it and attached, and
    # the SOCI index of its layers (the tool gzipped them all)
    assert any(c.name == "sbom" and c.passed for c in result.verification.checks)
    target_registry = credentials.registry(ImageRef.parse(f"{target}@{result.pushed.digest}"))
    attached = referrers(target_registry, result.pushed.digest)
    kinds = [r.artifact_type for r in attached]
    assert kinds == [sbom.MEDIA_TYPE, provenance.MEDIA_TYPE, SOCI_INDEX]
    statement = json.loads(attached_document(target_registry, attached[1]))
    assert statement["subject"][0]["digest"]["sha256"] == result.pushed.digest.split(":")[1]


@pytest.mark.usefixtures("docker_client")
@pytest.mark.usefixtures("registry")
def test_a_rebase_pulled_for_verification_counts_each_blob_once(
    previous: Previous, registry: Any, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """Without the deps tar here the rebase writes the image by digest to pull and verify it;
    the final write then finds its blobs there. Each blob is counted once, as the early write
    moved it: every layer mounted from the previous image's repository, none `present`."""
    target = f"{registry.host}/{previous.image.split('/')[1]}/pulled"
    cold = replace(previous, cache=Cache(tmp_path / "cold"))  # no deps tar: no docker load
    result = rebase_onto_same_base(cold, target, docker_client)
    assert result.verification is not None and result.verification.passed
    assert result.pushed is not None
    target_registry = credentials.registry(ImageRef.parse(f"{target}@{result.pushed.digest}"))
    image = resolve(target_registry, Platform.linux("amd64"), result.pushed.digest)
    assert result.pushed.bytes_mounted == sum(layer.size for layer in image.layers)
    assert result.pushed.bytes_present == 0  # not the early write's blobs a second time
    manifests = 2 * len(image.manifest_bytes)  # each write sent it
    assert result.pushed.bytes_uploaded >= image.config_descriptor.size + manifests
