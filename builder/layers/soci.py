"""The SOCI index of an image about to be pushed: a ztoc for each layer the tool gzipped.

Every layer a push compresses goes through builder.layers.gzipped (the extras, the bytecode,
the apt layer a system image's save kept, a rebase's new layers, and the base's own layers when
the tool pushes the base itself: `base --tag`, or a local base saved from the engine), which
records its spans under the blob digest. Those layers get a ztoc (builder.oci.ztoc, built from
the gzip blob alone), cached under the blob digest, so a rebase or a second template that
pushes the same layer reuses it, and the registry already holding the ztoc blob skips its
upload. So a base the tool pushed from this cache is indexed in every image built on it. A base
layer this cache did not gzip (the base pushed from another machine, mounted by digest) takes
its ztoc from the base's own SOCI index in the registry, when the base carries one (`base
--tag` attaches it): `base_ztocs`. Any other layer has no ztoc: a lazy node fetches it whole, as
it fetches any layer the index does not name.

Every layer with a ztoc is indexed, however small: on a node with soci-snapshotter 0.4.1, a
layer the index does not name is fetched whole and unpacked before the container starts, one
such layer after another, while the indexed ones are mounted at once and read by range. soci
create's own default (10 MiB and up) left the 39 smaller layers of a 19-distribution image (71
MiB) to that serial path: 6.4-14.7 s of the pull, against 2.5-3.2 s with every layer indexed,
the ztocs of the small layers (a 32 KiB window each) fetched side by side with the others
(docs/performance.md, "Lazy loading"). An index of only the layers of 1 MiB and up started as
fast within the noise; indexing all of them leaves no serial fetch to grow with the set.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from builder import credentials
from builder.cache import Cache
from builder.errors import RegistryError, RegistryUnreachable, UserError
from builder.layers.gzipped import spans_of
from builder.layers.lazy_reads import LayerSpans, spans_read
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import referrers
from builder.oci.remote import read, resolve
from builder.oci.transport import VerifiedBlob
from builder.oci.v1 import Descriptor, Image, Index, Platform, digest_of
from builder.oci.ztoc import (
    SOCI_INDEX,
    ZTOC_VERSION,
    LayerZtoc,
    SociIndex,
    indexed_layers,
    ztoc_bytes,
)
from builder.oci.ztoc_read import flushed_at, mismatches, read_ztoc
from builder.retry import Retries

ZTOC_FORMAT = f"ztoc/{ZTOC_VERSION}/3"  # bump when what the tool writes into a ztoc changes


def soci_index(
    image: Image, cache: Cache, known: Mapping[str, bytes] = MappingProxyType({})
) -> SociIndex | None:
    """The SOCI index of `image`, or None when none of its layers has a ztoc: the tool's own
    (it gzipped the layer), else one `known` by layer digest (`base_ztocs`)."""
    ztocs: dict[str, LayerZtoc] = {}  # one entry for a layer the image holds twice
    for layer in image.layers:
        if layer.digest in ztocs:
            continue
        data = layer_ztoc(layer.digest, cache) or known.get(layer.digest)
        if data is not None:
            ztocs[layer.digest] = LayerZtoc(layer, data)
    return SociIndex(tuple(ztocs.values())) if ztocs else None


def layer_ztoc(digest: str, cache: Cache) -> bytes | None:
    """The ztoc of the gzip layer `digest` the tool wrote (None when it did not write it, the
    cache dropped it, or soci has no name for one of its tar entries: a sparse file in a
    saved base, say; that layer is then fetched whole, like any other it does not index).
    Made by one caller at a time: the push waits for the one `gzipped.ahead` is making."""
    key = hashlib.sha256(f"{ZTOC_FORMAT}\n{digest}".encode()).hexdigest()
    return cache.made_once(
        "layer-ztoc", key, lambda: _kept_ztoc(key, cache), lambda: _made_ztoc(digest, key, cache)
    )


def _kept_ztoc(key: str, cache: Cache) -> bytes | None:
    """The ztoc the cache keeps under `key`, or None."""
    known = cache.get_record("layer-ztoc", key)
    kept = known.get("digest") if isinstance(known, dict) else None
    if isinstance(kept, str) and (found := cache.find_blob(kept, "ztoc")):
        return found.read_bytes()
    return None


def _made_ztoc(digest: str, key: str, cache: Cache) -> bytes | None:
    """The ztoc of `digest` built from its gzip blob and span offsets, then kept under `key`."""
    blob = spans_of(digest, cache)
    if blob is None:
        return None
    try:
        data = ztoc_bytes(blob.path, blob.span_size, blob.spans)
    except UserError:
        return None
    ztoc_digest = hashlib.sha256(data).hexdigest()
    if cache.find_blob(ztoc_digest, "ztoc") is None:
        with cache.writing_blob(ztoc_digest, "ztoc") as out:
            out.write(data)
    cache.put_record("layer-ztoc", key, {"digest": ztoc_digest})
    return data


def base_ztocs(
    base: ImageRef | None, image: Image, cache: Cache, retries: Retries | None = None
) -> dict[str, bytes]:
    """Ztocs from the base's own SOCI index in the registry for the layers of `image`
    this cache has none for, by layer digest: what an image on a base this cache did not push
    reuses for the base's layers. None found (a Hub base, no index, an unreadable one, a ztoc
    that fails its check) is no ztoc: that layer is fetched whole by a lazy node, as before, and
    the push goes on.

    Whoever may push to the base's repository may attach a SOCI index to it, and every image on
    the base would carry its ztocs to the nodes; so a ztoc is reused only when it is exactly
    the one this tool writes for that layer, with every checkpoint a full flush (`_checked`),
    which takes one download of the layer, once per base: the verdict is kept in the cache.
    A registry still failing after the run's `retries` ends the push instead: a fault must not
    change what is pushed (its lazy nodes would fetch those layers whole)."""
    if base is None or base.is_hub:
        return {}
    wanted = {
        layer.digest: layer for layer in image.layers if layer_ztoc(layer.digest, cache) is None
    }
    if not wanted:
        return {}
    try:
        registry = credentials.registry(base, str(base), retries)
        on_base = resolve(registry, Platform.linux(image.architecture))
        ztocs: dict[str, bytes] = {}
        for index in attached_indexes(registry, on_base.digest):
            manifest, _ = registry.manifest(index)
            for layer_digest, ztoc_digest in indexed_layers(manifest).items():
                layer = wanted.get(layer_digest)
                if layer is not None and layer_digest not in ztocs:
                    data = _checked(registry, layer, ztoc_digest, cache)
                    if data is not None:
                        ztocs[layer_digest] = data
        return ztocs
    except RegistryUnreachable:
        raise
    except (RegistryError, UserError):
        return {}


def _checked(
    registry: RepositoryClient, layer: Descriptor, ztoc_digest: str, cache: Cache
) -> bytes | None:
    """The ztoc `ztoc_digest` of the base layer `layer` if it is what this tool writes for it;
    None otherwise (soci create's own, one made for other bytes, a hostile one). Read with a
    bound; the layer is downloaded to check it, once: the verdict is cached by both digests."""
    key = hashlib.sha256(f"{ZTOC_FORMAT}\n{layer.digest}\n{ztoc_digest}".encode()).hexdigest()
    verdict = cache.get_record("base-ztoc", key)
    if isinstance(verdict, dict) and verdict.get("reused") is False:
        return None
    kept = cache.find_blob(ztoc_digest.removeprefix("sha256:"), "ztoc")
    if isinstance(verdict, dict) and verdict.get("reused") is True and kept is not None:
        return kept.read_bytes()
    data = ztoc_blob(registry, ztoc_digest, layer)
    reused = data is not None and _is_our_ztoc(registry, layer, data, cache)
    cache.put_record("base-ztoc", key, {"reused": reused})
    if data is None or not reused:
        return None
    if kept is None:
        with cache.writing_blob(ztoc_digest.removeprefix("sha256:"), "ztoc") as out:
            out.write(data)
    return data


def attached_indexes(registry: RepositoryClient, digest: str) -> list[str]:
    """The SOCI indexes attached to the manifest `digest`, in digest order: a referrers listing
    has none, and the same order makes the same choice on every run."""
    found = referrers(registry, digest)
    return sorted(one.digest for one in found if one.artifact_type == SOCI_INDEX)


def ztoc_blob(registry: RepositoryClient, digest: str, layer: Descriptor) -> bytes | None:
    """The ztoc blob `digest` for `layer`, checked against its digest; None when it is larger
    than any ztoc of that layer can be (a window of 32 KiB per 4 MiB of tar, and the names),
    found before the rest of it is downloaded."""
    limit = layer.size // 4 + (4 << 20)

    def bounded(stream: VerifiedBlob) -> bytes:
        data = stream.read(limit + 1)
        if len(data) > limit:
            raise _Oversized(digest)  # a registry error leaves the rest undownloaded
        return data

    try:
        return registry.read_blob(digest, bounded)
    except _Oversized:
        return None


class _Oversized(RegistryError):
    """A blob larger than it can be: left without reading the rest."""


def _is_our_ztoc(registry: RepositoryClient, layer: Descriptor, data: bytes, cache: Cache) -> bool:
    """Whether `data` is byte for byte the ztoc this tool writes for `layer` at the ztoc's own
    span offsets, and each of those offsets starts a span that inflates alone from its window:
    what makes a lazy node read the layer's own bytes."""
    try:
        ztoc = read_ztoc(data)
    except UserError:
        return False
    spans = [point.compressed for point in ztoc.checkpoints]
    if ztoc.compressed_size != layer.size or not spans or spans != sorted(set(spans)):
        return False
    cache.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache.root, prefix=".base-layer-") as scratch:
        path = Path(scratch) / "layer.tar.gz"

        def copy(stream: VerifiedBlob) -> None:  # from the start again after a fault
            with path.open("wb") as out:
                shutil.copyfileobj(stream, out, 1 << 20)

        registry.read_blob(layer.digest, copy)
        try:
            if ztoc_bytes(path, ztoc.span_size, spans) != data:
                return False
        except UserError:
            return False
        return flushed_at(path, ztoc.checkpoints)


