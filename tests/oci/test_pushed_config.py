"""A rebase verifies one config and pushes another document: they must be the same bytes.

builder.orchestration.produce_rebase docker-loads
`canonical(extend_config(base, [apt without a blob, deps]))` (the apt layer's blob is still
being gzipped: digest "", size 0) for verification, then pushes
`append(base, [apt with its blob, deps])`. The config may depend only on what both know (diff
IDs, history), never on a blob's digest or size or the manifest's schema. The delivery's
refusal to tag a config other than the one verified, on the real engine and registry, is
tests/integration/test_rebase_verified_config.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from builder.oci.mutate import ConfigChange, NewLayer, append, extend_config
from builder.oci.v1 import (
    DOCKER_LAYER,
    DOCKER_MANIFEST,
    OCI_LAYER,
    OCI_MANIFEST,
    Descriptor,
    Image,
    canonical,
    digest_of,
)


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
