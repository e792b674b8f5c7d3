"""Images as values: append layers to a base, find what an image adds, label it."""

from __future__ import annotations

import json

import pytest

from builder.context import labels
from builder.errors import UserError
from builder.oci.mutate import ConfigChange, NewLayer, append, top
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


def base(media_type: str = DOCKER_MANIFEST, env: tuple[str, ...] = ("PYTHONPATH=/app/deps",)):
    config = {
        "architecture": "amd64",
        "os": "linux",
        "container_config": {"Cmd": ["stale"]},
        "config": {"Env": ["PATH=/usr/bin", *env], "User": "65532:65532", "Labels": {"a": "1"}},
        "rootfs": {"type": "layers", "diff_ids": [d(1), d(2)]},
        "history": [{"created_by": "ADD rootfs"}, {"created_by": "RUN x"}],
    }
    layer_type = DOCKER_LAYER if media_type == DOCKER_MANIFEST else OCI_LAYER
    layers = [Descriptor(layer_type, d(11 + i), 10) for i in range(2)]
    return Image.build(canonical(config), layers, docker=media_type == DOCKER_MANIFEST)


APT = NewLayer(d(21), d(3), 5, "RUN apt-get install libgomp1")
DEPS = NewLayer(d(22), d(4), 7, "COPY /app/deps-extra")
LABELS = labels.image_labels("r/runtime:v2@sha256:" + "f" * 64, d(99), 1700000000, "v2", "abc")


def appended(image: Image | None = None) -> Image:
    change = ConfigChange(
        {"PYTHONPATH": "$PYTHONPATH:/app/deps-extra"},
        "65532:65532",
        LABELS,
        labels.created(1700000000),
    )
    return append(image or base(), [APT, DEPS], change)


def manifest(image: Image) -> dict:
    return json.loads(image.manifest_bytes)


def test_append_writes_config_and_manifest_that_name_each_other() -> None:
    image = appended()
    assert image.diff_ids == (d(1), d(2), d(3), d(4))
    assert [layer.digest for layer in image.layers] == [d(11), d(12), d(21), d(22)]
    assert manifest(image)["layers"][-1] == {"mediaType": DOCKER_LAYER, "digest": d(22), "size": 7}
    assert manifest(image)["config"]["digest"] == digest_of(image.config_bytes)
    assert manifest(image)["config"]["size"] == len(image.config_bytes)
    assert image.manifest_bytes == canonical(manifest(image))  # the one serialization
    assert image.digest == digest_of(image.manifest_bytes)
    settings = image.config["config"]
    assert settings["Env"] == ["PATH=/usr/bin", "PYTHONPATH=/app/deps:/app/deps-extra"]
    assert settings["Labels"]["a"] == "1" and settings["Labels"][labels.BASE_DIGEST] == d(99)
    assert "container_config" not in image.config
    assert image.config["created"] == "2023-11-14T22:13:20Z"
    layer_history = [h for h in image.config["history"] if not h.get("empty_layer")]
    assert len(layer_history) == len(image.diff_ids)
    assert "annotations" not in manifest(image)  # docker v2 manifests have none
    assert appended().manifest_bytes == image.manifest_bytes  # a value: same inputs, same bytes


def test_append_without_a_base_pythonpath_adds_no_stray_colon() -> None:
    image = appended(base(env=()))
    assert "PYTHONPATH=/app/deps-extra" in image.config["config"]["Env"]


def test_oci_base_gives_an_oci_manifest_with_annotations() -> None:
    image = appended(base(OCI_MANIFEST))
    assert manifest(image)["mediaType"] == OCI_MANIFEST
    assert image.layers[-1].media_type == OCI_LAYER
    assert manifest(image)["annotations"][labels.VERSION] == "v2-xabc"


def test_top_finds_the_added_layers_and_rebases_onto_a_new_base() -> None:
    old = appended()
    assert top(old, base()) == [APT, DEPS]
    other = Image.build(
        canonical({**base().config, "rootfs": {"type": "layers", "diff_ids": [d(5)]}}),
        [Descriptor(DOCKER_LAYER, d(13), 1)],
    )
    rebased = append(other, top(old, base())[1:], ConfigChange({}, "0", {}, "x"))
    assert rebased.diff_ids == (d(5), d(4))
    with pytest.raises(UserError, match="is not built on base"):
        top(old, other)


def test_labels_name_the_base_without_its_digest_and_the_tool() -> None:
    assert LABELS[labels.BASE_NAME] == "r/runtime:v2"
    assert LABELS[labels.CREATED] == "2023-11-14T22:13:20Z"
    assert LABELS[labels.TOOL_VERSION]
    assert labels.BASE_DIGEST not in labels.image_labels("r:v", None, 0, "v", "h")
