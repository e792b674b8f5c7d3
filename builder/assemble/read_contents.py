"""What an engine image holds, read without running it: dpkg's status and every METADATA.

The SBOM lists what the image holds, so its facts come from the image itself, not from the
plan: a container is created (never started, so a foreign arch needs no emulation) and the
files are copied out of it through the engine's archive API. A PYTHONPATH entry is streamed
as a tar and only its `*.dist-info/METADATA` members are kept, so nothing of the image is
written to disk.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from builder.errors import UserError
from builder.layers.layer import ChunkStream

DPKG_STATUS = "/var/lib/dpkg/status"
MAX_METADATA = 8 << 20  # one METADATA file; real ones are a few KiB to a few hundred


@dataclass(frozen=True)
class ImageFacts:
    """The texts an SBOM is made of: dpkg's database and each distribution's METADATA."""

    dpkg_status: str
    metadata: tuple[tuple[str, str], ...]  # (PYTHONPATH entry, METADATA text), sorted


def image_facts(client: docker.DockerClient, image: str, entries: Sequence[str]) -> ImageFacts:
    """dpkg's status and the METADATA of every distribution in `entries` of `image`.

    An entry the image lacks holds nothing; an image without a dpkg database is an error (an
    SBOM of a Debian image without its packages would be a lie of omission).
    """
    container = client.containers.create(image, command=["/bin/true"], network_disabled=True)
    try:
        status = _members(container, DPKG_STATUS, lambda name: name == "status")
        if not status:
            raise UserError(f"{image}: no {DPKG_STATUS}; cannot list its Debian packages")
        metadata = []
        for entry in entries:
            found = _members(container, entry, _is_metadata)
            metadata += [(entry, text) for _, text in sorted(found.items())]
        return ImageFacts(status["status"], tuple(metadata))
    finally:
        container.remove(force=True)


def _is_metadata(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 3 and parts[1].endswith(".dist-info") and parts[2] == "METADATA"


def _members(container: Any, path: str, wanted: Any) -> dict[str, str]:
    """The regular files under `path` whose tar names `wanted` accepts, as text."""
    try:
        stream, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return {}
    found = {}
    with tarfile.open(
        fileobj=io.BufferedReader(ChunkStream(stream), 1 << 20), mode="r|"
    ) as archive:
        for member in archive:
            if member.isfile() and member.size <= MAX_METADATA and wanted(member.name):
                data = archive.extractfile(member)
                if data is not None:
                    found[member.name] = data.read().decode("utf-8", errors="replace")
    return found
