"""Publish several single-arch engine images as one image index, through the registry API.

Each arch's image goes up by digest only (no tag): its config and layers come from the engine
(`docker save`), layers it shares with the base are mounted from the base's repository when the
base lives on the same registry (only the new layers are uploaded, gzip with mtime 0), and the
manifest is PUT under its digest. Only then is the index written, under every tag: until that
last PUT no tag in the registry has moved, so a failure part-way leaves the old tags as they were.

The engine cannot do this itself: `docker push` needs a tag per image, and the Debian engine's
CLI writes indexes only with the experimental `docker manifest`, which needs every image pushed
under a tag first.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from builder.cache import Cache
from builder.credentials import Credentials
from builder.errors import RegistryError, UserError
from builder.image.assemble import Assembled
from builder.image.gzipped import gzipped
from builder.image.publish import PushResult
from builder.image.rebase import DOCKER_CONFIG, DOCKER_LAYER, DOCKER_MANIFEST, OCI_LAYER
from builder.imageref import ImageRef
from builder.oci import INDEX_TYPES, Registry, platform_entry

DOCKER_INDEX = "application/vnd.docker.distribution.manifest.list.v2+json"
GZIP_LAYERS = frozenset({DOCKER_LAYER, OCI_LAYER})
GZIP_LEVEL = 6
VARIANTS = {"arm64": "v8"}  # what `docker manifest` and the official images write
SAVE_CHUNK = 1 << 20

Say = Callable[[str], None]


@dataclass(frozen=True)
class ArchImage:
    """One arch's image as pushed: the manifest the index names."""

    arch: str
    digest: str
    size: int
    manifest: bytes = field(default=b"", repr=False)  # its bytes, for tags on a single arch
    media_type: str = DOCKER_MANIFEST

    def descriptor(self) -> dict[str, Any]:
        platform = {"architecture": self.arch, "os": "linux"}
        if self.arch in VARIANTS:
            platform["variant"] = VARIANTS[self.arch]
        return {
            "mediaType": self.media_type,
            "size": self.size,
            "digest": self.digest,
            "platform": platform,
        }


def index_document(
    images: Sequence[ArchImage], annotations: Mapping[str, str] | None = None
) -> bytes:
    """A Docker manifest list naming each arch's manifest with its platform.

    `annotations` (the images' OCI labels) are the OCI index field; registries keep the bytes
    as sent, and tools that read OCI indexes (crane, a registry UI) see them.
    """
    document: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": DOCKER_INDEX,
        "manifests": [image.descriptor() for image in images],
    }
    if annotations:
        document["annotations"] = dict(sorted(annotations.items()))
    return json.dumps(document, indent=2).encode()


def publish_assembled(
    client: docker.DockerClient,
    images: Sequence[Assembled],
    repository: str,
    tags: Sequence[str],
    *,
    base_image: str | None,
    annotations: Mapping[str, str],
    cache: Cache,
    credentials: Credentials | None = None,
    say: Say = lambda line: None,
) -> tuple[PushResult, dict[str, ArchImage]]:
    """Push each image by digest; then the tags name it (one arch) or an index of them.

    All or nothing: no tag moves until every arch's manifest is in the registry.
    """
    target = Registry(ImageRef.parse_repository(repository, "push target"), repository, credentials)
    pushed = {}
    for image in images:
        say(f"pushing {image.arch} image {image.image_id[:19]} to {repository} by digest ...")
        base = _base_layers(base_image, image.arch, target, credentials)
        pushed[image.arch] = push_assembled(client, image, target, cache, base)
    if len(images) == 1:
        only = pushed[images[0].arch]
        return put_tags(target, only.manifest, DOCKER_MANIFEST, tags), pushed
    return put_index(target, list(pushed.values()), tags, annotations), pushed


def put_index(
    target: Registry,
    images: Sequence[ArchImage],
    tags: Sequence[str],
    annotations: Mapping[str, str] | None = None,
) -> PushResult:
    """Write the index under every tag: the only step that moves a tag, so it comes last."""
    body = index_document(images, annotations)
    return put_tags(target, body, DOCKER_INDEX, tags)


