"""A rebase verifies one config and pushes another document: they must be the same bytes.

`builder.orchestration.produce_rebase` docker-loads
`canonical(extend_config(base, [apt without a blob, deps]))` (the apt layer's blob is still
being gzipped: digest "", size 0) for builder.orchestration.delivery to verify,
which then pushes `append(base, [apt with its blob, deps])`. The config may depend only on
what both know (diff IDs, history), never on a blob's digest or size or the manifest's schema:
else the image id verified is not the config the cluster pulls, and the rebase refuses to tag.
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
from builder.oci.mutate import ConfigChange, NewLayer, append, extend_config
from builder.oci.name import ImageRef
from builder.oci.referrers import attached_document, referrers
from builder.oci.remote import resolve
from builder.oci.v1 import (
    DOCKER_LAYER,
    DOCKER_MANIFEST,
    OCI_LAYER,
    OCI_MANIFEST,
    Descriptor,
    Image,
    Platform,
    canonical,
    digest_of,
)
from builder.oci.ztoc import SOCI_INDEX
from builder.orchestration.delivery import Delivery, Outcome, Run, deliver
from builder.orchestration.prepare import Finish
from builder.orchestration.produce_rebase import Previous as Start
from builder.orchestration.produce_rebase import RebaseProducer
from builder.publish.publisher import Target
from builder.reporter import QUIET


def d(n: int) -> str:
    return f"sha256:{n:064x}"


def oci_base() -> Image:
    """As BuildKit writes one: no container_config, empty-layer history, Labels null."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2024-05-01T00:00:00Z",
        "config": {
            "Env": ["PATH=/usr/local/bin:/usr/bin", "PYTHONPATH=/app/deps"],
            "Cmd": ["python3", "-I", "/opt/sandbox/server"],
            "WorkingDir": "/workspace",
            "Labels": None,
        },
        "rootfs": {"type": "layers", "diff_ids": [d(1), d(2), d(3)]},
        "history": [
            {"created_by": "ADD rootfs.tar /"},
            {"created_by": "ENV LANG=C.UTF-8", "empty_layer": True},
            {"created_by": "RUN apt-get install python3"},
            {"created_by": "COPY server/ /opt/sandbox/server", "comment": "buildkit.dockerfile.v0"},
        ],
    }
    return image_of(OCI_MANIFEST, OCI_LAYER, config, 3)


def docker_base() -> Image:
    """As the classic builder writes one: container, container_config, docker_version, no Env."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "container": "0f" * 32,
        "container_config": {"Cmd": ["/bin/sh", "-c", "#(nop) USER 65532"]},
        "docker_version": "20.10.24",
        "config": {"User": "65532:65532", "Labels": {"org.example.team": "platform"}},
        "rootfs": {"type": "layers", "diff_ids": [d(1), d(2)]},
        "history": [{"created_by": "ADD rootfs.tar /"}, {"created_by": "RUN useradd sandbox"}],
    }
    return image_of(DOCKER_MANIFEST, DOCKER_LAYER, config, 2)


def image_of(media_type: str, layer_type: str, config: Any, count: int) -> Image:
    layers = [Descriptor(layer_type, d(100 + i), 1000 + i) for i in range(count)]
    return Image.build(canonical(config), layers, docker=media_type == DOCKER_MANIFEST)


CHANGE = ConfigChange(
    env={"PYTHONPATH": "$PYTHONPATH:/app/deps-extra"},
    user="65532:65532",
    labels={"org.opencontainers.image.version": "v2-xabc", "org.example.base": "r:v2"},
    created="2024-06-01T12:00:00Z",
)
APT_DIFF_ID = d(31)
APT_STEP = "RUN --mount=type=secret,id=apt-ca apt-get install -y libgomp1"
# (digest, size) the apt layer's blob may have once gzipped: the load never knows them
APT_BLOBS = [("", 0), (d(41), 5), (d(42), 123_456_789), (d(43), 2**40)]
DEPS_VARIANTS = [  # the reused deps-extra layer, as `top` reads it off the previous image
    NewLayer(d(51), d(61), 7, "COPY /app/deps-extra"),
    NewLayer(d(52), d(62), 987_654_321, "/bin/sh -c #(nop) COPY dir:abc in /app/deps-extra"),
]


@pytest.mark.parametrize("base", [oci_base(), docker_base()], ids=["oci", "docker"])
@pytest.mark.parametrize("with_apt", [True, False], ids=["apt", "no-apt"])
@pytest.mark.parametrize("deps", DEPS_VARIANTS, ids=["deps-small", "deps-large"])
def test_the_pushed_config_is_byte_for_byte_the_one_loaded_and_verified(
    base: Image, with_apt: bool, deps: NewLayer
) -> None:
    loaded = [NewLayer("", APT_DIFF_ID, 0, APT_STEP)] if with_apt else []
    verified = canonical(extend_config(base.config, [*loaded, deps], CHANGE))
    for digest, size in APT_BLOBS if with_apt else [("", 0)]:
        pushed_layers = [NewLayer(digest, APT_DIFF_ID, size, APT_STEP)] if with_apt else []
        pushed = append(base, [*pushed_layers, deps], CHANGE)
        assert pushed.config_bytes == verified, (digest, size)
        # the image id docker load gives is the config digest the pushed manifest names
        assert pushed.config_descriptor.digest == digest_of(verified)
        assert pushed.config_descriptor.size == len(verified)
        assert [layer.digest for layer in pushed.layers][-2:] == (
            [digest, deps.digest] if with_apt else [base.layers[-1].digest, deps.digest]
        )
    diff_ids = [*base.diff_ids, *([APT_DIFF_ID] if with_apt else []), deps.diff_id]
    assert list(pushed.diff_ids) == diff_ids


def test_the_config_bytes_do_not_depend_on_the_manifest_schema() -> None:
    """One base config under an OCI and under a Docker manifest: the same config is written."""
    oci = oci_base()
    as_docker = image_of(DOCKER_MANIFEST, DOCKER_LAYER, oci.config, 3)
    layers = [NewLayer(d(41), APT_DIFF_ID, 5, APT_STEP), DEPS_VARIANTS[0]]
    pushed = [append(image, layers, CHANGE) for image in (oci, as_docker)]
    assert pushed[0].media_type != pushed[1].media_type
    assert pushed[0].config_bytes == pushed[1].config_bytes
    assert pushed[0].digest != pushed[1].digest  # only the manifests differ


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
    run = Run(Engines.local(client), previous.cache, previous.output, QUIET)
    repository = ImageRef.parse_repository(target)
    start = Start(ImageRef.parse(previous.image), previous.base_digest)
    with RebaseProducer(start, plan, finished, repository, run) as producer:
        push = Target(repository, f"v1-x{EXTRAS[:12]}")
        return deliver(producer, plan, Delivery(run_settings(), push=push), run)


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
