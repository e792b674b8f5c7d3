"""The one home of the act of publishing: verified images in, a registry's index and tag out.

As ko keeps building apart from publishing, a producer makes and the delivery verifies
(builder.orchestration.delivery); a `Publisher` then writes what passed. Two implementations,
one sequence: `ByTag` (a one-job run: the tag moves, the template is pointed) and `ByDigest` (a
runner's part, builder.orchestration.runners.parts: the images and their attachments, no tag
moves). Each image is written by digest with its SBOM, provenance and SOCI index attached
(builder.layers.soci), then the index (`index_of`, its one builder), then, with a signing key,
the cosign signatures and attestations (builder.sign), the tag last (builder.oci.remote.write,
`sign_and_tag`): a failure leaves every tag and the template as they were. `merge` writes the
index of parts other jobs pushed through `ByTag.publish_index`, the same path. The template's
new text is rendered once the digest is known and before anything is written
(builder.publish.template.Pointing), so after the push it is only written; `record_state` is
the one writer of the state a later `rebuild` diffs against.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from builder import credentials
from builder.cache import Cache
from builder.config import RunSettings, Settings
from builder.context.render import add_to_output
from builder.errors import UserError
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import Artifact, Attachment
from builder.oci.remote import BlobMemory, Blobs, Tagged, Written, sign_and_tag, write
from builder.oci.v1 import Descriptor, Image, Index, Platform, digest_of
from builder.plan.plan import Plan
from builder.publish.blob_memory import blob_memory
from builder.publish.build_facts import FACTS_LABEL, FACTS_TYPE
from builder.publish.node_update import NodeUpdate, baseline, node_update, previous_images, total
from builder.publish.state import save_state, state_of
from builder.publish.tags import image_tag
from builder.reporter import Reporter
from builder.retry import Retries

if TYPE_CHECKING:  # imported where used: flatbuffers, ruamel and cryptography only when needed
    from builder.layers.soci import SociRecord
    from builder.oci.ztoc import SociIndex
    from builder.publish.attachments import Attestable
    from builder.publish.template import Pointing, TemplateChange
    from builder.sign.keys import SigningKey


@dataclass(frozen=True)
class Target:
    """Where the images go: the repository, the tag, the index's annotations."""

    repository: ImageRef
    tag: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    soci: bool = True  # attach a SOCI index (builder.layers.soci) to each image
    base: ImageRef | None = None  # the images' base: its own SOCI index lends its layers' ztocs
    by_digest: bool = False  # a runner's part (builder.orchestration.runners.parts): no tag moves


@dataclass(frozen=True)
class StateRecord:
    """Where a successful delivery records what it pushed, for a later `rebuild` to diff."""

    path: Path
    platform_version: str
    unpushed_too: bool = False  # a rebuild records its plan even when nothing was pushed


@dataclass(frozen=True)
class Made:
    """One arch's image as the publisher takes it, verified: how to get the value written, the
    config verified (the image written must carry exactly these bytes), its SBOM and
    provenance, and what its producer wrote itself (a rebase that pulls)."""

    arch: str
    value: Callable[[RepositoryClient, Path], tuple[Image, Blobs]]
    config: bytes
    attestable: Attestable | None = None
    early: Written | None = None
    extras: int = 0  # how many extras layers top the image (their blobs go in the report)
    import_reads: Sequence[str] = ()  # what verification's import of the set read (SOCI)
    facts: bytes | None = None  # the build facts its config's label names (build_facts)


@dataclass(frozen=True)
class ArchWritten:
    """What writing one arch's image did (report.json's per-arch push fields)."""

    digest: str  # its manifest's
    image_size: int  # config plus layers, compressed
    node_update: NodeUpdate  # what a node holding the previous image fetches and unpacks
    layer_blobs: tuple[Descriptor, ...] = ()  # the extras layers' blobs, bottom to top
    attachments: tuple[str, ...] | None = None  # files beside report.json; None: no facts read
    soci: SociRecord | None = None  # the SOCI index attached; None: --no-soci


@dataclass
class Published:
    """What a publisher wrote: the index (one arch: the image), what a node holding the
    previous images fetches, each arch's record, and the template's change."""

    written: Written
    node_update: NodeUpdate | None  # None: a merge (each part recorded its own)
    arches: dict[str, ArchWritten]
    template_change: TemplateChange | None = None
    notes: list[str] = field(default_factory=list)  # the warm pools' warnings