def put_tags(target: Registry, body: bytes, media_type: str, tags: Sequence[str]) -> PushResult:
    """PUT one manifest or index under each tag (`name`, or `repository:name`)."""
    repository = str(target.label)
    names, digest = [], _digest(body)
    for tag in tags:
        name = tag.rpartition(":")[2] if "/" in tag or ":" in tag else tag
        digest = target.put_manifest(name, body, media_type)
        names.append(f"{repository}:{name}")
    return PushResult(repository, tuple(names), digest)


def push_assembled(
    client: docker.DockerClient,
    image: Assembled,
    target: Registry,
    cache: Cache,
    base: BaseLayers | None = None,
) -> ArchImage:
    """Upload an assembled image's blobs and manifest by digest; no tag is written.

    The deps-extra tar is gzipped once (builder.image.gzipped: its digest is the lock's); the
    layers below come from the registry the base is in, or from the tar the system image's
    save kept (the apt layer), else from a `docker save` of the system image.
    """
    diff_ids: list[str] = json.loads(image.config)["rootfs"]["diff_ids"]
    below = diff_ids[:-1]
    layers: list[dict[str, Any] | None] = [
        _reused(diff_id, target, base) or _kept(diff_id, target, cache) for diff_id in below
    ]
    if any(layer is None for layer in layers):
        with tempfile.TemporaryDirectory(prefix="bsi-push-") as temp:
            _save(client, image.system_id, below, layers, Path(temp), target)
    deps = gzipped(image.deps.path, image.deps.diff_id, cache)
    if not target.blob_exists(deps.digest):
        target.upload_blob(deps.path, deps.digest)
    layers.append({"mediaType": DOCKER_LAYER, "size": deps.size, "digest": deps.digest})
    if not target.blob_exists(image.image_id):
        target.upload_blob(image.config, image.image_id)
    return _put_manifest(target, image.arch, image.config, image.image_id, layers)


def _reused(diff_id: str, target: Registry, base: BaseLayers | None) -> dict[str, Any] | None:
    """The base's blob for `diff_id` once it is in `target` (already, or mounted); else None."""
    reused = base.by_diff_id.get(diff_id) if base else None
    if (
        reused
        and base
        and (
            target.blob_exists(reused["digest"]) or target.mount(reused["digest"], base.repository)
        )
    ):
        return reused
    return None


def _kept(diff_id: str, target: Registry, cache: Cache) -> dict[str, Any] | None:
    """The layer's blob from the tar the system image's save kept (the apt layer), uploaded."""
    tar = cache.find_blob(diff_id.removeprefix("sha256:"), "layer.tar")
    if tar is None:
        return None
    blob = gzipped(tar, diff_id, cache)
    if not target.blob_exists(blob.digest):
        target.upload_blob(blob.path, blob.digest)
    return {"mediaType": DOCKER_LAYER, "size": blob.size, "digest": blob.digest}


def _put_manifest(
    target: Registry, arch: str, config: bytes, config_digest: str, layers: list[Any]
) -> ArchImage:
    manifest = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": DOCKER_CONFIG, "size": len(config), "digest": config_digest},
        "layers": layers,
    }
    body = json.dumps(manifest, indent=2).encode()
    digest = target.put_manifest(_digest(body), body, DOCKER_MANIFEST)
    return ArchImage(arch, digest, len(body), body)


def publish_index(
    client: docker.DockerClient,
    images: Mapping[str, str],
    repository: str,
    tags: Sequence[str],
    *,
    base_image: str | None = None,
    credentials: Credentials | None = None,
    say: Say = lambda line: None,
) -> tuple[PushResult, dict[str, ArchImage]]:
    """Push each `images` arch -> engine image id by digest, then the index under `tags`."""
    target = Registry(ImageRef.parse_repository(repository, "push target"), repository, credentials)
    pushed = {}
    for arch, image_id in images.items():
        say(f"pushing {arch} image {image_id[:19]} to {repository} by digest ...")
        base = _base_layers(base_image, arch, target, credentials)
        pushed[arch] = push_by_digest(client, image_id, arch, target, base)
    return put_index(target, list(pushed.values()), tags), pushed


@dataclass(frozen=True)
class BaseLayers:
    """The base's layers for one arch, by diff ID, and the repository they can be mounted from."""

    repository: str
    by_diff_id: Mapping[str, dict[str, Any]]


