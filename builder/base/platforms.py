"""Which architectures a base image offers, so a build targets exactly those by default.

A base that came from a registry is asked there (its index lists the platforms; a plain
manifest has one, in its config): the engine's image store keeps only the variant it pulled, so
it answers only for an image built or imported locally. Unknown (no engine, registry
unreachable): None.
"""

from __future__ import annotations

from collections.abc import Sequence

import docker
import docker.errors

from builder.analysis.target import ARCHES
from builder.credentials import registry
from builder.errors import RegistryError, UserError
from builder.oci.name import ImageRef
from builder.oci.remote import offered
from builder.oci.v1 import Platform


def offered_arches(
    ref: ImageRef | None, client: docker.DockerClient | None
) -> tuple[str, ...] | None:
    """The supported arches `image` is available for, in ARCHES order; None if unknown.

    An engine image that came from no registry (built or imported here) has only its own arch;
    otherwise the registry is asked (Docker Hub only with an engine, as the probe does).
    """
    if ref is None:
        return None
    image = ref.as_written
    local = _local_arch(image, client)
    if local and not local[1]:
        return (local[0],) if local[0] in ARCHES else ()
    if client is not None or not ref.is_hub:
        try:
            found = offered(registry(ref, image), [Platform.linux(arch) for arch in ARCHES])
            return tuple(platform.architecture for platform in found)
        except RegistryError:
            pass  # fall back to the engine's copy
    if local is None:
        return None
    return (local[0],) if local[0] in ARCHES else ()


def _local_arch(image: str, client: docker.DockerClient | None) -> tuple[str, bool] | None:
    """The engine image's arch, and whether a registry knows it (it has a repo digest)."""
    if client is None:
        return None
    try:
        attrs = client.images.get(image).attrs
    except docker.errors.DockerException:
        return None
    return str(attrs.get("Architecture") or ""), bool(attrs.get("RepoDigests"))


def select_arches(
    requested: Sequence[str], offered: tuple[str, ...] | None, image: str | None
) -> tuple[str, ...]:
    """What to build: the requested arches (which the base must offer), else all it offers.

    An unknown offer keeps the old default, amd64, rather than guessing at emulated builds.
    """
    wanted = tuple(dict.fromkeys(requested))
    if offered is None:
        return wanted or ("amd64",)
    for arch in wanted:
        if arch not in offered:
            raise UserError(
                f"base image {image} has no linux/{arch} variant (it offers"
                f" {', '.join(f'linux/{a}' for a in offered)})"
            )
    if not offered:
        raise UserError(f"base image {image} offers neither linux/amd64 nor linux/arm64")
    return wanted or offered
