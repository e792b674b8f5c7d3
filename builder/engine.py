"""The local container engine: one client, found quickly or not at all, and image lookup."""

from __future__ import annotations

import os
from typing import Any

import docker
import docker.errors

from builder.credentials import engine_auth
from builder.errors import UserError
from builder.oci.name import ImageRef

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
PING_TIMEOUT = 3  # seconds: an absent engine must not stall an offline plan
API_TIMEOUT = 300


def engine_client() -> docker.DockerClient | None:
    """A client on the local engine, or None at once when none answers (plan offline instead)."""
    base_url = os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    try:
        client = docker.DockerClient(base_url=base_url, timeout=PING_TIMEOUT)
        client.ping()
    except Exception:  # any failure to connect means "no engine"; the caller falls back
        return None
    client.api.timeout = API_TIMEOUT  # pulls and probe containers need longer than a ping
    return client


def local_image(image: str, client: docker.DockerClient) -> Any:
    """The image to probe: the local one, unless its registry now names something newer.

    A platform may re-push a tag; a long-lived runner holding the old image must not plan
    against it. Images without a registry host (local builds) are used as they are.
    """
    ref = ImageRef.parse(image, "base image")
    credentials = engine_auth(ref.registry)
    try:
        local = client.images.get(image)
    except docker.errors.ImageNotFound:
        local = None
    if local is not None:
        if ref.is_hub and not image.startswith(("docker.io/", "index.docker.io/")):
            return local
        try:
            remote = client.images.get_registry_data(image, auth_config=credentials).id
        except docker.errors.DockerException:
            return local  # registry unreachable: the local copy is the best knowledge
        if any(digest.endswith(remote) for digest in local.attrs.get("RepoDigests") or []):
            return local
    try:
        return client.images.pull(image, auth_config=credentials)
    except docker.errors.DockerException as exc:
        raise UserError(
            f"base image {image}: not on the local engine and pulling it failed:"
            f" {failure_reason(exc)}"
        ) from None


def failure_reason(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()
