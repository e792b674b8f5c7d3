"""The real base's facts, found the best way this run can: engine, else registry, else shipped."""

from __future__ import annotations

import docker

from builder.base.from_registry import probe_registry
from builder.base.probe import probe_base
from builder.base.profile import base_problems, profile_differences
from builder.cache import Cache
from builder.errors import RegistryUnreachable
from builder.oci.name import ImageRef
from builder.reporter import Reporter
from builder.resolve.target import BaseProfile, shipped_facts, shipped_profile
from builder.retry import Retries


def base_profile(
    image: ImageRef,
    client: docker.DockerClient | None,
    cache: Cache,
    reporter: Reporter,
    retries: Retries | None = None,
) -> BaseProfile:
    """The real base's facts: through the engine, else through its registry (asked through
    the run's `retries`).

    The shipped profile is only the offline fallback: for a Docker Hub base without an engine,
    or a registry that cannot be reached even after the retries (RegistryUnreachable), with a
    warning that says what it costs. Every other failure, a digest mismatch above all, ends
    the run: planning against a guess would hide it.
    """
    shipped = shipped_profile(image)
    if client is not None:
        probed = probe_base(image, client, cache, reporter, retries)
    elif not image.is_hub:
        try:
            probed = probe_registry(image, cache, retries)
        except RegistryUnreachable as error:
            reporter.warn(
                f"{error}; planning against the {shipped.source}: the base's own libraries,"
                " packages and digest are not known, and the plan may need what it has or"
                " miss what it lacks"
            )
            return shipped
    else:
        reporter.note(f"no engine probe; planning against the {shipped.source}")
        return shipped
    for line in profile_differences(shipped_facts(), probed):
        reporter.note(f"base differs from the shipped reference profile: {line}")
    for problem in base_problems(probed):
        reporter.warn(f"base {probed.image}: {problem}")
    return probed