@dataclass(frozen=True)
class IndexedLayer:
    """One layer the SOCI index names: the layer's digest, its ztoc's digest and size."""

    layer: str
    ztoc: str
    size: int


@dataclass(frozen=True)
class SociRecord:
    """What report.json says of an arch image's SOCI index (docs/report.md)."""

    index: str | None  # the index manifest's digest; None: no layer was indexed
    ztocs: tuple[IndexedLayer, ...]
    normal_pull_bytes: int  # every layer: what a node without the snapshotter fetches
    lazy_before_mount_bytes: int  # the ztocs and every layer without one, fetched whole
    lazy_first_import_bytes: int | None  # and the spans the verified import read; None: unknown

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "ztocs": [{"layer": z.layer, "ztoc": z.ztoc, "size": z.size} for z in self.ztocs],
            "normal_pull_bytes": self.normal_pull_bytes,
            "lazy_before_mount_bytes": self.lazy_before_mount_bytes,
            "lazy_first_import_bytes": self.lazy_first_import_bytes,
        }


def soci_record(
    image: Image, index: SociIndex | None, first_import_reads: Sequence[str] = ()
) -> SociRecord:
    """The record of `image`'s index: the bytes a normal pull fetches (every layer) against
    what a lazy node fetches before it mounts the image (the ztocs, and whole every layer
    without one), and before the set's first import has finished: that, and the spans holding
    the files `first_import_reads` names (what verification saw one interpreter read to import
    the set; none: not verified, and the record says None). The layers the index names decide
    which copy of a file is read; one without a ztoc, fetched whole already, lists nothing."""
    indexed = {one.layer.digest: one.ztoc for one in index.ztocs} if index else {}
    unindexed = sum(layer.size for layer in image.layers if layer.digest not in indexed)
    before_mount = unindexed + sum(len(data) for data in indexed.values())
    first_import = None
    if first_import_reads:
        parsed = {digest: read_ztoc(data) for digest, data in indexed.items()}
        layers = [
            LayerSpans(one.size, parsed[one.digest]) for one in image.layers if one.digest in parsed
        ]
        first_import = before_mount + spans_read(layers, first_import_reads)
    return SociRecord(
        digest_of(index.manifest(image.descriptor())) if index else None,
        tuple(IndexedLayer(layer, digest_of(data), len(data)) for layer, data in indexed.items()),
        sum(layer.size for layer in image.layers),
        before_mount,
        first_import,
    )


