"""The SOCI index of an image about to be pushed: a ztoc for each large layer the tool gzipped.

A layer the tool gzipped (builder.image.gzipped: its extras, its bytecode, the apt layer a
system image's save kept, a rebase's new layers) has a "layer-spans" record under its blob
digest: its tar's diff ID and where each span starts. Those layers get a ztoc
(builder.oci.ztoc), cached under the blob digest, so a rebase or a second template that pushes
the same layer reuses it, and the registry already holding the ztoc blob skips its upload.
Layers the tool did not write (the base's, reused by digest) have no record and no ztoc: a lazy
node fetches them whole, as it fetches any layer the index does not name.

Only layers of at least MIN_LAYER compressed bytes are indexed: soci's own default for
`soci create` (10 MiB). Below it a lazy node gains little: the whole layer is two or three
spans, about what the first reads would fetch by range anyway, and each ztoc costs 32 KiB of
window per span plus a manifest entry the snapshotter reads before the container starts.
"""

from __future__ import annotations

import hashlib
from typing import Any

from builder import credentials
from builder.cache import Cache
from builder.image.gzipped import SPAN
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
ZTOC_FORMAT = f"ztoc/{ZTOC_VERSION}/1"  # bump when what the tool writes into a ztoc changes


def soci_index(image: Image, cache: Cache) -> SociIndex | None:
    """The SOCI index of `image`, or None when none of its layers is the tool's and large."""
    ztocs = []
    for layer in image.layers:
        if layer.size < MIN_LAYER:
            continue
        data = layer_ztoc(layer.digest, cache)
        if data is not None:
            ztocs.append(LayerZtoc(layer, data))
    return SociIndex(tuple(ztocs)) if ztocs else None


def layer_ztoc(digest: str, cache: Cache) -> bytes | None:
    """The ztoc of the gzip layer `digest` the tool wrote (None when it did not write it)."""
    hexdigest = digest.removeprefix("sha256:")
    record = cache.get_record("layer-spans", hexdigest)
    if record is None:
        return None
    key = hashlib.sha256(f"{ZTOC_FORMAT}\n{digest}".encode()).hexdigest()
    known = cache.get_record("layer-ztoc", key)
    if known and (found := cache.find_blob(known["digest"], "ztoc")):
        return found.read_bytes()
    tar = cache.find_blob(record["diff_id"].removeprefix("sha256:"), "layer.tar")
    blob = cache.find_blob(hexdigest, "layer.tar.gz")
    if tar is None or blob is None:
        return None  # the cache was pruned: the layer is pushed without a ztoc
    data = ztoc_bytes(tar, blob, SPAN, record["spans"])
    ztoc_digest = hashlib.sha256(data).hexdigest()
    if cache.find_blob(ztoc_digest, "ztoc") is None:
        with cache.writing_blob(ztoc_digest, "ztoc") as out:
            out.write(data)
    cache.put_record("layer-ztoc", key, {"digest": ztoc_digest})
    return data


def soci_record(image: Image, index: SociIndex | None) -> dict[str, Any]:
    """What report.json says of an image's SOCI index: its digest, each ztoc, and the bytes a
    normal pull fetches (every layer) against what a lazy node fetches before it mounts the
    image (the index and its ztocs; layers without a ztoc it fetches whole)."""
    indexed = {one.layer.digest: one.ztoc for one in index.ztocs} if index else {}
    unindexed = sum(layer.size for layer in image.layers if layer.digest not in indexed)
    return {
        "index": digest_of(index.manifest(image.descriptor())) if index else None,
        "ztocs": [
            {"layer": layer, "ztoc": digest_of(data), "size": len(data)}
            for layer, data in indexed.items()
        ],
        "normal_pull_bytes": sum(layer.size for layer in image.layers),
        "lazy_before_mount_bytes": unindexed + sum(len(data) for data in indexed.values()),
    }


def index_problems(image: str, arch: str) -> tuple[str, list[str]] | None:
    """The SOCI index attached to the `arch` image of the pushed `image`, checked: it names
    only layers of the image, and each ztoc's spans and file table match its layer's bytes
    (each indexed layer is downloaded once). None when no index is attached (--no-soci, or
    no layer large enough); else the index digest and what is wrong (empty: all agrees)."""
    ref = ImageRef.parse(image)
    registry = credentials.registry(ref, image)
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
