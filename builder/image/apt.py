"""The apt layer: the base plus the Debian packages the extras need, from a one-step build.

Unlike the deps-extra layer (builder.image.layer) it depends on the base's package state, so
BuildKit builds it and a platform upgrade rebuilds it; it is small. Only that one layer is
kept out of the built image's save.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from builder.cache import Cache
from builder.errors import UserError
from builder.image.build import build_image
from builder.image.layer import CHUNK, ChunkStream, Layer, keep, written


def apt_layer(
    base_image: str, packages: Sequence[str], arch: str, cache: Cache, client: Any
) -> tuple[Layer, str]:
    """The apt layer over `base_image`, from a one-step BuildKit build; and its history line.

    This layer depends on the base's package state, so an upgrade rebuilds it; it is small. The
    built image's save is streamed, not written out: each layer in it is hashed on the way and
    only the one whose sha256 is the image's top diff ID is kept.
    """
    run = (
        "apt-get update && apt-get install -y --no-install-recommends "
        + " ".join(packages)
        + " && rm -rf /var/lib/apt/lists/*"
    )
    with tempfile.TemporaryDirectory(prefix="bsi-apt-") as temp:
        context = Path(temp) / "context"
        context.mkdir()
        (context / "Dockerfile").write_text(f"FROM {base_image}\nUSER 0:0\nRUN {run}\n")
        with open(Path(temp) / "build.log", "w") as log:
            image_id = build_image(context, platform=f"linux/{arch}", log=log)
    expected = client.images.get(image_id).attrs["RootFS"]["Layers"][-1]
    found = _top_layer(client.api.get_image(image_id, chunk_size=CHUNK), expected, cache)
    if found is None:
        raise UserError(f"apt layer over {base_image}: no layer {expected} in the built image")
    return found, f"RUN {run}"


def _top_layer(chunks: Iterable[bytes], diff_id: str, cache: Cache) -> Layer | None:
    """The layer of a `docker save` stream whose tar hashes to `diff_id`, stored in the cache."""
    stream = io.BufferedReader(ChunkStream(chunks), CHUNK)
    with tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            handle = archive.extractfile(member) if member.name.endswith("layer.tar") else None
            if handle is None:
                continue
            temp, found = written(cache, lambda out: _copy(handle, out))  # noqa: B023
            if f"sha256:{found}" == diff_id:
                return keep(temp, found, cache, 0)
            temp.unlink()
    return None


def _copy(source: IO[bytes], out: IO[bytes]) -> None:
    while data := source.read(CHUNK):
        out.write(data)
