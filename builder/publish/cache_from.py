"""`--cache-from REF`: an image this tool pushed seeds the local cache (a fresh CI runner).

What `REF`'s build learned is attached to each of its arch images as the build facts document
(builder.publish.build_facts), pinned by the image's config label. `open_source` reads it
while the set resolves: REF's images, the label, the attachment that hashes to it (no other
is trusted). `seed` then gives the run what the document may serve it (`reusable`, for the
lock's wheels only): each inspection record into the cache (inspect_as_ready finds it: no
inspection), and each distribution layer pulled in parallel with the downloads: its gzip blob
inflated into a temporary file as it streams, the tar checked against the config's diff ID
once it is whole (Cache.writing_blob), the blob against the manifest's digest after it has
all streamed; then, once the wheels it holds are downloaded, the tar is checked against them
(builder.layers.layer.pulled_mismatch: exactly the members, modes, owner, date and bytes the
writer makes of them) and recorded where the layer writer looks
(builder.layers.layer.adopt_layer: no layout). Bytecode is never taken from REF: a `.pyc`
runs in place of its source and cannot be checked against it without compiling it, so the
run compiles. REF's blobs are remembered as held by its repository
(builder.publish.blob_memory), so a push to the same registry mounts them.

Nothing here fails a run: a REF unreachable, absent, foreign (no facts, another format) or
tampered with (a document that is not the one the label names, a layer that does not hold
its diff ID) is one warning line naming REF and why, and the run builds cold what it could not
take. What REF's pusher could push is what REF can give: the label pins the document to the
image, not the image to its maker (give REF by digest, as the state's default is, or sign).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path

from builder import credentials
from builder.cache import CHUNK, Cache
from builder.errors import UserError
from builder.inspect.wheel_reader import directory_facts
from builder.inspect.wheels import RECORD_KIND, WheelInspection
from builder.layers.install_layout import LAYER_TAR, tar_bound
from builder.layers.layer import Layer, adopt_layer, expected_layer, pulled_mismatch
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import attached_document, referrers
from builder.oci.remote import platform_image, read
from builder.oci.transport import VerifiedBlob
from builder.oci.v1 import Descriptor, Image, Index, Platform, digest_of
from builder.publish.blob_memory import blob_memory
from builder.publish.build_facts import (
    FACTS_LABEL,
    FACTS_TYPE,
    FORMATS,
    BuildFacts,
    LaidOut,
    parse_facts,
    reusable,
)
from builder.retry import Retries

Warn = Callable[[str], None]


@dataclass(frozen=True)
class Source:
    """A trusted REF: its facts, and where each layer its images hold is (diff ID -> blob)."""

    ref: str
    registry: RepositoryClient
    facts: BuildFacts
    blobs: Mapping[str, Descriptor]


@dataclass
class Seeded:
    """What the sources gave a run: each wheel's layer pull (sha256 -> it), each layer's
    (diff ID -> it), the wheels each source's facts served, and each wheel's inspection record
    as it is checked against the download (sha256 -> it)."""

    sources: tuple[str, ...]  # the images asked, trusted or not
    pulls: dict[str, Future[bool]] = field(default_factory=dict)  # wheel sha256 -> its pull
    layers: dict[str, Future[bool]] = field(default_factory=dict)  # diff ID -> its pull
    reuse: dict[str, frozenset[str]] = field(default_factory=dict)  # ref -> wheels it serves
    inspections: dict[str, Future[bool]] = field(default_factory=dict)  # sha256 -> its check

    def wait(self) -> None:
        """Every pull ended (a failed one warned and counts as not pulled)."""
        for pull in (*self.layers.values(), *self.inspections.values()):
            pull.result()

    def record(self, distributions: int, stacks: Iterable[LaidOut]) -> dict[str, object]:
        """report.json's `cache_from` (docs/report.md), once the pulls ended: a distribution is
        reused when the layer holding it in `stacks` (the run's distribution layers) is one a
        pull gave, and its inspection came from the same source."""
        pulled = {diff_id for diff_id, pull in self.layers.items() if pull.result()}
        laid = {sha for one in stacks if one.diff_id in pulled for sha in one.wheels}
        laid = {sha for sha in laid if sha in self.inspections and self.inspections[sha].result()}
        reused = {ref: len(shas & laid) for ref, shas in self.reuse.items()}
        return {
            "sources": list(self.sources),
            "reused": sum(reused.values()),
            "distributions": distributions,
            "by_source": reused,
        }


def open_source(
    ref: ImageRef, arches: Sequence[str], retries: Retries, warn: Warn
) -> Source | None:
    """REF's images (of an index, the run's arches), their facts, if REF is trusted; else None
    with one warning (unreachable, absent, foreign, tampered)."""
    named = ref.as_written
    try:
        registry = credentials.registry(ref, named, retries)
        images = _images(registry, read(registry), arches)
        return _trusted(named, registry, images)
    except Exception as error:  # REF's data, however crafted: one line (an interrupt is not)
        warn(f"--cache-from {named}: {_said(error)[:300]}; building without it")
        return None


def _images(registry: RepositoryClient, found: Image | Index, arches: Sequence[str]) -> list[Image]:
    """The arch images of REF the run builds (an image alone: itself, whatever its arch: the
    facts say which wheels they are of)."""
    if isinstance(found, Image):
        return [found]
    images = []
    for arch in arches:
        try:
            images.append(platform_image(registry, found, Platform.linux(arch)))
        except UserError:  # not of this arch: another arch's may serve
            continue
    if not images:
        raise UserError(f"it holds no image for {', '.join(arches)}")
    return images


def _trusted(ref: str, registry: RepositoryClient, images: Sequence[Image]) -> Source:
    """The facts the images' label names, from the attachment hashing to it, and the blob of
    each diff ID; UserError when no image names a document, or no attachment is the one."""
    labelled = [(image, image.config_file.labels.get(FACTS_LABEL)) for image in images]
    named = [(image, label) for image, label in labelled if label]
    if not named:
        raise UserError("its image carries no build facts (not pushed by a build of this tool)")
    image, label = named[0]
    document = next(
        (
            found
            for one in referrers(registry, image.digest)
            if one.artifact_type == FACTS_TYPE
            and digest_of(found := attached_document(registry, one)) == label
        ),
        None,
    )
    if document is None:
        raise UserError(f"no build facts attached hash to its label {label[:19]}: not trusted")
    blobs = {
        diff_id: layer
        for image, found in named
        if found == label
        for diff_id, layer in zip(image.diff_ids, image.layers, strict=True)  # else malformed
    }
    return Source(ref, registry, parse_facts(document), blobs)


@dataclass(frozen=True)
class Seeding:
    """Where a run's seeds go: its cache, the pool the pulls run on, its warnings, and its
    downloads (a pulled layer is checked against its wheels)."""

    cache: Cache
    pool: Executor
    warn: Warn
    wheels: Mapping[str, Future[Path]]  # the run's downloads (sha256 ->): a pull checks them


def seed(
    asked: Sequence[ImageRef],
    sources: Sequence[Source | None],
    lock: Mapping[str, str],
    seeding: Seeding,
) -> Seeded:
    """The lock's wheels (sha256 -> file name) the sources (those of `asked` that are trusted)
    serve, first source first: their inspection records put in the cache now, their layers
    pulled on the pool."""
    cache, pool, warn = seeding.cache, seeding.pool, seeding.warn
    seeded = Seeded(tuple(ref.as_written for ref in asked))
    memory = blob_memory(cache)
    for source in sources:
        if source is None:
            continue
        held = source.registry.ref
        memory.remember(held.registry, held.repository, [b.digest for b in source.blobs.values()])
        left = {sha: name for sha, name in lock.items() if sha not in seeded.pulls}
        try:
            reuse = reusable(source.facts, FORMATS, left, tuple(source.blobs))
        except Exception as error:  # REF's data, however crafted: one line
            warn(f"--cache-from {source.ref}: its build facts are not trusted: {_said(error)}")
            continue
        for why in reuse.refused:
            warn(f"--cache-from {source.ref}: {why}; inspected here")
        for sha, inspection in reuse.inspections.items():
            if sha not in seeded.inspections:
                job = pool.submit(_inspection, source, inspection, seeding)
                seeded.inspections[sha] = job
        for one in reuse.layers:
            if one.diff_id in seeded.layers:
                continue
            pull = seeded.layers[one.diff_id] = pool.submit(_pulled, source, one, seeding)
            for sha in one.wheels:
                seeded.pulls.setdefault(sha, pull)
        seeded.reuse[source.ref] = reuse.distributions
    return seeded


def _inspection(source: Source, inspection: WheelInspection, seeding: Seeding) -> bool:
    """`inspection` put in the cache once the wheel is here and its file and zip directory say
    what the record says (size, installed size, newest date: what a cold inspection reads of
    them first); False, with a warning, when they do not."""
    path = seeding.wheels[inspection.sha256].result()
    recorded = inspection.size, inspection.installed_size, inspection.newest
    try:
        if (found := directory_facts(path)) != recorded:
            raise ValueError(f"its record says size, installed size, date {recorded}, not {found}")
        seeding.cache.put_record(RECORD_KIND, inspection.sha256, inspection.to_dict())
    except Exception as error:  # a record, however crafted, is one line
        seeding.warn(f"--cache-from {source.ref}: {path.name}: {_said(error)}; inspected here")
        return False
    return True


def _pulled(source: Source, one: LaidOut, seeding: Seeding) -> bool:
    """`one`'s tar in the cache (pulled unless it is there), recorded as its wheels' layer once
    it is checked against the run's own wheels (their downloads waited for first): whoever
    pushed REF chose its config, so a diff ID alone does not say a tar is those wheels' layer.
    What the facts say of it must fit those wheels before it is pulled: its date theirs, its
    size no more than a layer of them can take (the inflating stops there). False, with a
    warning, when the blob is not what the image says it is or not the wheels' layer."""
    wheels = [seeding.wheels[sha].result() for sha in one.wheels]
    layer = None
    try:
        expected = expected_layer(wheels, FORMATS.root, frozenset(one.shadowed))
        if one.sde != expected.epoch:
            raise ValueError(f"its facts date it {one.sde}, not the wheels' {expected.epoch}")
        if one.size > (bound := tar_bound(expected.members)):
            raise ValueError(f"its facts say {one.size} bytes, more than the {bound} it can be")
        layer = _pull(source, one, seeding.cache)
        problem = pulled_mismatch(layer, expected)
    except Exception as error:  # a blob or a tar, however crafted, is one line
        problem = _said(error)
    if layer is not None and problem is None:
        adopt_layer(seeding.cache, one.wheels, one.shadowed, FORMATS.root, layer)
        return True
    names = ", ".join(wheel.name for wheel in wheels)
    seeding.warn(_untrusted(source, one, f"{problem}; not the layer of {names}", "laid out here"))
    return False


