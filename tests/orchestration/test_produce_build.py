"""Multi-arch pieces that need neither an engine nor a registry: arch choice, index, Dockerfile."""

from __future__ import annotations

import json

import pytest

from builder.base.platforms import select_arches
from builder.errors import UserError
from builder.oci.v1 import Descriptor, Image, Index, Platform
from builder.orchestration.produce_build import arch_tag


def test_arches_default_to_what_the_base_offers() -> None:
    assert select_arches((), ("amd64", "arm64"), "reg/base:1") == ("amd64", "arm64")
    assert select_arches((), ("arm64",), "reg/base:1") == ("arm64",)


def test_arch_narrows_to_what_is_asked() -> None:
    assert select_arches(("arm64",), ("amd64", "arm64"), "reg/base:1") == ("arm64",)
    assert select_arches(("arm64", "arm64"), ("amd64", "arm64"), "reg/base:1") == ("arm64",)


def test_an_arch_the_base_lacks_is_an_error_naming_both() -> None:
    with pytest.raises(UserError) as error:
        select_arches(("amd64", "arm64"), ("amd64",), "reg.example/base:1")
    assert "reg.example/base:1" in str(error.value)
    assert "linux/arm64" in str(error.value)


def test_unknown_offer_keeps_the_amd64_default() -> None:
    assert select_arches((), None, None) == ("amd64",)
    assert select_arches(("arm64",), None, "base") == ("arm64",)


def test_index_names_each_platform() -> None:
    def image(arch: str) -> Image:
        config = json.dumps({"architecture": arch, "rootfs": {"diff_ids": []}}).encode()
        return Image.build(config, [Descriptor("", "sha256:" + "1" * 64, 5)])

    amd, arm = image("amd64"), image("arm64")
    index = Index.build([(Platform.linux("amd64"), amd), (Platform.linux("arm64"), arm)])
    document = json.loads(index.manifest_bytes)
    assert document["mediaType"] == "application/vnd.docker.distribution.manifest.list.v2+json"
    platforms = [entry["platform"] for entry in document["manifests"]]
    assert platforms == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux", "variant": "v8"},
    ]
    assert [entry["digest"] for entry in document["manifests"]] == [amd.digest, arm.digest]
    assert document["manifests"][1]["size"] == len(arm.manifest_bytes)
    assert document["manifests"][1]["mediaType"] == json.loads(arm.manifest_bytes)["mediaType"]


def test_local_arch_tags_never_collide() -> None:
    assert arch_tag("reg:5000/team/img:1.0", "arm64") == "reg:5000/team/img:1.0-arm64"
    assert arch_tag("reg:5000/team/img", "amd64") == "reg:5000/team/img:amd64"
