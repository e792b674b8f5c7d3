"""OCI 1.1 attachments: artifacts whose `subject` is an image, and finding them again.

An attachment (an SBOM, a provenance statement) is an image manifest with an `artifactType`,
the empty config (the 2-byte `{}` blob of the OCI empty media type), one layer
holding the document, and `subject` = the descriptor of the image it is about. A registry with
the referrers API (`GET /v2/<repo>/referrers/<digest>`) indexes it on its own; one without
(`docker-registry` 2.8 answers 404 there) is given what the distribution spec 1.1 asks a client
to write instead: an index tagged `sha256-<hex of the subject digest>` listing the referrers,
read, extended and written back, so that every attachment pushed before stays listed.
Reading goes the same two ways: the API where the registry answers it, else the fallback tag.
The values and the reading are here; the writing is `remote.attach`, beside every other write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from builder.errors import RegistryError
from builder.oci.client import RepositoryClient
from builder.oci.v1 import (
    EMPTY_CONFIG,
    OCI_EMPTY,
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    DescriptorRecord,
    canonical,
    digest_of,
)

MAX_DOCUMENT = 64 << 20


class Artifact(Protocol):
    """Anything attached to an image: its kind, its blobs, and its manifest naming the subject.

    An Attachment (one document) is one; a SOCI index (builder.oci.ztoc: the ztocs, and a
    manifest of soci's own shape) is another.
    """

    @property
    def artifact_type(self) -> str: ...

    def blobs(self) -> tuple[bytes, ...]:
        """What the registry must hold before the manifest is put."""
        ...

    def manifest(self, subject: Descriptor) -> bytes:
        """The manifest that attaches it to `subject`."""
        ...


@dataclass(frozen=True)
class Attachment:
    """One document to attach to an image: what kind it is, and its bytes."""

    artifact_type: str  # also the layer's media type
    document: bytes

    def blobs(self) -> tuple[bytes, ...]:
        return (EMPTY_CONFIG, self.document)

    def manifest(self, subject: Descriptor) -> bytes:
        return artifact_manifest(subject, self)


@dataclass(frozen=True)
class Referrer:
    """An artifact found attached to an image: its manifest's descriptor and artifactType."""

    digest: str
    size: int
    artifact_type: str

    def to_dict(self) -> DescriptorRecord:
        return DescriptorRecord(
            mediaType=OCI_MANIFEST,
            digest=self.digest,
            size=self.size,
            artifactType=self.artifact_type,
        )


def artifact_manifest(subject: Descriptor, attachment: Attachment) -> bytes:
    """The manifest that attaches `attachment` to `subject`, serialized canonically."""
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": attachment.artifact_type,
            "config": {
                "mediaType": OCI_EMPTY,
                "digest": digest_of(EMPTY_CONFIG),
                "size": len(EMPTY_CONFIG),
            },
            "layers": [
                {
                    "mediaType": attachment.artifact_type,
                    "digest": digest_of(attachment.document),
                    "size": len(attachment.document),
                }
            ],
            "subject": {
                "mediaType": subject.media_type,
                "digest": subject.digest,
                "size": subject.size,
            },
        }
    )


def fallback_tag(subject_digest: str) -> str:
    """The referrers tag schema's tag for a subject: `sha256-<hex>`."""
    algorithm, _, hexdigest = subject_digest.partition(":")
    return f"{algorithm}-{hexdigest}"


def referrers_index(kept: Sequence[Referrer], new: Sequence[Referrer]) -> bytes:
    """The fallback tag's index: what it listed, then the new referrers it did not list."""
    known = {one.digest for one in kept}
    entries = [*kept, *(one for one in new if one.digest not in known)]
    return canonical(
        {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [e.to_dict() for e in entries]}
    )


def referrers(registry: RepositoryClient, subject_digest: str) -> tuple[Referrer, ...]:
    """Every artifact attached to `subject_digest`: from the API, else from the fallback tag."""
    listing = api_listing(registry, subject_digest)
    return listing if listing is not None else fallback_listing(registry, subject_digest)


def attached_document(registry: RepositoryClient, referrer: Referrer) -> bytes:
    """The document an attachment holds (its one layer), verified against its digest."""
    body, _ = registry.manifest(referrer.digest)
    try:
        layers = json.loads(body)["layers"]
        layer = Descriptor.from_dict(layers[0])
    except (ValueError, KeyError, TypeError, IndexError):
        raise RegistryError(f"{registry.label}@{referrer.digest}: not an attachment") from None
    if layer.size > MAX_DOCUMENT:
        raise RegistryError(f"{registry.label}@{referrer.digest}: its document is too large")
    return registry.small_blob(layer.digest)


def api_listing(registry: RepositoryClient, subject_digest: str) -> tuple[Referrer, ...] | None:
    """The referrers API's answer; None where the registry has no such API (404)."""
    found = registry.document(registry.url("referrers", subject_digest), OCI_INDEX, MAX_DOCUMENT)
    if found is None:
        return None
    content_type, body = found
    if OCI_INDEX not in content_type:
        return None  # something else answered the path: not the API
    return _parsed(registry, body)


def fallback_listing(registry: RepositoryClient, subject_digest: str) -> tuple[Referrer, ...]:
    tag = fallback_tag(subject_digest)
    head = registry.open(registry.url("manifests", tag), "HEAD", accept=OCI_INDEX, missing_ok=True)
    if head is None:
        return ()
    head.close()
    body, _ = registry.manifest(tag)
    return _parsed(registry, body)


def _parsed(registry: RepositoryClient, body: bytes) -> tuple[Referrer, ...]:
    try:
        entries = json.loads(body)["manifests"]
        return tuple(
            Referrer(str(entry["digest"]), int(entry["size"]), str(entry.get("artifactType") or ""))
            for entry in entries
        )
    except (ValueError, KeyError, TypeError):
        raise RegistryError(f"{registry.label}: its referrers index is malformed") from None