@dataclass(frozen=True)
class Publishing:
    """What every publish is given: the target, the run's reporter and registry retries, and
    what to do beside the push."""

    target: Target
    reporter: Reporter
    retries: Retries
    key: SigningKey | None = None  # cosign signatures and attestations of what is pushed
    pointing: Pointing | None = None  # the template to point at the digest (ByTag only)
    state: Path | None = None  # the state naming the image a node holds (else the tag's)


class Publisher(Protocol):
    """Writes verified images; the one interface the delivery calls."""

    def publish(self, made: Sequence[Made], maker: str) -> Published:
        """Every image of `made` written (`maker`: how an error names who made them)."""
        ...


@dataclass(frozen=True)
class ByTag:
    """A one-job run's publisher: images by digest, their index, the signatures, the tag
    moved last, then the template written (its text rendered before the push). `cache`: the
    blob memory and the SOCI ztocs; `output`: where the attachments go, beside report.json."""

    publishing: Publishing
    cache: Cache
    output: Path

    def publish(self, made: Sequence[Made], maker: str) -> Published:
        published = _publish(self, made, maker, moves_tag=True)
        _point(self.publishing.pointing, published)
        return published


@dataclass(frozen=True)
class ByDigest:
    """A runner's part: its image by digest with its attachments (and signatures); no tag
    moves, no template is pointed (`merge` does both, `publish_index`)."""

    publishing: Publishing
    cache: Cache
    output: Path

    def publish(self, made: Sequence[Made], maker: str) -> Published:
        return _publish(self, made, maker, moves_tag=False)


def publisher(publishing: Publishing, cache: Cache, output: Path) -> Publisher:
    """The publisher `publishing.target` asks for."""
    kind = ByDigest if publishing.target.by_digest else ByTag
    return kind(publishing, cache, output)


def publish_index(
    p: Publishing, registry: RepositoryClient, images: Sequence[tuple[str, Image]]
) -> Published:
    """Arch images other jobs pushed by digest (builder.orchestration.runners.parts): their
    index (one arch: the image itself) written, signed (each part signed its own image), the
    tag moved, the template pointed: `ByTag.publish`'s path once the images are in."""
    index = index_of(images, p.target.annotations)
    alone = [image for _, image in images] if index is None else []
    _render(p.pointing, registry, index or images[0][1])
    p.reporter.say(f"pushing {p.target.repository}:{p.target.tag} ...")
    written = _push(p, registry, _Manifests(alone, index), moves_tag=True)
    published = Published(written, None, {})
    _point(p.pointing, published)
    return published


def index_of(images: Sequence[tuple[str, Image]], annotations: Mapping[str, str]) -> Index | None:
    """The index of every arch's image (None with one arch: the image is published alone)."""
    if len(images) < 2:
        return None
    platforms = [Platform.linux(arch) for arch, _ in images]
    return Index.build(zip(platforms, [image for _, image in images], strict=True), annotations)


@dataclass(frozen=True)
class _Manifests:
    """What one write puts in: images by digest (with their blobs), the index, attachments."""

    images: Sequence[Image]
    index: Index | None
    blobs: Blobs = field(default_factory=Blobs)
    attachments: Mapping[str, tuple[Artifact, ...]] = field(default_factory=dict)
    attested: Mapping[str, Sequence[Attachment]] = field(default_factory=dict)  # to sign
    early: set[str] = field(default_factory=set)  # blobs a producer wrote itself
    memory: BlobMemory | None = None  # which repositories hold which blobs (a mount)


