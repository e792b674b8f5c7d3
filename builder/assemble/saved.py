"""What a `docker save` gives the tool: an image's exact config, and its layers' tars.

The engine hands out an image's config document, byte for byte, only inside a save, after the
tar of every layer (it re-tars them from disk: a few seconds for a base). So one pass keeps
both things any step needs from it: the config (assembling the final image) and the apt
layer's tar (pushing it: the base's layers are in a registry already). Each is cached, by
image id and by diff ID, so an image is saved once, not once per need (`read_save`). An image
whose every layer may be needed is saved to disk instead and read by its manifest
(`SaveArchive`).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker

from builder.cache import Cache
from builder.errors import UserError
from builder.layers.install_layout import LAYER_TAR
from builder.layers.layer import CHUNK, ChunkStream, Layer, keep, written
from builder.oci.v1 import digest_of, json_object

CONFIG_RECORD = "image-config"


@dataclass(frozen=True)
class Saved:
    """An image's config document, and the layer tar asked for (now in the cache)."""

    config: dict[str, Any]
    layer: Layer | None


def read_save(
    client: docker.DockerClient, image_id: str, cache: Cache, keep_layer: str | None = None
) -> Saved:
    """One pass over the save of `image_id`: its config, and the tar of layer `keep_layer`.

    Every layer tar in the stream is hashed on the way; only the one whose sha256 is
    `keep_layer` is kept. The config is recorded by image id (`cached_config`).
    """
    hex_id = image_id.removeprefix("sha256:")
    config: dict[str, Any] | None = None
    kept: Layer | None = None
    chunks: Iterator[bytes] = client.api.get_image(image_id, chunk_size=CHUNK)
    stream = io.BufferedReader(ChunkStream(chunks), CHUNK)
    with tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            handle = archive.extractfile(member) if member.isfile() else None
            if handle is None:
                continue
            if member.name == f"{hex_id}.json":
                try:
                    config = json_object(handle.read(), "config")
                except ValueError:
                    raise UserError(
                        f"image {image_id}: docker save gave a config that is not a JSON object"
                    ) from None
            elif keep_layer and kept is None and member.name.endswith("layer.tar"):
                kept = _kept(handle, keep_layer, cache)
            if config is not None and (kept is not None or not keep_layer):
                break  # what follows (other layers, the manifest) is not needed
    if config is None:
        raise UserError(f"image {image_id}: docker save gave no config")
    if keep_layer and kept is None:
        raise UserError(f"image {image_id}: no layer {keep_layer} in its save")
    cache.put_record(CONFIG_RECORD, hex_id, config)
    return Saved(config, kept)


def save_cached(image_id: str, cache: Cache, keep_layer: str | None = None) -> bool:
    """Whether the cache holds what a `read_save` of `image_id` keeping `keep_layer` would
    give: its config, and that layer's tar if asked. A run that keeps no layer (no push)
    leaves a later pushing run to save the image again for it."""
    if cached_config(image_id, cache) is None:
        return False
    hex_layer = None if keep_layer is None else keep_layer.removeprefix("sha256:")
    return hex_layer is None or cache.find_blob(hex_layer, LAYER_TAR) is not None  # pushes check


def cached_config(image_id: str, cache: Cache) -> dict[str, Any] | None:
    """The config an earlier `read_save` of `image_id` read, if the cache still holds it."""
    record = cache.get_record(CONFIG_RECORD, image_id.removeprefix("sha256:"))
    return dict(record) if isinstance(record, dict) else None


def _kept(handle: IO[bytes], diff_id: str, cache: Cache) -> Layer | None:
    temp, found = written(cache, lambda out: _copy(handle, out))
    if f"sha256:{found}" == diff_id:
        return keep(temp, found, cache, 0)
    temp.unlink()
    return None


def _copy(source: IO[bytes], out: IO[bytes]) -> None:
    while data := source.read(CHUNK):
        out.write(data)


@dataclass(frozen=True)
class SaveArchive:
    """A `docker save` on disk: the image's config (checked against its id) and its layers' tars
    in the order its manifest lists them."""

    image_id: str
    config: bytes
    layer_paths: tuple[str, ...]  # the archive's path of each layer tar, bottom to top
    archive: tarfile.TarFile

    def layer(self, position: int) -> IO[bytes]:
        return _member(self.archive, self.layer_paths[position])


@contextmanager
def saved_to_disk(
    client: docker.DockerClient, image_id: str, scratch: Path
) -> Iterator[SaveArchive]:
    """`docker save` of `image_id` written into `scratch`, open; removed when done."""
    saved = scratch / f"{image_id.removeprefix('sha256:')}.tar"
    with saved.open("wb") as out:
        for chunk in client.api.get_image(image_id, chunk_size=CHUNK):
            out.write(chunk)
    with tarfile.open(saved) as archive:
        manifest = json.load(_member(archive, "manifest.json"))[0]
        config = _member(archive, manifest["Config"]).read()
        if digest_of(config) != image_id:
            raise UserError(f"image {image_id}: docker save gave a config of another digest")
        yield SaveArchive(image_id, config, tuple(manifest["Layers"]), archive)
    saved.unlink()


def _member(archive: tarfile.TarFile, name: str) -> IO[bytes]:
    extracted = archive.extractfile(name)
    if extracted is None:
        raise UserError(f"docker save: {name} is not a file")
    return extracted