def _pull(source: Source, one: LaidOut, cache: Cache) -> Layer:
    """`one`'s tar in the cache: there already, or pulled, its gzip blob inflated into a
    temporary file (no more than the size its facts say: a blob inflating past it stops there,
    and nothing is kept), the tar checked against the diff ID once it is whole, the blob
    against the manifest's digest once it has all streamed."""
    hexdigest = _hex(one)
    if cache.checked_blob(hexdigest, LAYER_TAR) is None:
        blob = source.blobs[one.diff_id]

        def unpacked(stream: VerifiedBlob) -> None:  # restartable: a new temp file each
            with (
                cache.writing_blob(hexdigest, LAYER_TAR) as out,  # checked: the diff ID
                gzip.GzipFile(fileobj=stream, mode="rb") as tar,  # type: ignore[call-overload]
            ):
                written = 0
                while chunk := tar.read(CHUNK):
                    written += len(chunk)
                    if written > one.size:  # the partial file goes with the context
                        raise ValueError(f"it inflates past the {one.size} bytes its facts say")
                    out.write(chunk)

        source.registry.read_blob(blob.digest, unpacked)
    path = cache.blob_path(hexdigest, LAYER_TAR)
    if path.stat().st_size != one.size:
        raise ValueError(f"{path.stat().st_size} bytes, not the {one.size} its facts say")
    return Layer(path, one.diff_id, one.size, one.sde)


def _hex(one: LaidOut) -> str:
    return one.diff_id.removeprefix("sha256:")


def _untrusted(source: Source, one: LaidOut, error: Exception | str, instead: str) -> str:
    said = error if isinstance(error, str) else _said(error)
    return (
        f"--cache-from {source.ref}: layer {one.diff_id[:19]} is not trusted"
        f" ({said[:200]}); {instead}"
    )


def _said(error: Exception) -> str:
    """An error as one line: its message, or its kind when it has none (a RecursionError)."""
    return " ".join(str(error).split()) or type(error).__name__
