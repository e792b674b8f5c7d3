"""Engine images as OCI image values, with where each of their blobs can be had.

An image the engine holds (one `assemble` wrote, or any image id) becomes an `oci.v1.Image`
plus its `oci.remote.Blobs`: layers it shares with the base are the base's own blobs when the
base lives on the push target's registry (mounted there, never uploaded); each extras layer
is builder.layers.gzipped's cached blob (its digest is its wheels'); the apt layer is the tar
the system image's save kept, gzipped the same way; any other layer comes from a `docker save`
of the image, gzipped the same way into the same cache, so the next push of an image on the same
local base saves and compresses nothing (layers the cache holds need no save). Writing them is
`oci.remote.write`'s job, so the bytes pushed are the values made here: the engine cannot do
this itself (`docker push` needs a tag per image, and the Debian engine's CLI writes indexes
only with the experimental `docker manifest`, which needs every image pushed under a tag first).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import docker

from builder import credentials
from builder.assemble.assemble import Assembled
from builder.assemble.saved import saved_to_disk
from builder.cache import Cache
from builder.errors import RegistryError, RegistryNotFound, UserError
from builder.layers.gzipped import cached_gzip, gzipped, gzipped_from
from builder.layers.install_layout import LAYER_TAR
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import Artifact
from builder.oci.remote import Blobs, BlobSource, InRepository, LocalFile, Written, resolve, write
from builder.oci.v1 import (
    DOCKER_LAYER,
    GZIP_LAYERS,
    ConfigFile,
    Descriptor,
    Image,
    Index,
    Platform,
)


@dataclass(frozen=True)
class BaseLayers:
    """The base's gzip layers for one arch, by diff ID, and the repository that holds them."""

    registry: RepositoryClient
    by_diff_id: Mapping[str, Descriptor]


def base_layers(base: ImageRef | None, arch: str, target: RepositoryClient) -> BaseLayers | None:
    """The base's compressed layer descriptors, when it lives on the target's registry.

    Not there (a name only the engine holds), or without an image of `arch`: None, and the
    layers are uploaded from the engine instead. Any other failure (still failing after the
    target's retries, malformed, tampered) ends the push: falling back would upload the base
    under new digests, which nodes then pull a second time, and record a base the registry
    does not serve.
    """
    if base is None or base.registry != target.ref.registry:
        return None
    source = credentials.registry(base, f"base image {base}", target.retries)
    try:
        image = resolve(source, Platform.linux(arch))
    except RegistryNotFound:
        return None
    except RegistryError:
        raise
    except UserError:  # no image of `arch` in its index
        return None
    if len(image.diff_ids) != len(image.layers):
        return None
    return BaseLayers(
        source,
        {
            diff_id: Descriptor(DOCKER_LAYER, layer.digest, layer.size)
            for diff_id, layer in zip(image.diff_ids, image.layers, strict=True)
            if layer.media_type in GZIP_LAYERS
        },
    )


def assembled_image(
    client: docker.DockerClient,
    assembled: Assembled,
    base: BaseLayers | None,
    cache: Cache,
    scratch: Path,
) -> tuple[Image, Blobs]:
    """An assembled image as a value: its exact config, each layer's blob located.

    Layers neither the base nor the cache has are saved from the engine into `scratch`, which
    must outlive the write.
    """
    diff_ids = ConfigFile.parse(assembled.config).diff_ids
    below = diff_ids[: len(diff_ids) - len(assembled.extras)]
    sources: dict[str, BlobSource] = {}
    layers = [
        _reused(diff_id, base, sources) or _kept(diff_id, cache, sources) for diff_id in below
    ]
    if any(layer is None for layer in layers):
        _save(client, assembled.system_id, below, layers, scratch, cache, sources)
    found = [layer for layer in layers if layer is not None]
    for one in assembled.extras:
        blob = gzipped(one.layer.path, one.layer.diff_id, cache)
        sources[blob.digest] = LocalFile(blob.path)
        found.append(Descriptor(DOCKER_LAYER, blob.digest, blob.size))
    return Image.build(assembled.config, found), _blobs(sources, base)


