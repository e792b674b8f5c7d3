"""The SOCI index of an image about to be pushed: a ztoc for each large layer the tool gzipped.

Every layer a push compresses goes through builder.image.gzipped (the extras, the bytecode,
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

Only layers of at least MIN_LAYER compressed bytes are indexed: soci's own default for
`soci create` (10 MiB). Below it a lazy node gains little: the whole layer is two or three
spans, about what the first reads would fetch by range anyway, and each ztoc costs 32 KiB of
window per span plus a manifest entry the snapshotter reads before the container starts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from builder import credentials
from builder.cache import Cache
from builder.engines.connection import engine_client, native_arch
from builder.errors import RegistryError, UserError
from builder.image.gzipped import spans_of
from builder.oci.name import ImageRef
from builder.oci.referrers import referrers
from builder.oci.remote import resolve
from builder.oci.v1 import Image, Platform, digest_of
from builder.oci.ztoc import (
    SOCI_INDEX,
    ZTOC_VERSION,
    LayerZtoc,
    SociIndex,
    indexed_layers,
    ztoc_bytes,
)
from builder.oci.ztoc_read import mismatches, read_ztoc

MIN_LAYER = 10 << 20
ZTOC_FORMAT = f"ztoc/{ZTOC_VERSION}/2"  # bump when what the tool writes into a ztoc changes


def soci_index(
    image: Image, cache: Cache, known: Mapping[str, bytes] = MappingProxyType({})
) -> SociIndex | None:
    """The SOCI index of `image`, or None when none of its large layers has a ztoc: the tool's
    own (it gzipped the layer), else one `known` by layer digest (`base_ztocs`)."""
    ztocs = []
    for layer in image.layers:
        if layer.size < MIN_LAYER:
            continue
        data = layer_ztoc(layer.digest, cache) or known.get(layer.digest)
        if data is not None:
            ztocs.append(LayerZtoc(layer, data))
    return SociIndex(tuple(ztocs)) if ztocs else None


def layer_ztoc(digest: str, cache: Cache) -> bytes | None:
    """The ztoc of the gzip layer `digest` the tool wrote (None when it did not write it, the
    cache dropped it, or soci has no name for one of its tar entries: a sparse file in a
    saved base, say; that layer is then fetched whole, like any other it does not index)."""
    key = hashlib.sha256(f"{ZTOC_FORMAT}\n{digest}".encode()).hexdigest()
    known = cache.get_record("layer-ztoc", key)
    if known and (found := cache.find_blob(known["digest"], "ztoc")):
        return found.read_bytes()
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


def base_ztocs(base: ImageRef | None, arch: str) -> dict[str, bytes]:
    """The ztocs the base's own SOCI index names for its `arch` image, by layer digest: what an
    image on a base this cache did not push reuses for the base's layers. None found (a Hub
    base, no index, an unreadable one) is no ztoc: those layers are fetched whole by a lazy
    node, as before, and the push goes on."""
    if base is None or base.is_hub:
        return {}
    try:
        registry = credentials.registry(base, str(base))
        image = resolve(registry, Platform.linux(arch))
        found = [r for r in referrers(registry, image.digest) if r.artifact_type == SOCI_INDEX]
        if not found:
            return {}
        manifest, _ = registry.manifest(found[-1].digest)
        ztocs = {}
        for layer, ztoc_digest in indexed_layers(manifest).items():
            with registry.blob(ztoc_digest) as stream:  # checked against its digest
                ztocs[layer] = stream.read()
        return ztocs
    except (RegistryError, UserError):
        return {}


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

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "ztocs": [{"layer": z.layer, "ztoc": z.ztoc, "size": z.size} for z in self.ztocs],
            "normal_pull_bytes": self.normal_pull_bytes,
            "lazy_before_mount_bytes": self.lazy_before_mount_bytes,
        }


def soci_record(image: Image, index: SociIndex | None) -> SociRecord:
    """The record of `image`'s index: the bytes a normal pull fetches (every layer) against
    what a lazy node fetches before it mounts the image (the ztocs, and whole every layer
    without one); the first import then reads its files' spans by range."""
    indexed = {one.layer.digest: one.ztoc for one in index.ztocs} if index else {}
    unindexed = sum(layer.size for layer in image.layers if layer.digest not in indexed)
    return SociRecord(
        digest_of(index.manifest(image.descriptor())) if index else None,
        tuple(IndexedLayer(layer, digest_of(data), len(data)) for layer, data in indexed.items()),
        sum(layer.size for layer in image.layers),
        unindexed + sum(len(data) for data in indexed.values()),
    )


def attached_index_problems(ref: ImageRef) -> tuple[str, list[str]] | None:
    """The SOCI index attached to the pushed image `ref` (of an index: the engine's arch, the
    image verify runs), checked: it names only layers of the image, and each ztoc's spans,
    windows and file table match its layer's bytes (each indexed layer is downloaded once).
    None when `ref` names no registry or no index is attached (--no-soci, or no layer large
    enough); else the index digest and what is wrong (empty: all agrees). An index that
    cannot be read is a RegistryError or a UserError."""
    if ref.is_hub:  # a local name, or Docker Hub: not where this tool pushes
        return None
    client = engine_client()
    arch = (native_arch(client) if client else None) or "amd64"
    registry = credentials.registry(ref, str(ref))
    found = resolve(registry, Platform.linux(arch))
    attached = [r for r in referrers(registry, found.digest) if r.artifact_type == SOCI_INDEX]
    if not attached:
        return None
    index = attached[-1].digest
    manifest, _ = registry.manifest(index)
    layers = {layer.digest: layer for layer in found.layers}
    problems = []
    for layer_digest, ztoc_digest in indexed_layers(manifest).items():
        layer = layers.get(layer_digest)
        if layer is None:
            problems.append(f"{ztoc_digest} describes {layer_digest}, not a layer of the image")
            continue
        with registry.blob(ztoc_digest) as stream:
            ztoc = read_ztoc(stream.read())
        with registry.blob(layer_digest) as stream:
            problems += [f"{layer_digest}: {line}" for line in mismatches(ztoc, stream, layer.size)]
    return index, problems
