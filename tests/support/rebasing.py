"""The reference base in a repository of a test's own, read back as the rebase producer reads it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from builder import credentials
from builder.oci.client import Registry as RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.remote import resolve
from builder.oci.v1 import Image, Platform
from support.registryhelp import mount_image


@dataclass(frozen=True)
class OwnBase:
    run: str  # unique to the test: in the repository's name and in the labels of its images
    runtime: str  # host/namespace/runtime, holding the base as v1
    client: RepositoryClient  # on that repository, with the test registry's login
    digest: str  # v1's manifest digest
    image: Image  # v1 for amd64, as remote.resolve reads it


def own_base(
    registry: Any, pushed_reference: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> OwnBase:
    """The session's pushed reference base mounted as `<prefix>-<run>/runtime:v1`, with the test
    registry's login in the environment (where the tool looks for it) for the rest of the test."""
    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
    monkeypatch.delenv("BSI_REGISTRY", raising=False)
    run = uuid.uuid4().hex[:8]
    runtime = f"{registry.host}/{prefix}-{run}/runtime"
    mount_image(registry, pushed_reference, f"{runtime}:v1")
    client = credentials.registry(ImageRef.parse_repository(runtime))
    digest = client.manifest("v1")[1]
    return OwnBase(run, runtime, client, digest, resolve(client, Platform.linux("amd64"), digest))
