"""Command line `base`: build the reference runtime base. Parses and prints only.

Apart from builder/cli/app.py (which registers it) so that module stays within its size; the
build is builder.image.reference_base.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from builder.analysis.target import ARCHES
from builder.cli.errors import reports_errors


@click.command("base")
@click.option(
    "--tag",
    required=True,
    help="Name for the built base (with several arches host/repo:tag, pushed as an index).",
)
@click.option(
    "--from",
    "base_image",
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
@reports_errors
def base_command(
    tag: str, base_image: str, arches: tuple[str, ...], cache_dir: Path | None
) -> None:
    """Build the reference runtime base (Dockerfile.base); several arches go up as one index."""
    from builder.cache import Cache, default_root
    from builder.image.reference_base import build_base, build_base_index
    from builder.oci.name import ImageRef

    cache = Cache(cache_dir or default_root())
    wanted = tuple(dict.fromkeys(arches)) or ("amd64",)
    # one arch: `tag` is the engine's local name; several: the index's registry reference
    index = ImageRef.parse(tag, "base --tag") if len(wanted) > 1 else None
    source = ImageRef.parse(base_image, "base image")
    if index is None:
        image_id = build_base(tag, base_image=source, arch=wanted[0], cache=cache, log=sys.stderr)
        click.echo(f"{tag} {image_id}")
        return
    pushed = build_base_index(index, wanted, base_image=source, cache=cache, log=sys.stderr)
    click.echo(f"{tag} {pushed.reference}")