def _publish(by: ByTag | ByDigest, made: Sequence[Made], maker: str, moves_tag: bool) -> Published:
    """Every arch's image by digest, then (`moves_tag`) the tag names it (one arch) or an index
    of them; what a node holding the previous image (the state's, else the tag's) fetches and
    unpacks, in all; and what writing each arch recorded.

    The bytes written are checked to carry the config verified, byte for byte. Blobs other
    repositories of the registry hold are mounted from them (builder.publish.blob_memory).
    """
    p = by.publishing
    target = p.target
    registry = credentials.registry(target.repository, str(target.repository), p.retries)
    previous, before = previous_images(
        *baseline(p.state, registry, target.tag), [one.arch for one in made], p.reporter
    )
    named = " by digest" if target.by_digest else f":{target.tag}"
    p.reporter.say(f"pushing {target.repository}{named} ...")
    with tempfile.TemporaryDirectory(prefix="bsi-push-") as scratch:
        images, blobs = _images(made, registry, Path(scratch), maker)
        arches = [one.arch for one in made]
        index = index_of(list(zip(arches, images, strict=True)), target.annotations)
        if moves_tag:
            _render(p.pointing, registry, index or images[0])
        attested = {
            image.digest: one.attestable.attachments(str(target.repository), image.digest)
            for one, image in zip(made, images, strict=True)
            if one.attestable is not None
        }
        soci = _soci_indexes(made, images, target.base, by) if target.soci else {}
        manifests = _Manifests(
            images,
            index,
            blobs,
            _with_facts(_with_soci(attested, soci), made, images),  # in before the tags move
            attested,
            _early_blobs(made, images),
            blob_memory(by.cache),
        )
        written = _push(p, registry, manifests, moves_tag)
    recorded = _recorded(made, images, before, soci, by.output)
    for one in made:
        if one.early is not None:
            written = written.after(one.early)
    return Published(written, total(previous, [r.node_update for r in recorded.values()]), recorded)


def _push(
    p: Publishing, registry: RepositoryClient, manifests: _Manifests, moves_tag: bool
) -> Written:
    """The one write: every manifest in, then (with a key) the signatures, the tag last."""
    tags = [p.target.tag] if moves_tag else []
    written = write(
        registry,
        list(manifests.images),
        manifests.blobs,
        index=manifests.index,
        tags=[] if p.key else tags,  # signed: after the signatures
        attachments=dict(manifests.attachments),
        memory=manifests.memory,
        written=manifests.early,
    )
    if p.key is not None:  # every manifest is in: sign them, then move the tag
        signed = _signatures(registry, p, manifests)
        top = manifests.index or manifests.images[0]
        written = sign_and_tag(registry, written, top, signed, tags)
    return written


def _render(pointing: Pointing | None, registry: RepositoryClient, top: Image | Index) -> None:
    """The template's new text for the digest about to be written, before anything is: a
    template that cannot take it stops the push."""
    if pointing is not None:
        pointing.render(f"{registry.label}@{top.digest}")


def _point(pointing: Pointing | None, published: Published) -> None:
    """The template, rendered before the push, written for what was pushed."""
    if pointing is not None:
        published.template_change = pointing.write(published.written.reference)
        published.notes += pointing.notes


def _images(
    made: Sequence[Made], registry: RepositoryClient, scratch: Path, maker: str
) -> tuple[list[Image], Blobs]:
    """Each arch's image to write, and where its blobs are; each must carry the config
    verified, byte for byte."""
    images, blobs = [], Blobs()
    for one in made:
        image, sources = one.value(registry, scratch)
        if image.config_bytes != one.config:
            raise UserError(f"{maker}: the pushed config is not the one verified")
        images.append(image)
        blobs |= sources
    return images, blobs


def _signatures(registry: RepositoryClient, p: Publishing, manifests: _Manifests) -> list[Tagged]:
    """The cosign signatures of every image written and of their index (if any), and the
    attestations of each image's SBOM and provenance (builder.sign)."""
    from builder.sign.cosign import signed_push

    assert p.key is not None
    p.reporter.say(f"signing with {p.key.source} (cosign format, no transparency log)")
    digests = [image.digest for image in manifests.images]
    top = manifests.index.digest if manifests.index is not None else None
    repository = str(p.target.repository)
    return signed_push(registry, p.key, repository, digests, top, manifests.attested)


def _recorded(
    made: Sequence[Made],
    images: Sequence[Image],
    before: Mapping[str, Image],
    soci: Mapping[str, tuple[SociIndex | None, SociRecord]],
    output: Path,
) -> dict[str, ArchWritten]:
    """What writing each arch did, for report.json: its digest and size, what a node holding
    its previous image (`before`) fetches, its extras layers, its attachments (written beside
    report.json) and its SOCI index."""
    return {
        one.arch: ArchWritten(
            image.digest,
            image.size,
            node_update(image, before.get(one.arch)),
            tuple(image.layers[-one.extras :]) if one.extras else (),
            _write_attachments(one, output),
            soci[image.digest][1] if image.digest in soci else None,
        )
        for one, image in zip(made, images, strict=True)
    }