def _base_layers(
    base_image: str | None, arch: str, target: Registry, credentials: Credentials | None
) -> BaseLayers | None:
    """The base's compressed layer descriptors, when it lives on the target's registry."""
    if not base_image:
        return None
    try:
        ref = ImageRef.parse(base_image, "base image")
    except UserError:
        return None
    if ref.registry != target.ref.registry:
        return None
    source = Registry(ref, base_image, credentials)
    try:
        manifest, _ = source.manifest(ref.reference)
        if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            entry = platform_entry(manifest.get("manifests") or [], arch)
            if entry is None:
                return None
            manifest, _ = source.manifest(entry["digest"])
        config = source.json_blob(manifest["config"]["digest"])
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        layers = manifest.get("layers") or []
        if len(diff_ids) != len(layers):
            return None
        return BaseLayers(
            ref.repository,
            {
                diff_id: {**layer, "mediaType": DOCKER_LAYER}
                for diff_id, layer in zip(diff_ids, layers, strict=True)
                if layer.get("mediaType") in GZIP_LAYERS
            },
        )
    except (RegistryError, KeyError, TypeError, AttributeError):  # unreadable or malformed
        return None  # the layers are uploaded instead


def push_by_digest(
    client: docker.DockerClient,
    image_id: str,
    arch: str,
    target: Registry,
    base: BaseLayers | None = None,
) -> ArchImage:
    """Upload one engine image's blobs and manifest; no tag is written."""
    attributes = client.images.get(image_id).attrs
    if attributes.get("Architecture") != arch:
        raise UserError(f"image {image_id}: built as {attributes.get('Architecture')}, not {arch}")
    diff_ids: list[str] = list((attributes.get("RootFS") or {}).get("Layers") or [])
    with tempfile.TemporaryDirectory(prefix="bsi-push-") as temp:
        layers = [_reused(diff_id, target, base) for diff_id in diff_ids]
        config = _save(client, image_id, diff_ids, layers, Path(temp), target)
        if not target.blob_exists(image_id):
            target.upload_blob(config, image_id)
    return _put_manifest(target, arch, config, image_id, layers)


def _save(
    client: docker.DockerClient,
    image_id: str,
    diff_ids: Sequence[str],
    layers: list[dict[str, Any] | None],
    temp: Path,
    target: Registry,
) -> bytes:
    """`docker save` the image; upload the layers not yet placed; return the config bytes."""
    saved = temp / "image.tar"
    with saved.open("wb") as out:
        for chunk in client.api.get_image(image_id, chunk_size=SAVE_CHUNK):
            out.write(chunk)
    with tarfile.open(saved) as archive:
        manifest = json.load(_member(archive, "manifest.json"))[0]
        config = _member(archive, manifest["Config"]).read()
        if _digest(config) != image_id:
            raise UserError(f"image {image_id}: docker save gave a config of another digest")
        paths = manifest["Layers"]
        if len(paths) != len(diff_ids):
            raise UserError(
                f"image {image_id}: docker save gave {len(paths)} layers, not {len(diff_ids)}"
            )
        for position, (path, diff_id) in enumerate(zip(paths, diff_ids, strict=True)):
            if layers[position] is not None:
                continue
            compressed = temp / f"layer-{position}.tar.gz"
            hasher = hashlib.sha256()
            with (
                _member(archive, path) as source,
                compressed.open("wb") as raw,
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as packed,
            ):
                while data := source.read(SAVE_CHUNK):
                    hasher.update(data)
                    packed.write(data)
            if f"sha256:{hasher.hexdigest()}" != diff_id:
                raise UserError(f"image {image_id}: layer {path} is not {diff_id}")
            digest = _file_digest(compressed)
            if not target.blob_exists(digest):
                target.upload_blob(compressed, digest)
            layers[position] = {
                "mediaType": DOCKER_LAYER,
                "size": compressed.stat().st_size,
                "digest": digest,
            }
            compressed.unlink()
    return config


def _member(archive: tarfile.TarFile, name: str) -> Any:
    extracted = archive.extractfile(name)
    if extracted is None:
        raise UserError(f"docker save: {name} is not a file")
    return extracted


def _file_digest(path: Path) -> str:
    with path.open("rb") as stream:
        return f"sha256:{hashlib.file_digest(stream, 'sha256').hexdigest()}"


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"