def attached_index_problems(
    ref: ImageRef, retries: Retries | None = None
) -> tuple[str, list[str]] | None:
    """The SOCI indexes attached to the pushed image `ref` (of an index: every arch image it
    names, each with its own index, as a node of that arch reads it), checked: each names only
    layers of its image, and each ztoc's spans, windows and file table match its layer's bytes
    (each pair of layer and ztoc is checked once: the arches share their bytecode layers);
    an arch image without an index, when another has one, is a problem too. None when `ref`
    names no registry or no index is attached (--no-soci, or no layer the tool gzipped); else
    the indexes' digests and what is wrong (empty: all agrees). An index that cannot be read
    is a RegistryError or a UserError. Read as `retries` say."""
    if ref.is_hub:  # a local name, or Docker Hub: not where this tool pushes
        return None
    registry = credentials.registry(ref, str(ref), retries)
    found = read(registry)
    if isinstance(found, Index):
        images = [(entry.platform, read(registry, entry.digest)) for entry in found.manifests]
    else:
        images = [(None, found)]
    named, problems, unindexed = [], [], []
    checked: dict[tuple[str, str], list[str]] = {}
    for platform, image in images:
        if not isinstance(image, Image):
            raise RegistryError(f"{registry.label}: its index names another index")
        attached = attached_indexes(registry, image.digest)
        arch = f"[{platform}] " if platform and len(images) > 1 else ""
        named += [f"{arch}{digest}" for digest in attached]
        problems += [
            f"{arch}{line}" for line in _index_problems(registry, image, attached, checked)
        ]
        unindexed += [] if attached else [arch]
    if not named:
        return None
    problems += [f"{arch}no SOCI index attached: a lazy node pulls it whole" for arch in unindexed]
    return ", ".join(named), problems


