"""Reading images from registries and writing them: `resolve` and `write`, for every caller.

`resolve(registry, platform)` is the one way from a reference to a platform's image: an index
is narrowed with `Index.pick` (the one variant rule), a plain manifest is taken when its config
is of the platform (or names none). `write` is the one way images reach a registry: every blob
is made present (HEAD, else a cross-repository mount from a repository of the same registry
that a `BlobMemory` remembers holding it or that `Blobs` names, else an upload from where
`Blobs` says it is: a file, bytes, or another registry's repository streamed across and
verified on both ends), each manifest is PUT by digest, then the images' attachments
(builder.oci.referrers), an index after its images, and only then are tags moved: until the
last PUT no tag has changed, so a failure part-way leaves the old tags as they were.

The memory is the caller's (a file in the tool's cache, builder.publish.blob_memory): the core
asks it where a blob may be mounted from and tells it, after a write succeeded, which blobs the
target now holds. A mount that fails for any reason (the other repository deleted it, no pull right
on it, a registry without mounts) falls back to the upload, so a stale memory costs a request,
never a push.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from builder.errors import RegistryError, RegistryUnreachable, UserError
from builder.oci.client import RepositoryClient
from builder.oci.name import TAG_RE
from builder.oci.referrers import (
    Artifact,
    Referrer,
    api_listing,
    fallback_listing,
    fallback_tag,
    referrers_index,
)
from builder.oci.v1 import (
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    Image,
    Index,
    Platform,
    digest_of,
    is_index,
)


@dataclass(frozen=True)
class LocalFile:
    """A blob in a file on this machine (a gzipped layer in the cache, say)."""

    path: Path


@dataclass(frozen=True)
class InMemory:
    """A small blob held as bytes (a config)."""

    data: bytes


@dataclass(frozen=True)
class InRepository:
    """A blob another repository holds: mounted on the same registry, else streamed across."""

    registry: RepositoryClient


BlobSource = LocalFile | InMemory | InRepository


@dataclass(frozen=True)
class Tagged:
    """A small manifest under a tag of its own, with the blobs it names: a cosign signature or
    attestation manifest (`sha256-<hex>.sig`, `.att`), written after the manifests it is about
    and before any tag of the write moves."""

    tag: str
    manifest: bytes
    media_type: str
    blobs: Mapping[str, bytes]  # digest -> bytes, uploaded unless the repository has them


@dataclass(frozen=True)
class Blobs:
    """Where an image's blobs come from, by digest; a config is always its image's own bytes.

    `mountable` are repositories that may hold any of them: on the target's registry they are
    tried for a mount before anything is uploaded.
    """

    sources: Mapping[str, BlobSource] = field(default_factory=dict)
    mountable: tuple[RepositoryClient, ...] = ()

    def __or__(self, other: Blobs) -> Blobs:
        """Both images' sources: what writing them together needs."""
        return Blobs({**self.sources, **other.sources}, (*self.mountable, *other.mountable))


MOUNT_TRIES = 3  # remembered repositories asked for one blob before it is uploaded


class BlobMemory(Protocol):
    """Which repositories of a registry hold which blobs, as this machine last saw them."""

    def holders(self, registry: str, digest: str) -> Sequence[str]:
        """Repositories of `registry` remembered holding `digest`, the most recent first."""
        ...

    def remember(self, registry: str, repository: str, digests: Iterable[str]) -> None:
        """`repository` holds `digests` now (a write there succeeded)."""
        ...

    def forget(self, registry: str, repository: str, digest: str) -> None:
        """A mount of `digest` from `repository` failed: do not offer it again."""
        ...


@dataclass(frozen=True)
class Transfer:
    """How a write's blobs got there: uploaded (and manifests), mounted, or already there."""

    uploaded: int = 0
    mounted: int = 0
    present: int = 0

    def __add__(self, other: Transfer) -> Transfer:
        return Transfer(
            self.uploaded + other.uploaded,
            self.mounted + other.mounted,
            self.present + other.present,
        )


@dataclass(frozen=True)
class Written:
    """What `write` left in the registry: the tagged manifest's digest, the tags, the cost."""

    repository: str
    digest: str
    tags: tuple[str, ...]  # full references, repository:tag
    bytes_uploaded: int  # blobs and manifests sent
    bytes_mounted: int = 0  # blobs linked from another repository of the registry
    bytes_present: int = 0  # blobs the repository already had

    @property
    def reference(self) -> str:
        """What a SandboxTemplate should name: immutable, unlike a tag."""
        return f"{self.repository}@{self.digest}"

    def after(self, earlier: Written) -> Written:
        """This write's figures with an `earlier` write's of the same push added.

        Each blob is counted once only if this write was told the earlier one's blobs
        (`write(..., written=...)`): those it neither checked nor counted as present.
        """
        return replace(
            self,
            bytes_uploaded=self.bytes_uploaded + earlier.bytes_uploaded,
            bytes_mounted=self.bytes_mounted + earlier.bytes_mounted,
            bytes_present=self.bytes_present + earlier.bytes_present,
        )


