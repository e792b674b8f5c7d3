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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from builder.credentials import Credentials
from builder.errors import RegistryError, UserError
from builder.image.publish import PushResult
from builder.imageref import ImageRef
from builder.oci import INDEX_TYPES, Registry

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_INDEX = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
GZIP_LAYERS = frozenset({DOCKER_LAYER, "application/vnd.oci.image.layer.v1.tar+gzip"})
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

    def descriptor(self) -> dict[str, Any]:
        platform = {"architecture": self.arch, "os": "linux"}
        if self.arch in VARIANTS:
            platform["variant"] = VARIANTS[self.arch]
        return {
            "mediaType": DOCKER_MANIFEST,
            "size": self.size,
            "digest": self.digest,
            "platform": platform,
        }


def index_document(images: Sequence[ArchImage]) -> bytes:
    """A Docker manifest list naming each arch's manifest with its platform."""
    document = {
        "schemaVersion": 2,
        "mediaType": DOCKER_INDEX,
        "manifests": [image.descriptor() for image in images],
    }
    return json.dumps(document, indent=2).encode()


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
    body = index_document(list(pushed.values()))
    names = []
    for tag in tags:
        name = tag.rpartition(":")[2] if "/" in tag or ":" in tag else tag
        digest = target.put_manifest(name, body, DOCKER_INDEX)
        names.append(f"{repository}:{name}")
    return PushResult(repository, tuple(names), digest), pushed


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
            entry = next(
                (
                    m
                    for m in manifest.get("manifests") or []
                    if (m.get("platform") or {}).get("architecture") == arch
                    and (m.get("platform") or {}).get("os") == "linux"
                ),
                None,
            )
            if entry is None:
                return None
            manifest, _ = source.manifest(entry["digest"])
        config = source.json_blob(manifest["config"]["digest"])
    except RegistryError:
        return None  # the layers are uploaded instead
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
        layers: list[dict[str, Any] | None] = []
        for diff_id in diff_ids:
            reused = base.by_diff_id.get(diff_id) if base else None
            if reused and (
                target.blob_exists(reused["digest"])
                or target.mount(reused["digest"], base.repository)  # type: ignore[union-attr]
            ):
                layers.append(reused)
            else:
                layers.append(None)
        config = _save(client, image_id, diff_ids, layers, Path(temp), target)
        manifest = {
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": {
                "mediaType": DOCKER_CONFIG,
                "size": len(config),
                "digest": target.upload_blob(config, image_id),
            },
            "layers": layers,
        }
    body = json.dumps(manifest, indent=2).encode()
    digest = target.put_manifest(_digest(body), body, DOCKER_MANIFEST)
    return ArchImage(arch, digest, len(body))


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
