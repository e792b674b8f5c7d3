"""The apt layer of a rebase: the new base plus the Debian packages, from a one-step build.

Unlike the deps-extra layer (builder.layers.layer) it depends on the base's package state, so
BuildKit builds it and a platform upgrade rebuilds it; it is small. Loading the rebased image
needs only its diff ID (the engine holds the layer); its tar, for the push, comes out of the
built image's save (builder.assemble.saved).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.assemble.build import BuildSpec, build_image
from builder.assemble.saved import read_save
from builder.cache import Cache
from builder.context.render import Secrets, apt_steps
from builder.engines.connection import Engine
from builder.layers.install_layout import LAYER_TAR
from builder.layers.layer import Layer


@dataclass(frozen=True)
class AptImage:
    """The one-step build's image in the engine: its top (apt) layer's diff ID and history."""

    image_id: str
    diff_id: str
    created_by: str


def build_apt_image(
    base_image: str,
    packages: Sequence[str],
    arch: str,
    engine: Engine,
    secret_files: Mapping[str, Path] | None = None,
    after: str = "",
) -> AptImage:
    """`base_image` plus the apt packages, from a one-step BuildKit build.

    This layer depends on the base's package state, so an upgrade rebuilds it; it is small.
    `secret_files` (BuildKit secret id -> file: an apt CA bundle or auth.conf) are mounted as
    the full build's system stage mounts them, never written into the layer. It is built on
    `engine` (an arch's own, or the local one) and stays there. `after`: commands run in the
    same step once the packages are in (the browsers' wiring, builder.plan.browsers).
    """
    mounts, commands = apt_steps(Secrets.of(secret_files or {}))
    run = f"{mounts.lstrip()} {' && '.join(commands)} {' '.join(packages)}"
    run += f" && {after}" if after else ""
    with tempfile.TemporaryDirectory(prefix="bsi-apt-") as temp:
        context = Path(temp) / "context"
        context.mkdir()
        dockerfile = f"FROM {base_image}\nUSER 0:0\nRUN {run}\n"
        (context / "Dockerfile").write_text(dockerfile)
        with open(Path(temp) / "build.log", "w") as log:
            spec = BuildSpec(platform=f"linux/{arch}", secrets=secret_files or {}, engine=engine)
            image_id = build_image(context, spec, log)
    diff_id = engine.client.images.get(image_id).attrs["RootFS"]["Layers"][-1]
    return AptImage(image_id, diff_id, f"RUN {run}")


def saved_layer(image: AptImage, cache: Cache, client: Any) -> Layer:
    """The apt layer's tar, out of the image's save (only a push needs it, not a load)."""
    found = cache.checked_blob(image.diff_id.removeprefix("sha256:"), LAYER_TAR)
    if found is not None:
        return Layer(found, image.diff_id, found.stat().st_size, 0)
    layer = read_save(client, image.image_id, cache, keep_layer=image.diff_id).layer
    assert layer is not None  # read_save raises when the layer is not in the save
    return layer
