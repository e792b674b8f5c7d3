"""OCI 1.1 attachments on the real local registry (docker-registry 2.8: no referrers API).

Small images are written with `remote.write`, documents attached to them, and found again
through the referrers tag schema fallback: the `sha256-<hex>` index is read-modify-written,
so a second attachment keeps the first, the same one is not listed twice, and another image
pushed to the same repository leaves the first image's referrers alone. A failed attachment
moves no tag.
"""

from __future__ import annotations

import json
import uuid

import pytest
from support.machine import Registry as LocalRegistry
from support.registryhelp import registry_get, registry_tags

from builder.errors import RegistryError
from builder.oci.auth import Credentials
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import (
    Attachment,
    Referrer,
    attached_document,
    fallback_tag,
    referrers,
    referrers_index,
)
from builder.oci.remote import Blobs, InMemory, attach, write
from builder.oci.v1 import Descriptor, Image, digest_of

pytestmark = pytest.mark.usefixtures("registry")

SBOM = "application/vnd.cyclonedx+json"
INTOTO = "application/vnd.in-toto+json"


def _client(registry: LocalRegistry, repository: str) -> RepositoryClient:
    ref = ImageRef.parse(f"{registry.host}/{repository}:x")
    return RepositoryClient(ref, credentials=Credentials(registry.user, registry.password, "test"))


def _image(marker: str) -> tuple[Image, Blobs]:
    layer = f"layer {marker}".encode()
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    ).encode()
    image = Image.build(config, [Descriptor("", digest_of(layer), len(layer))], docker=False)
    return image, Blobs({digest_of(layer): InMemory(layer)})


@pytest.fixture()
def repository() -> str:
    return f"bsi-referrers-{uuid.uuid4().hex[:8]}/app"


def test_write_attaches_before_the_tag_and_the_fallback_tag_lists_them(
    registry: LocalRegistry, repository: str
) -> None:
    target = _client(registry, repository)
    image, blobs = _image("one")
    documents = (Attachment(SBOM, b'{"sbom": 1}'), Attachment(INTOTO, b'{"statement": 1}'))
    write(target, [image], blobs, tags=["v1"], attachments={image.digest: documents})
    found = referrers(target, image.digest)
    assert [r.artifact_type for r in found] == [SBOM, INTOTO]
    assert [attached_document(target, r) for r in found] == [d.document for d in documents]
    tag = fallback_tag(image.digest)
    assert tag == "sha256-" + image.digest.removeprefix("sha256:")
    assert registry_tags(registry, repository, referrers=True) == sorted([tag, "v1"])
    assert registry_tags(registry, repository) == ["v1"]
    with registry_get(registry, f"/v2/{repository}/manifests/{found[0].digest}") as response:
        manifest = json.load(response)
    assert manifest["artifactType"] == SBOM
    assert manifest["subject"]["digest"] == image.digest
    assert manifest["config"] == {
        "mediaType": "application/vnd.oci.empty.v1+json",
        "digest": digest_of(b"{}"),
        "size": 2,
    }


def test_the_fallback_index_keeps_what_it_listed_and_lists_nothing_twice(
    registry: LocalRegistry, repository: str
) -> None:
    target = _client(registry, repository)
    first, blobs = _image("first")
    write(target, [first], blobs, tags=["a"])
    subject = first.descriptor()
    attach(target, subject, [Attachment(SBOM, b"one")])
    attach(target, subject, [Attachment(INTOTO, b"two"), Attachment(SBOM, b"one")])
    assert [r.artifact_type for r in referrers(target, first.digest)] == [SBOM, INTOTO]
    second, more = _image("second")  # another image, another push, the same repository
    write(target, [second], more, tags=["b"], attachments={second.digest: [Attachment(SBOM, b"3")]})
    assert [r.artifact_type for r in referrers(target, first.digest)] == [SBOM, INTOTO]
    assert [attached_document(target, r) for r in referrers(target, second.digest)] == [b"3"]


def test_an_image_without_attachments_has_no_referrers(
    registry: LocalRegistry, repository: str
) -> None:
    target = _client(registry, repository)
    image, blobs = _image("bare")
    write(target, [image], blobs, tags=["bare"])
    assert referrers(target, image.digest) == ()


class RefusesAttachments(RepositoryClient):
    """The real registry, but a manifest with a `subject` is refused (a quota, a policy)."""

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        if b'"subject"' in body:
            raise RegistryError(f"{self.label}: attachment refused")
        return super().put_manifest(reference, body, media_type)


def test_a_failed_attachment_moves_no_tag(registry: LocalRegistry, repository: str) -> None:
    ref = ImageRef.parse(f"{registry.host}/{repository}:x")
    target = RefusesAttachments(ref, credentials=Credentials(registry.user, registry.password, "t"))
    image, blobs = _image("refused")
    with pytest.raises(RegistryError, match="attachment refused"):
        write(
            target,
            [image],
            blobs,
            tags=["v1"],
            attachments={image.digest: [Attachment(SBOM, b"x")]},
        )
    assert registry_tags(registry, repository, referrers=True) == []


def test_the_fallback_index_is_extended_never_rewritten() -> None:
    kept = [Referrer("sha256:" + "1" * 64, 10, SBOM)]
    new = [Referrer("sha256:" + "1" * 64, 10, SBOM), Referrer("sha256:" + "2" * 64, 20, INTOTO)]
    index = json.loads(referrers_index(kept, new))
    assert [entry["digest"] for entry in index["manifests"]] == [r.digest for r in new]
    assert index["manifests"][1]["artifactType"] == INTOTO
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