def read(
    registry: RepositoryClient, reference: str | None = None, expected: str | None = None
) -> Image | Index:
    """The image or index `reference` (default: the registry's own reference) names.

    `expected`: the digest a HEAD announced; a manifest of another digest is an IntegrityError.
    """
    body, digest = registry.manifest(reference or registry.ref.reference, expected)
    return _parsed(registry, digest, lambda: _document(registry, body))


def resolve(registry: RepositoryClient, platform: Platform, reference: str | None = None) -> Image:
    """The `platform` image `reference` names (through an index when it is one).

    Documents of another shape (an index naming an index, layers that are not descriptors, no
    diff IDs) are a RegistryError naming the image, not a traceback from deep in a caller.
    """
    return platform_image(registry, read(registry, reference), platform)


def platform_image(registry: RepositoryClient, found: Image | Index, platform: Platform) -> Image:
    """The `platform` image of a document already read from `registry`: itself, or the index's
    entry for it (the one rule every caller narrows an index by)."""
    if isinstance(found, Index):
        entry = found.pick(platform)
        if entry is None:
            raise UserError(f"{registry.label}@{found.digest}: no {platform} image in the index")
        child = read(registry, entry.digest)
        if isinstance(child, Index):
            raise RegistryError(f"{registry.label}: its index names another index for {platform}")
        return child
    if found.architecture and found.architecture != platform.architecture:
        raise UserError(
            f"{registry.label}@{found.digest} is a {found.architecture} image, not {platform}"
        )
    return found


def _document(registry: RepositoryClient, body: bytes) -> Image | Index:
    if is_index(body):
        return Index.parse(body)
    return Image.parse(body, registry.small_blob(_config_digest(body)))


def _config_digest(body: bytes) -> str:
    config = json.loads(body).get("config")
    digest = config.get("digest") if isinstance(config, dict) else None
    if not isinstance(digest, str):
        raise ValueError("config is not a descriptor")
    return digest


T = TypeVar("T")


def _parsed(registry: RepositoryClient, digest: str, parse: Callable[[], T]) -> T:
    try:
        return parse()
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise RegistryError(
            f"{registry.label}@{digest}: malformed manifest or image config ({str(error)[:100]})"
        ) from None


def upload_blobs(
    target: RepositoryClient,
    image: Image,
    blobs: Blobs,
    memory: BlobMemory | None = None,
    done: set[str] | None = None,
) -> Transfer:
    """Make every blob of `image` present in `target`; returns how each got there.

    The one place blobs are uploaded: HEAD first, then a mount from a same-registry repository
    (remembered ones first), then the blob's source. Digests in `done` (an earlier image of
    the same write) are skipped and not counted twice; those handled here are added to it.
    """
    mountable = [
        source.ref.repository
        for source in blobs.mountable
        if source.ref.registry == target.ref.registry
        and source.ref.repository != target.ref.repository
    ]
    config = image.config_descriptor
    done = set() if done is None else done
    moved = Transfer()
    for descriptor in (*image.layers, config):
        digest = descriptor.digest
        if digest in done:
            continue
        done.add(digest)
        if target.blob_exists(digest):
            moved += Transfer(present=descriptor.size)
            continue
        if _mounted(target, digest, memory, mountable):
            moved += Transfer(mounted=descriptor.size)
            continue
        source = InMemory(image.config_bytes) if descriptor is config else blobs.sources.get(digest)
        if isinstance(source, InMemory):
            target.upload_blob(source.data, digest)
        elif isinstance(source, LocalFile):
            target.upload_blob(source.path, digest)
        elif isinstance(source, InRepository):  # verified as it streams, and on arrival;
            target.upload_blob(partial(source.registry.blob, digest), digest)  # opened anew
            # after a fault (builder.oci.client.RepositoryClient.upload_blob says why)
        else:
            raise UserError(f"{target.label}: no source for blob {digest} of {image.digest}")
        moved += Transfer(uploaded=descriptor.size)
    return moved


def _mounted(
    target: RepositoryClient, digest: str, memory: BlobMemory | None, mountable: Sequence[str]
) -> bool:
    """Mount `digest` into `target` from a repository that may hold it; False: upload it.

    Any refusal (a 202 upload session, cancelled; no pull right on the source; a registry
    without mounts) only means the next candidate, then the upload. A remembered repository
    that could not mount the blob is forgotten for it.
    """
    registry, own = target.ref.registry, target.ref.repository
    remembered = [r for r in (memory.holders(registry, digest) if memory else ()) if r != own]
    remembered = remembered[:MOUNT_TRIES]
    for repository in dict.fromkeys([*remembered, *mountable]):
        try:
            if target.mount(digest, repository):
                return True
        except RegistryError as error:
            if isinstance(error, RegistryUnreachable):
                raise  # the upload would not get through either
        if memory and repository in remembered:
            memory.forget(registry, repository, digest)
    return False


