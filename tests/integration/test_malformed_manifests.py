"""A base or previous image whose manifest or config has the wrong shape: one line, no trace."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from builder import credentials
from builder.assemble import from_engine
from builder.errors import RegistryError
from builder.oci.name import ImageRef
from builder.oci.remote import resolve
from builder.oci.v1 import DOCKER_LAYER, DOCKER_MANIFEST, OCI_INDEX, Platform, digest_of

LAYER = {"mediaType": DOCKER_LAYER, "digest": f"sha256:{'1' * 64}", "size": 10}
DIFF_IDS = [f"sha256:{'2' * 64}"]
GOOD_CONFIG: dict[str, Any] = {
    "rootfs": {"diff_ids": [f"sha256:{'2' * 64}"]},
    "history": [{"created_by": "x"}],
}


def image_manifest(**changes: Any) -> dict[str, Any]:
    config = {"mediaType": "c", "digest": "(the config's)", "size": 1}
    return {"mediaType": DOCKER_MANIFEST, "config": config, "layers": [LAYER]} | changes


def index_of(*entries: Any) -> dict[str, Any]:
    return {"mediaType": OCI_INDEX, "manifests": list(entries)}


AMD64: dict[str, Any] = {
    "mediaType": DOCKER_MANIFEST,
    "digest": f"sha256:{'a' * 64}",
    "size": 100,
    "platform": {"os": "linux", "architecture": "amd64"},
}


class FakeRegistry:
    """Serves `top` for any tag, `documents` by digest, and `config` as the config blob.

    A config descriptor's digest is made the served config's, so only the shape is wrong.
    """

    label = "127.0.0.1:5000/runtime"
    ref = ImageRef.parse("127.0.0.1:5000/runtime:1.0")

    def __init__(self, top: Any, documents: dict[str, Any] | None = None, config: Any = None):
        self.top, self.documents = top, documents or {}
        self.config = json.dumps(GOOD_CONFIG if config is None else config).encode()

    def manifest(self, reference: str, expected: str | None = None) -> tuple[bytes, str]:
        document = self.documents.get(reference, self.top)
        if isinstance(document, dict) and isinstance(document.get("config"), dict):
            document = document | {
                "config": document["config"] | {"digest": digest_of(self.config)}
            }
        body = json.dumps(document).encode()
        return body, digest_of(body)

    def small_blob(self, digest: str) -> bytes:
        return self.config


def image_of(registry: FakeRegistry) -> Any:
    client: Any = registry
    return resolve(client, Platform.linux("amd64"), "1.0")


def test_a_well_formed_image_is_read() -> None:
    assert image_of(FakeRegistry(image_manifest())).diff_ids == tuple(DIFF_IDS)


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
def test_malformed_base_layers_end_the_push(
    registry: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not uploaded from the engine instead: that would push the base under new digests
    without a word (issue 36); the error names the base."""
    monkeypatch.setattr(credentials, "registry", lambda *args: registry)
    target: Any = type(
        "Target", (), {"ref": type("Ref", (), {"registry": "127.0.0.1:5000"}), "retries": None}
    )
    with pytest.raises(RegistryError, match="malformed"):
        from_engine.base_layers(FakeRegistry.ref, "amd64", target)


def test_well_formed_base_layers_are_mountable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(credentials, "registry", lambda *args: FakeRegistry(image_manifest()))
    target: Any = type(
        "Target", (), {"ref": type("Ref", (), {"registry": "127.0.0.1:5000"}), "retries": None}
    )
    found = from_engine.base_layers(FakeRegistry.ref, "amd64", target)
    assert found is not None and list(found.by_diff_id) == DIFF_IDS


def test_a_rebase_takes_the_plain_variant_the_probe_and_buildkit_take() -> None:
    """An index listing linux/amd64/v3 first: the rebase must not put the extras on that one.

    The probe (builder.base.from_registry) and BuildKit's pull take the plain linux/amd64 image; a
    rebase onto the v3 build would give baseline CPUs an image that cannot run there.
    """
    v3 = AMD64 | {"digest": f"sha256:{'3' * 64}", "platform": AMD64["platform"] | {"variant": "v3"}}
    v3_layer = LAYER | {"digest": f"sha256:{'4' * 64}"}
    registry = FakeRegistry(
        index_of(v3, AMD64),
        {v3["digest"]: image_manifest(layers=[v3_layer]), AMD64["digest"]: image_manifest()},
    )
    assert [layer.digest for layer in image_of(registry).layers] == [LAYER["digest"]]
