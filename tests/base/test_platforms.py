"""Which arches a base offers: asked once per digest, never of a registry that is not its own.

A loopback registry serves a two-arch index; a fake engine holds the base as `docker image
inspect` describes it. The registry logs every request, so a cached answer shows as none.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.fakeregistry import INDEX, Content, Server

from builder.base.platforms import offered_arches
from builder.cache import Cache
from builder.oci.name import ImageRef


class Engine:
    """Holds one image, with the architecture the engine reports for it."""

    def __init__(self, architecture: str) -> None:
        attrs = {"Architecture": architecture}
        self.images = SimpleNamespace(get=lambda name: SimpleNamespace(attrs=attrs))


@pytest.fixture
def two_arch_base():
    """(the base's reference, its index digest, the registry's request log)."""
    content = Content()
    entries = [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
         "digest": f"sha256:{str(n) * 64}", "platform": {"os": "linux", "architecture": arch}}
        for n, arch in ((1, "amd64"), (2, "arm64"))
    ]  # fmt: skip
    digest = content.manifest({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}, "1")
    server = Server(content.route)
    yield ImageRef.parse(f"127.0.0.1:{server.port}/base:1"), digest, server.seen
    server.close()


def test_a_digest_is_asked_once_then_answered_from_the_cache(two_arch_base, tmp_path):
    ref, digest, seen = two_arch_base
    cache = Cache(tmp_path / "cache")
    assert offered_arches(ref, Engine("amd64"), digest, cache) == ("amd64", "arm64")
    asked = [path for _, path, _ in seen if "/manifests/" in path]
    assert asked == [f"/v2/base/manifests/{digest}"]  # the probed digest, not the moving tag
    seen.clear()
    assert offered_arches(ref, Engine("amd64"), digest, cache) == ("amd64", "arm64")
    assert seen == []


def test_without_a_cache_the_registry_is_asked_each_time(two_arch_base):
    ref, digest, seen = two_arch_base
    for _ in range(2):
        assert offered_arches(ref, Engine("amd64"), digest, None) == ("amd64", "arm64")
    assert len([path for _, path, _ in seen if "/manifests/" in path]) == 2


def test_an_image_named_here_offers_only_its_own_arch(two_arch_base, tmp_path):
    """No digest in the named repository (built, imported or tagged locally): the registry's
    image of that name may be another one, so it is not asked."""
    ref, _, seen = two_arch_base
    assert offered_arches(ref, Engine("arm64"), None, Cache(tmp_path / "cache")) == ("arm64",)
    assert seen == []
