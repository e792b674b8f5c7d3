"""The publisher against a loopback fake registry (fast tier): the index a merge writes, the tag
moved last, the template rendered before any write and written after; which publisher a target
asks for. The real registry and the real cosign run the same path in
tests/integration/test_parts.py, test_sign_cosign.py and test_end_to_end.py."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fakeregistry import Reply, Server

from builder.cache import Cache
from builder.errors import UserError
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.v1 import Descriptor, Image
from builder.publish.publisher import (
    ByDigest,
    ByTag,
    Publishing,
    Target,
    index_of,
    publish_index,
    publisher,
    template_pointing,
)
from builder.reporter import QUIET
from builder.retry import Retries

TEMPLATE = (
    "apiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxTemplate\n"
    "spec:\n  podTemplate:\n    spec:\n      containers:\n      - name: runtime\n"
    "        image: OLD_IMAGE\n"
)


def image(arch: str) -> Image:
    config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {}}).encode()
    layer = Descriptor("", "sha256:" + hashlib.sha256(arch.encode()).hexdigest(), 10)
    return Image.build(config, [layer])


class Registry:
    """Accepts every manifest PUT (by digest or tag) and logs them in order; holds nothing."""

    def __init__(self, refuse_tags: bool = False) -> None:
        self.refuse_tags = refuse_tags
        self.server = Server(self.route)

    def route(self, method: str, path: str) -> Reply:
        reference = path.rpartition("/")[2]
        if method == "PUT" and "/manifests/" in path:
            if self.refuse_tags and not reference.startswith("sha256:"):
                return 400, {}, b'{"errors": [{"code": "TAG_INVALID"}]}'
            return 201, {}, b""
        return 404, {}, b""

    def puts(self) -> list[str]:
        return [path.rpartition("/")[2] for method, path, _ in self.server.seen if method == "PUT"]


@pytest.fixture
def loopback() -> Iterator[Registry]:
    served = Registry()
    try:
        yield served
    finally:
        served.server.close()


def publishing(registry: Registry, template: Path | None = None) -> Publishing:
    repository = ImageRef.parse_repository(f"127.0.0.1:{registry.server.port}/team/app")
    target = Target(repository, "v1", {"org.opencontainers.image.version": "1"})
    return Publishing(target, QUIET, Retries(), pointing=template_pointing(template, None))


def test_one_arch_has_no_index_and_several_arches_one_in_order() -> None:
    amd, arm = image("amd64"), image("arm64")
    assert index_of([("amd64", amd)], {}) is None
    index = index_of([("amd64", amd), ("arm64", arm)], {"a": "b"})
    assert index is not None
    document = json.loads(index.manifest_bytes)
    assert [m["digest"] for m in document["manifests"]] == [amd.digest, arm.digest]
    assert [m["platform"]["architecture"] for m in document["manifests"]] == ["amd64", "arm64"]
    assert document["annotations"] == {"a": "b"}


def test_a_merge_writes_the_index_then_moves_the_tag_then_points_the_template(
    loopback: Registry, tmp_path: Path
) -> None:
    registry = loopback
    template = tmp_path / "template.yaml"
    template.write_text(TEMPLATE)
    asked = publishing(registry, template)
    images = [("amd64", image("amd64")), ("arm64", image("arm64"))]
    client = RepositoryClient(asked.target.repository)
    published = publish_index(asked, client, images)
    index = index_of(images, asked.target.annotations)
    assert index is not None and published.written.reference.endswith(f"@{index.digest}")
    assert registry.puts() == [index.digest, "v1"]  # the parts' images are not written again
    assert f"image: {client.label}@{index.digest}" in template.read_text()
    assert published.template_change is not None and published.template_change.changed


def test_a_failed_tag_leaves_the_template_as_it_was(tmp_path: Path) -> None:
    refusing = Registry(refuse_tags=True)
    try:
        template = tmp_path / "template.yaml"
        template.write_text(TEMPLATE)
        asked = publishing(refusing, template)
        client = RepositoryClient(asked.target.repository)
        with pytest.raises(UserError):
            publish_index(asked, client, [("amd64", image("amd64"))])
        assert template.read_text() == TEMPLATE
    finally:
        refusing.server.close()


def test_a_part_is_published_by_digest_and_a_run_by_tag(tmp_path: Path) -> None:
    repository = ImageRef.parse_repository("registry.example/team/app")
    cache = Cache(tmp_path / "cache")
    by_tag = Publishing(Target(repository, "v1"), QUIET, Retries())
    by_digest = Publishing(Target(repository, "v1", by_digest=True), QUIET, Retries())
    assert isinstance(publisher(by_tag, cache, tmp_path), ByTag)
    assert isinstance(publisher(by_digest, cache, tmp_path), ByDigest)