def engine_image(
    client: docker.DockerClient,
    image_id: str,
    arch: str,
    base: BaseLayers | None,
    cache: Cache,
    scratch: Path,
) -> tuple[Image, Blobs]:
    """Any engine image as a value: its config and the layers neither the base nor the cache
    has from a `docker save` into `scratch`."""
    attributes = client.images.get(image_id).attrs
    if attributes.get("Architecture") != arch:
        raise UserError(f"image {image_id}: built as {attributes.get('Architecture')}, not {arch}")
    diff_ids: list[str] = list((attributes.get("RootFS") or {}).get("Layers") or [])
    sources: dict[str, BlobSource] = {}
    layers = [
        _reused(diff_id, base, sources) or _kept(diff_id, cache, sources) for diff_id in diff_ids
    ]
    config = _save(client, image_id, diff_ids, layers, scratch, cache, sources)
    return Image.build(config, [layer for layer in layers if layer is not None]), _blobs(
        sources, base
    )


def _blobs(sources: dict[str, BlobSource], base: BaseLayers | None) -> Blobs:
    return Blobs(sources, (base.registry,) if base else ())


def _reused(
    diff_id: str, base: BaseLayers | None, sources: dict[str, BlobSource]
) -> Descriptor | None:
    """The base's blob for `diff_id` (mounted or streamed from the base's repository)."""
    reused = base.by_diff_id.get(diff_id) if base else None
    if reused is None or base is None:
        return None
    sources[reused.digest] = InRepository(base.registry)
    return reused


def _kept(diff_id: str, cache: Cache, sources: dict[str, BlobSource]) -> Descriptor | None:
    """The layer's gzip blob from the cache: gzipped by an earlier push, or made now from the
    tar the system image's save kept (the apt layer)."""
    blob = cached_gzip(diff_id, cache)
    if blob is None:
        tar = cache.checked_blob(diff_id.removeprefix("sha256:"), LAYER_TAR)
        if tar is None:
            return None
        blob = gzipped(tar, diff_id, cache)
    sources[blob.digest] = LocalFile(blob.path)
    return Descriptor(DOCKER_LAYER, blob.digest, blob.size)


def _save(
    client: docker.DockerClient,
    image_id: str,
    diff_ids: Sequence[str],
    layers: list[Descriptor | None],
    scratch: Path,
    cache: Cache,
    sources: dict[str, BlobSource],
) -> bytes:
    """`docker save` the image into `scratch`; gzip the layers not yet placed into `cache`
    (checked against their diff IDs on the way); the config."""
    with saved_to_disk(client, image_id, scratch) as save:
        paths = save.layer_paths
        if len(paths) != len(diff_ids):
            raise UserError(
                f"image {image_id}: docker save gave {len(paths)} layers, not {len(diff_ids)}"
            )
        for position, (path, diff_id) in enumerate(zip(paths, diff_ids, strict=True)):
            if layers[position] is None:
                member = partial(save.layer, position)
                blob = gzipped_from(member, diff_id, cache, f"image {image_id}: {path}")
                sources[blob.digest] = LocalFile(blob.path)
                layers[position] = Descriptor(DOCKER_LAYER, blob.digest, blob.size)
        return save.config


def push_engine_images(
    client: docker.DockerClient,
    images: Mapping[str, str],
    target: RepositoryClient,
    tags: Sequence[str],
    cache: Cache,
    base: ImageRef | None = None,
    attach: Callable[[str, Image], Sequence[Artifact]] | None = None,
) -> tuple[Written, dict[str, Image]]:
    """Write each arch -> engine image id by digest, then an index of them under `tags`.

    `attach(arch, image)`: what to attach to each image (its SBOM, its provenance, its SOCI
    index), written with it, before the index and the tags.
    """
    with tempfile.TemporaryDirectory(prefix="bsi-push-") as scratch:
        pushed, blobs = {}, Blobs()
        for arch, image_id in images.items():
            layers = base_layers(base, arch, target)
            pushed[arch], found = engine_image(client, image_id, arch, layers, cache, Path(scratch))
            blobs |= found
        index = Index.build((Platform.linux(arch), image) for arch, image in pushed.items())
        attached = {i.digest: attach(arch, i) for arch, i in pushed.items()} if attach else {}
        written = write(
            target, list(pushed.values()), blobs, index=index, tags=tags, attachments=attached
        )
        return written, pushed
