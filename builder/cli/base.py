"""Command line `base`: build the reference runtime base. Parses and prints only.

Apart from builder/cli/app.py (which registers it) so that module stays within its size; the
build is builder.orchestration.reference_base.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from builder.cli.errors import reports_errors
from builder.cli.references import Reference
from builder.cli.shared import echo
from builder.resolve.target import ARCHES

if TYPE_CHECKING:
    from builder.cache import Cache
    from builder.oci.name import ImageRef


@click.command("base")
@click.option(
    "--tag",
    required=True,
    type=Reference("base --tag"),
    help="Name for the built base (with several arches host/repo:tag, pushed as an index).",
)
@click.option(
    "--from",
    "base_image",
    type=Reference("base image"),
    default="python:3.13-slim-trixie",
    show_default=True,
    help="The Python image to build on.",
)
@click.option(
    "--arch",
    "arches",
    multiple=True,
    type=click.Choice(sorted(ARCHES)),
    help="Architecture (repeatable; default amd64).",
)
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Cache directory.")
@click.option("--no-soci", is_flag=True, help="Attach no SOCI index to the pushed index's images.")
@reports_errors
def base_command(
    tag: ImageRef,
    base_image: ImageRef,
    arches: tuple[str, ...],
    cache_dir: Path | None,
    no_soci: bool,
) -> None:
    """Build the reference runtime base (Dockerfile.base); several arches go up as one index."""
    from builder.cli.cache import open_cache

    cache = open_cache(cache_dir)
    with cache.in_use():  # a prune meanwhile keeps what this build uses
        _build(tag, base_image, cache, tuple(dict.fromkeys(arches)) or ("amd64",), no_soci)


def _build(
    tag: ImageRef, base_image: ImageRef, cache: Cache, wanted: tuple[str, ...], no_soci: bool
) -> None:
    """The base's build, for the arches `wanted`, while the cache is in use."""
    from builder.orchestration.reference_base import build_base, build_base_index
    from builder.reporter import TO_STDERR
    from builder.retry import Retries

    # one arch: `tag` is the engine's local name; several: the index's registry reference
    if len(wanted) == 1:
        name = tag.as_written
        image_id = build_base(
            name, base_image=base_image, arch=wanted[0], cache=cache, log=sys.stderr
        )
        echo(f"{name} {image_id}")
        return
    retries = Retries(TO_STDERR)  # its stdout is the pushed reference: notes beside the log
    pushed = build_base_index(
        tag,
        wanted,
        base_image=base_image,
        cache=cache,
        log=sys.stderr,
        soci=not no_soci,
        retries=retries,
    )
    echo(f"{tag.as_written} {pushed.reference}")
