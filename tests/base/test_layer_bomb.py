"""A base's layers are inflated under a bound: a small gzip bomb cannot make the probe run on.

The bound (MAX_UNPACKED, 8 GiB) is patched down so a few MiB of zeros stand in for a bomb.
"""

from __future__ import annotations

import gzip
import io
import json

import pytest
from support.fakeregistry import MANIFEST, Content, Server
from support.registryhelp import forget_credentials, layer_tar

from builder.base import layers as layers_module
from builder.base.from_registry import probe_registry
from builder.base.layers import Layers, Oversized
from builder.cache import Cache
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.resolve.target import ARCHES

GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
STATUS = b"Package: libc6\nStatus: install ok installed\nVersion: 2.41-12\n\n"


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    forget_credentials(monkeypatch, tmp_path / "home")


@pytest.fixture
def base_with():
    """Serve an amd64 image of the given gzip layers as 127.0.0.1:<port>/base:1."""
    servers: list[Server] = []

    def start(layers: list[bytes]) -> tuple[str, list[str]]:
        content = Content()
        config_bytes = json.dumps({"architecture": "amd64", "config": {}}).encode()
        config = content.blob(config_bytes)
        digests = [content.blob(layer) for layer in layers]
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config,
                "size": len(config_bytes),
            },
            "layers": [
                {"mediaType": GZIP_LAYER, "digest": d, "size": len(layer)}
                for d, layer in zip(digests, layers, strict=True)
            ],
        }
        content.manifest(manifest, tag="1")
        servers.append(Server(content.route))
        return f"127.0.0.1:{servers[-1].port}/base:1", digests

    yield start
    for server in servers:
        server.close()


def test_gzip_bomb_layer_is_one_error_naming_its_digest(base_with, monkeypatch, tmp_path):
    """4 MiB of zeros gzip to a few KiB; with a 1 MiB bound the probe stops and names the layer."""
    monkeypatch.setattr(layers_module, "MAX_UNPACKED", 1 << 20)
    sane = gzip.compress(layer_tar([("var/lib/dpkg/status", STATUS)]), mtime=0)
    bomb = gzip.compress(layer_tar([("zeros", bytes(4 << 20))]), mtime=0)
    assert len(bomb) < 64 << 10
    image, digests = base_with([sane, bomb])
    with pytest.raises(UserError) as caught:
        probe_registry(ImageRef.parse(image), Cache(tmp_path / "cache"))
    message = str(caught.value)
    assert digests[1] in message and digests[0] not in message
    assert "unpacks to more than 1048576 bytes" in message and "\n" not in message


def test_layers_within_the_bound_are_probed(base_with, monkeypatch, tmp_path):
    """The same image with the bomb's zeros under the bound reads to the end: gzip is read."""
    monkeypatch.setattr(layers_module, "MAX_UNPACKED", 8 << 20)
    sane = gzip.compress(layer_tar([("var/lib/dpkg/status", STATUS)]), mtime=0)
    zeros = gzip.compress(layer_tar([("zeros", bytes(4 << 20))]), mtime=0)
    image, _ = base_with([sane, zeros])
    assert probe_registry(ImageRef.parse(image), Cache(tmp_path / "cache")).glibc == "2.41"


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "gzip"])
def test_the_bound_is_on_the_unpacked_tar_to_the_byte(monkeypatch, compress):
    """A layer of exactly the bound is read; one byte less of bound refuses it."""
    tar = layer_tar([("var/lib/dpkg/status", STATUS), ("padding", bytes(20000))])
    blob = gzip.compress(tar, mtime=0) if compress else tar
    monkeypatch.setattr(layers_module, "MAX_UNPACKED", len(tar))
    layers = Layers(ARCHES["amd64"], [])
    layers.apply(io.BytesIO(blob))
    assert layers.facts()["glibc"] == "2.41"
    monkeypatch.setattr(layers_module, "MAX_UNPACKED", len(tar) - 1)
    with pytest.raises(Oversized, match=f"more than {len(tar) - 1} bytes"):
        Layers(ARCHES["amd64"], []).apply(io.BytesIO(blob))