def write(
    target: RepositoryClient,
    images: Sequence[Image],
    blobs: Blobs,
    *,
    index: Index | None = None,
    tags: Sequence[str] = (),
    attachments: Mapping[str, Sequence[Artifact]] | None = None,
    memory: BlobMemory | None = None,
    written: Collection[str] = (),
) -> Written:
    """Write `images` (and the `index` naming them) by digest, then move `tags` to it.

    The tags name the index, or the one image when there is no index. `attachments` (by image
    digest: its SBOM, its provenance) are attached once the images are in and before the index
    and the tags. All or nothing: no tag moves before every blob, manifest and attachment is in
    the registry. `memory` offers repositories to mount from, and learns what `target` holds
    once everything is written. `written`: digests of blobs an earlier write of this push put
    in `target` (Written.after counts them): neither checked again nor counted again.
    A signed push writes with no tags, then `sign_and_tag`.
    """
    if index is None and len(images) != 1 and tags:
        raise ValueError("tags name one image or an index")
    moved, done = Transfer(), set(written)
    for image in images:
        moved += upload_blobs(target, image, blobs, memory, done)
        target.put_manifest(image.digest, image.manifest_bytes, image.media_type)
        moved += Transfer(uploaded=len(image.manifest_bytes))
    for image in images:
        attached = attach(target, image.descriptor(), (attachments or {}).get(image.digest, ()))
        moved += Transfer(uploaded=attached)
    top: Image | Index = index if index is not None else images[0]
    if index is not None:
        target.put_manifest(index.digest, index.manifest_bytes, index.media_type)
        moved += Transfer(uploaded=len(index.manifest_bytes))
    names = move_tags(target, top, tags)
    if memory is not None:
        memory.remember(target.ref.registry, target.ref.repository, sorted(done))
    return Written(target.label, top.digest, names, moved.uploaded, moved.mounted, moved.present)


def attach(target: RepositoryClient, subject: Descriptor, attachments: Sequence[Artifact]) -> int:
    """Push each attachment of `subject` and list it where clients look; returns bytes sent.

    The subject's manifest must already be in `target`. Without a referrers API the fallback
    index is read and written back with the new entries added (none twice, none dropped).
    """
    sent = 0
    found: list[Referrer] = []
    for attachment in attachments:
        for blob in attachment.blobs():
            if not target.blob_exists(digest_of(blob)):
                target.upload_blob(blob, digest_of(blob))
                sent += len(blob)
        manifest = attachment.manifest(subject)
        target.put_manifest(digest_of(manifest), manifest, OCI_MANIFEST)
        sent += len(manifest)
        found.append(Referrer(digest_of(manifest), len(manifest), attachment.artifact_type))
    if found and api_listing(target, subject.digest) is None:
        index = referrers_index(fallback_listing(target, subject.digest), found)
        target.put_manifest(fallback_tag(subject.digest), index, OCI_INDEX)
        sent += len(index)
    return sent


def sign_and_tag(
    target: RepositoryClient,
    written: Written,
    top: Image | Index,
    signatures: Sequence[Tagged],
    tags: Sequence[str],
) -> Written:
    """After an untagged `write` of `top`: its signatures (builder.sign), then the tags.

    The tags still move last: a signature the registry refuses leaves them as they were.
    """
    sent = sum(put_tagged(target, signature) for signature in signatures)
    names = move_tags(target, top, tags)
    return replace(written, tags=names, bytes_uploaded=written.bytes_uploaded + sent)


def put_tagged(target: RepositoryClient, tagged: Tagged) -> int:
    """Its blobs (those `target` lacks), then the manifest under its tag; returns bytes sent."""
    sent = 0
    for digest, blob in tagged.blobs.items():
        if not target.blob_exists(digest):
            target.upload_blob(blob, digest)
            sent += len(blob)
    target.put_manifest(tagged.tag, tagged.manifest, tagged.media_type)
    return sent + len(tagged.manifest)


def move_tags(target: RepositoryClient, top: Image | Index, tags: Sequence[str]) -> tuple[str, ...]:
    """PUT the manifest under each tag (`name` or `repository:name`): the one tag writer."""
    names = []
    for tag in tags:
        name = tag.rpartition(":")[2] if "/" in tag or ":" in tag else tag
        if not TAG_RE.fullmatch(name):
            raise UserError(f"{tag!r} is not a valid image tag")
        target.put_manifest(name, top.manifest_bytes, top.media_type)
        names.append(f"{target.label}:{name}")
    return tuple(names)


def offered(registry: RepositoryClient, platforms: Sequence[Platform]) -> tuple[Platform, ...]:
    """Which of `platforms` the reference has an image for (from its index, or its config)."""
    found = read(registry)
    if isinstance(found, Index):
        return tuple(p for p in platforms if found.pick(p) is not None)
    return tuple(p for p in platforms if p.architecture == found.architecture)
