"""Which architectures a base image offers, so a build targets exactly those by default.

A base that came from a registry is asked there (its index lists the platforms; a plain
manifest has one, in its config): the engine's image store keeps only the variant it pulled, so
it answers only for an image built or imported locally. Unknown (no engine, registry
unreachable): None. What a digest offers never changes, so it is asked once and kept in the
cache: a rerun on the same base makes no registry round trip for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import docker
import docker.errors

from builder.cache import Cache
from builder.credentials import registry
from builder.errors import RegistryError, UserError
from builder.oci.name import ImageRef
from builder.oci.remote import offered
from builder.oci.v1 import Platform
from builder.reporter import QUIET, Reporter
from builder.resolve.target import ARCHES
from builder.retry import Retries

PLATFORMS_RECORD = "platforms"  # cache records: a manifest digest -> the arches it offers


def offered_arches(
    ref: ImageRef | None,
    client: docker.DockerClient | None,
    digest: str | None = None,
    cache: Cache | None = None,
    reporter: Reporter = QUIET,
    retries: Retries | None = None,
) -> tuple[str, ...] | None:
    """The supported arches `image` is available for, in ARCHES order; None if unknown.

    An engine image with no digest in the named repository (`digest`: built, imported or tagged
    here) has only its own arch: a registry's image of that name may be another one. Otherwise
    the registry is asked (Docker Hub only with an engine, as the probe does), for `digest`
    when it is known (the very image probed, even if its tag moved since), and its answer kept
    in `cache`. The registry is asked through the run's `retries`; one that still fails, or
    does not hold the reference, leaves the engine's copy's arch, with a warning saying so:
    the other arches the registry may offer are not built.
    """
    if ref is None:
        return None
    image = ref.as_written
    local = _local_arch(image, client)
    if local is not None and digest is None:  # built, imported or tagged here: only its arch
        return (local,) if local in ARCHES else ()
    if digest is not None and cache is not None:
        kept = cache.get_record(PLATFORMS_RECORD, digest.removeprefix("sha256:"))
        if isinstance(kept, list):
            return tuple(str(arch) for arch in kept)
    if client is not None or not ref.is_hub:
        asked = ref.with_digest(digest) if digest is not None else ref
        try:
            source = registry(asked, image, retries)
            found = offered(source, [Platform.linux(arch) for arch in ARCHES])
        except RegistryError as error:
            reporter.warn(
                f"{error}; building the arch of the engine's copy of the base ({local}) alone:"
                " any other arch the registry offers is not built"
                if local is not None
                else f"{error}; the arches the base offers are not known"
            )
        else:
            arches = tuple(platform.architecture for platform in found)
            if digest is not None and cache is not None:
                cache.put_record(PLATFORMS_RECORD, digest.removeprefix("sha256:"), list(arches))
            return arches
    if local is None:
        return None
    return (local,) if local in ARCHES else ()


def _local_arch(image: str, client: docker.DockerClient | None) -> str | None:
    """The engine image's arch; None without an engine or such an image."""
    if client is None:
        return None
    try:
        attrs = client.images.get(image).attrs
    except docker.errors.DockerException:
        return None
    return str(attrs.get("Architecture") or "")


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