def _index_problems(
    registry: RepositoryClient,
    image: Image,
    attached: list[str],
    checked: dict[tuple[str, str], list[str]],
) -> list[str]:
    """What is wrong with the SOCI indexes `attached` to `image` (a snapshotter may take any
    of them: each must be right); `checked` keeps each ztoc's verdict on its layer."""
    layers = {layer.digest: layer for layer in image.layers}
    problems = []
    for index in attached:
        manifest, _ = registry.manifest(index)
        for layer_digest, ztoc_digest in indexed_layers(manifest).items():
            layer = layers.get(layer_digest)
            if layer is None:
                problems.append(f"{ztoc_digest} describes {layer_digest}, not a layer of the image")
                continue
            pair = (layer_digest, ztoc_digest)
            if pair not in checked:
                checked[pair] = _ztoc_problems(registry, layer, ztoc_digest)
            problems += checked[pair]
    return problems


def _ztoc_problems(registry: RepositoryClient, layer: Descriptor, ztoc_digest: str) -> list[str]:
    """What is wrong with the ztoc `ztoc_digest` of `layer` (the layer is downloaded once)."""
    data = ztoc_blob(registry, ztoc_digest, layer)
    if data is None:
        return [f"{ztoc_digest} is larger than a ztoc of {layer.digest} can be"]
    ztoc = read_ztoc(data)
    mismatched = registry.read_blob(
        layer.digest, lambda stream: mismatches(ztoc, stream, layer.size)
    )
    return [f"{layer.digest}: {line}" for line in mismatched]
