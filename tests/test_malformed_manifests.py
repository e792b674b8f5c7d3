"""A base or previous image whose manifest or config has the wrong shape: one line, no trace."""

from __future__ import annotations

import re
from typing import Any

import pytest

from builder.errors import RegistryError
from builder.image import index
from builder.image.rebase import DOCKER_LAYER, DOCKER_MANIFEST
from builder.rebase import _image

LAYER = {"mediaType": DOCKER_LAYER, "digest": f"sha256:{'1' * 64}", "size": 10}
CONFIG_DIGEST = f"sha256:{'c' * 64}"
DIFF_IDS = [f"sha256:{'2' * 64}"]
GOOD_CONFIG: dict[str, Any] = {
    "rootfs": {"diff_ids": [f"sha256:{'2' * 64}"]},
    "history": [{"created_by": "x"}],
}


def image_manifest(**changes: Any) -> dict[str, Any]:
    return {"mediaType": DOCKER_MANIFEST, "config": {"digest": CONFIG_DIGEST}, "layers": [LAYER]
            } | changes  # fmt: skip


def index_of(*entries: Any) -> dict[str, Any]:
    return {"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": list(entries)}


AMD64: dict[str, Any] = {
    "digest": f"sha256:{'a' * 64}",
    "platform": {"os": "linux", "architecture": "amd64"},
}


class FakeRegistry:
    """Serves `top` for any tag, `documents` by digest, and `config` as the config blob."""

    label = "127.0.0.1:5000/runtime"

    def __init__(self, top: Any, documents: dict[str, Any] | None = None,
                 config: Any = None) -> None:  # fmt: skip
        self.top, self.documents = top, documents or {}
        self.config = GOOD_CONFIG if config is None else config

    def manifest(self, reference: str) -> tuple[dict[str, Any], str]:
        return self.documents.get(reference, self.top), f"sha256:{'d' * 64}"

    def json_blob(self, descriptor: Any) -> Any:
        return self.config


def image_of(registry: FakeRegistry) -> Any:
    client: Any = registry
    return _image(client, "1.0", "amd64")


def test_a_well_formed_image_is_read() -> None:
    assert image_of(FakeRegistry(image_manifest())).diff_ids == DIFF_IDS


@pytest.mark.parametrize(
    "registry",
    [
        FakeRegistry(image_manifest(config=None)),  # config is not a descriptor
        FakeRegistry(image_manifest(layers=[{"digest": 5}])),  # a layer without a size
        FakeRegistry(image_manifest(layers="abc")),
        FakeRegistry(image_manifest(), config={"rootfs": []}),  # no diff IDs
        FakeRegistry(image_manifest(), config={"rootfs": {"diff_ids": [1]}}),
        FakeRegistry(image_manifest(), config={"rootfs": {"diff_ids": []}, "history": ["x"]}),
        FakeRegistry(index_of("not an entry")),
        FakeRegistry({"manifests": 7}),
        FakeRegistry(index_of({"platform": {"os": "linux", "architecture": "amd64"}})),  # no digest
        FakeRegistry(index_of(AMD64), {AMD64["digest"]: index_of(AMD64)}),  # index in an index
    ],
)
def test_a_malformed_image_is_a_registry_error_naming_it(registry: FakeRegistry) -> None:
    with pytest.raises(RegistryError, match=re.escape(FakeRegistry.label)):
        image_of(registry)


@pytest.mark.parametrize(
    "registry",
    [
        FakeRegistry(index_of("not an entry")),
        FakeRegistry(image_manifest(config=[])),
        FakeRegistry(image_manifest(layers=[7])),
        FakeRegistry(image_manifest(), config={"rootfs": {"diff_ids": [["unhashable"]]}}),
        FakeRegistry(image_manifest(), config=[]),
    ],
)
def test_malformed_base_layers_mean_uploading_them(
    registry: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index, "Registry", lambda *args: registry)
    target: Any = type("Target", (), {"ref": type("Ref", (), {"registry": "127.0.0.1:5000"})})
    assert index._base_layers("127.0.0.1:5000/runtime:1.0", "amd64", target, None) is None


def test_well_formed_base_layers_are_mountable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "Registry", lambda *args: FakeRegistry(image_manifest()))
    target: Any = type("Target", (), {"ref": type("Ref", (), {"registry": "127.0.0.1:5000"})})
    found = index._base_layers("127.0.0.1:5000/runtime:1.0", "amd64", target, None)
    assert found is not None and list(found.by_diff_id) == DIFF_IDS


def test_a_rebase_takes_the_plain_variant_the_probe_and_buildkit_take() -> None:
    """An index listing linux/amd64/v3 first: the rebase must not put the extras on that one.

    The probe (builder.base.registry) and BuildKit's pull take the plain linux/amd64 image; a
    rebase onto the v3 build would give baseline CPUs an image that cannot run there.
    """
    v3 = {"digest": f"sha256:{'3' * 64}", "platform": AMD64["platform"] | {"variant": "v3"}}
    v3_layer = LAYER | {"digest": f"sha256:{'4' * 64}"}
    registry = FakeRegistry(
        index_of(v3, AMD64),
        {v3["digest"]: image_manifest(layers=[v3_layer]), AMD64["digest"]: image_manifest()},
    )
    assert image_of(registry).layers == [LAYER]
