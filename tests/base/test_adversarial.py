"""Reading a base through its registry when the registry or the image is hostile or broken.

A malformed answer must end in one error naming the image (a RegistryError), never a
traceback; layer tars can only ever describe the model's own tree, whatever their paths say.
"""

from __future__ import annotations

import io
import json
import struct

import pytest
from support.fakeregistry import INDEX, MANIFEST, Content, Server
from support.registryhelp import layer_tar

from builder.base.from_registry import probe_registry
from builder.base.layers import LD_CACHE_MAGIC, Layers, ld_cache_entries
from builder.base.platforms import offered_arches
from builder.cache import Cache
from builder.errors import RegistryError
from builder.oci.name import ImageRef
from builder.resolve.target import ARCHES


@pytest.fixture
def registry_with():
    servers: list[Server] = []

    def start(content: Content) -> str:
        servers.append(Server(content.route))
        return f"127.0.0.1:{servers[-1].port}/base:1"

    yield start
    for server in servers:
        server.close()


def _image(content: Content, config: dict) -> dict:
    config_bytes = json.dumps(config).encode()
    config_digest = content.blob(config_bytes)
    return {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_bytes),
        },
        "layers": [],
    }


def test_index_naming_another_index_is_an_error(registry_with, tmp_path):
    content = Content()
    inner = content.manifest({"schemaVersion": 2, "mediaType": INDEX, "manifests": []})
    platform = {"os": "linux", "architecture": "amd64"}
    entry = {"mediaType": INDEX, "digest": inner, "size": 60, "platform": platform}
    outer = {"mediaType": INDEX, "manifests": [entry]}
    content.manifest({"schemaVersion": 2, **outer}, tag="1")
    with pytest.raises(RegistryError, match="names another index for linux/amd64"):
        probe_registry(ImageRef.parse(registry_with(content)), Cache(tmp_path / "cache"))


@pytest.mark.parametrize(
    "config",
    [
        {"architecture": "amd64", "config": ["not", "an", "object"]},
        {"architecture": "amd64", "config": {"Env": [1, 2]}},
    ],
)
def test_malformed_image_config_is_one_registry_error(registry_with, tmp_path, config):
    content = Content()
    content.manifest(_image(content, config), tag="1")
    with pytest.raises(RegistryError, match="malformed manifest or image config"):
        probe_registry(ImageRef.parse(registry_with(content)), Cache(tmp_path / "cache"))


def test_layer_without_its_digest_is_one_registry_error(registry_with, tmp_path):
    content = Content()
    manifest = _image(content, {"architecture": "amd64", "config": {}})
    manifest["layers"] = [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"}]
    content.manifest(manifest, tag="1")
    with pytest.raises(RegistryError, match="malformed manifest or image config"):
        probe_registry(ImageRef.parse(registry_with(content)), Cache(tmp_path / "cache"))


def test_ld_cache_with_an_unterminated_string_reads_as_empty():
    """A string offset past every NUL made `bytes.index` raise ValueError mid-probe."""
    header = LD_CACHE_MAGIC + struct.pack("<II", 1, 0) + b"\0" * 20
    entry = struct.pack("<iII", 1, 48 + 24, 48 + 24)  # both strings start at the tail
    assert ld_cache_entries(header + entry + b"libx.so.1") == []


def _tar(entries: list[tuple[str, bytes | str | None]]) -> io.BytesIO:
    return io.BytesIO(layer_tar(entries))


def test_layer_paths_stay_inside_the_model():
    """`../`, absolute names and symlinks out all land inside the model's own tree."""
    layers = Layers(ARCHES["amd64"], [])
    status = b"Package: libc6\nStatus: install ok installed\nVersion: 2.41-12\n\n"
    layers.apply(
        _tar(
            [
                ("../../../var/lib/dpkg/status", status),
                ("/usr/lib/x86_64-linux-gnu/libz.so.1", "../../../../../../etc/libz.so.1"),
                ("usr/bin/python3", "/../../../usr/bin/python3.13"),
            ]
        )
    )
    assert "var/lib/dpkg/status" in layers.entries
    assert all(not p.startswith(("/", "..")) for p in layers.entries)
    assert layers.realpath("usr/lib/x86_64-linux-gnu/libz.so.1") == "etc/libz.so.1"
    assert layers.facts()["python3_link"] == "usr/bin/python3.13"
    assert layers.facts()["glibc"] == "2.41"


def test_whiteouts_of_directories_and_opaque_directories():
    layers = Layers(ARCHES["amd64"], [])
    lib = "usr/lib/x86_64-linux-gnu"
    layers.apply(_tar([(f"{lib}/liba.so.1", "liba.so.1.0"), (f"{lib}/sub/libb.so.1", "x")]))
    layers.apply(_tar([(f"{lib}/.wh.sub", b""), (f"{lib}/libc.so.1", "y")]))
    assert set(layers.entries) == {f"{lib}/liba.so.1", f"{lib}/libc.so.1"}
    layers.apply(_tar([(lib, None), (f"{lib}/.wh..wh..opq", b""), (f"{lib}/libd.so.1", "z")]))
    assert set(layers.entries) == {f"{lib}/libd.so.1"}


def test_offered_arches_of_a_malformed_index_is_unknown(registry_with):
    """Index entries that are not objects: the registry's answer is unusable, so unknown."""
    content = Content()
    content.manifest({"schemaVersion": 2, "mediaType": INDEX, "manifests": ["amd64"]}, tag="1")
    assert offered_arches(ImageRef.parse(registry_with(content)), None) is None
