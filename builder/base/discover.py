"""The real base's facts, found the best way this run can: engine, else registry, else shipped.

A run that builds nothing (`--no-build`) is given no engine, yet the base may exist only in the
local one (a base built or tagged here): an engine that answers and holds it is asked for its
facts then, so the plan is made for the base given, not for the reference base's facts.
"""

from __future__ import annotations

import docker
import docker.errors

from builder.base.from_registry import probe_registry
from builder.base.probe import probe_base
from builder.base.profile import base_problems, profile_differences
from builder.cache import Cache
from builder.engines.connection import engine_client
from builder.errors import RegistryUnreachable
from builder.oci.name import ImageRef
from builder.reporter import Reporter
from builder.resolve.target import REFERENCE_BASE, BaseProfile, shipped_facts, shipped_profile
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

    Without `client` (a run that builds nothing), a local engine that answers and holds the
    image is probed all the same. The shipped profile is only the offline fallback: for a
    Docker Hub base no engine here holds, or a registry that cannot be reached even after the
    retries (RegistryUnreachable), with a warning that says what it costs. Every other
    failure, a digest mismatch above all, ends the run: planning against a guess would hide it.
    """
    shipped = shipped_profile(image)
    held = _holding(image) if client is None else None
    if held is not None:
        try:
            probed = probe_base(image, held, cache, reporter, retries)
        finally:
            held.close()
    elif client is not None:
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
    elif image.as_written == REFERENCE_BASE:
        reporter.note(
            f"no engine holds {image.as_written} here: planning against its shipped profile"
        )
        return shipped
    else:
        reporter.warn(
            f"no engine here holds {image.as_written}: planning for it against the"
            f" {shipped.source}, whose python, /app/deps and libraries may differ from its"
            " own (pull or build it where an engine answers to plan against it)"
        )
        return shipped
    for line in profile_differences(shipped_facts(), probed):
        reporter.note(f"base differs from the shipped reference profile: {line}")
    for problem in base_problems(probed):
        reporter.warn(f"base {probed.image}: {problem}")
    return probed


def _holding(image: ImageRef) -> docker.DockerClient | None:
    """The local engine when it answers and holds `image`, else None (nothing is pulled)."""
    client = engine_client()
    if client is None:
        return None
    try:
        client.images.get(image.as_written)
    except docker.errors.DockerException:
        client.close()
        return None
    return client