def _soci_indexes(
    made: Sequence[Made], images: Sequence[Image], base: ImageRef | None, by: ByTag | ByDigest
) -> dict[str, tuple[SociIndex | None, SociRecord]]:
    """Each image's SOCI index (None: no layer of it is indexed) and its report record (with
    what its verification's import of the set read, when it was verified)."""
    from builder.layers.soci import base_ztocs, soci_index, soci_record  # flatbuffers: a push's

    found = {}
    for one, image in zip(made, images, strict=True):
        index = soci_index(
            image, by.cache, base_ztocs(base, image, by.cache, by.publishing.retries)
        )
        found[image.digest] = (index, soci_record(image, index, one.import_reads))
    return found


def _with_soci(
    attached: Mapping[str, Sequence[Artifact]],
    soci: Mapping[str, tuple[SociIndex | None, SociRecord]],
) -> dict[str, tuple[Artifact, ...]]:
    """The attestations, and each image's SOCI index beside them (not attested: cosign attests
    documents about the image; `verify` checks the ztocs against the layers themselves)."""
    found = {digest: tuple(artifacts) for digest, artifacts in attached.items()}
    for digest, (index, _) in soci.items():
        if index is not None:
            found[digest] = (*found.get(digest, ()), index)
    return found


def _with_facts(
    attached: Mapping[str, tuple[Artifact, ...]], made: Sequence[Made], images: Sequence[Image]
) -> dict[str, tuple[Artifact, ...]]:
    """The attachments, and each image's build facts beside them (builder.publish.build_facts:
    what a later run's --cache-from reads), where its config's label names that document."""
    found = dict(attached)
    for one, image in zip(made, images, strict=True):
        if one.facts and image.config_file.labels.get(FACTS_LABEL) == digest_of(one.facts):
            found[image.digest] = (*found.get(image.digest, ()), Attachment(FACTS_TYPE, one.facts))
    return found


def _early_blobs(made: Sequence[Made], images: Sequence[Image]) -> set[str]:
    """The blobs of the images a producer already wrote to the target (to pull them)."""
    return {
        descriptor.digest
        for one, image in zip(made, images, strict=True)
        if one.early is not None
        for descriptor in (*image.layers, image.config_descriptor)
    }


def _write_attachments(one: Made, output: Path) -> tuple[str, ...] | None:
    """The documents attached to `one`, written beside report.json; their names."""
    if one.attestable is None:
        return None
    for name, document in one.attestable.documents.items():
        add_to_output(output, name, document)
    return tuple(sorted(one.attestable.documents))


def state_record(settings: Settings, unpushed_too: bool = False) -> StateRecord | None:
    """Where a run records what it pushed, of the platform version its settings give (None:
    no state asked; a run from a config, or `merge --state`, asks one)."""
    path = settings.asked.state
    return None if path is None else StateRecord(path, settings.platform_version, unpushed_too)


def record_state(state: StateRecord, plan: Plan, image: str | None, route: str) -> None:
    """The state a later `rebuild` diffs against: the plan, the platform version, the image
    pushed (None: a rebuild that pushed nothing) and how it was made (build, rebase)."""
    save_state(state.path, state_of(plan, state.platform_version, image, route))


def target_of(settings: Settings, annotations: Mapping[str, str]) -> Target | None:
    """Where a run's images go (None: nothing is pushed): the repository it was asked for,
    tagged `<platform-version>-x<extras hash>` (a runner's part moves no tag: by digest), the
    index annotated with the images' labels, a SOCI index with each unless --no-soci."""
    repository = settings.asked.push_repository
    if repository is None:
        return None
    tag = image_tag(settings.platform_version, settings.extras_hash)
    by_digest = settings.part is not None
    return Target(repository, tag, annotations, settings.asked.soci, settings.base, by_digest)


def pointing_of(settings: RunSettings) -> Pointing | None:
    """The run's template and warm pools (None: no template to point)."""
    return template_pointing(settings.template, settings.container, settings.warm_pools)


def template_pointing(
    template: Path | None, container: str | None, warm_pools: tuple[Path, ...] = ()
) -> Pointing | None:
    """`template` to point at what is pushed (None: none given)."""
    if template is None:
        return None
    from builder.publish.template import Pointing  # ruamel: only a run with a template

    return Pointing(template, container, warm_pools)
