"""Helpers for tests that talk to the local test registry directly over its HTTP API."""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import pytest

# Loopback only: never route test traffic through an HTTP(S)_PROXY from the environment.
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# Accept header for manifest requests: every manifest and index type a registry may serve.
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)

# The referrers tag schema's tags (distribution spec 1.1): an index of an image's attachments.
REFERRERS_TAG = re.compile(r"sha256-[0-9a-f]{64}")

# Environment variables the builder reads push credentials from.
CREDENTIAL_VARS = (
    "BSI_REGISTRY_USER",
    "BSI_REGISTRY_PASSWORD",
    "REGISTRY_USERNAME",
    "REGISTRY_PASSWORD",
)


def forget_credentials(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """No registry login from the environment or a Docker config: HOME is `home`."""
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)


class RegistryLike(Protocol):
    """What these helpers need of the `registry` fixture (conftest's `Registry`)."""

    @property
    def host(self) -> str: ...

    def auth_header(self) -> str: ...


def registry_get(registry: RegistryLike, path: str) -> http.client.HTTPResponse:
    """GET `path` from the registry with the test credentials; raises HTTPError on 4xx/5xx."""
    request = urllib.request.Request(
        f"http://{registry.host}{path}",
        headers={"Authorization": registry.auth_header(), "Accept": MANIFEST_TYPES},
    )
    return NO_PROXY_OPENER.open(request, timeout=10)


def registry_tags(registry: RegistryLike, repo: str, referrers: bool = False) -> list[str]:
    """The tags the registry holds for `repo`, sorted; none if it has never seen the repository.

    The referrers tag schema's `sha256-<hex>` tags (an image's attachments, where the registry
    has no referrers API) are left out unless `referrers`: they are not tags a push names.
    """
    try:
        with registry_get(registry, f"/v2/{repo}/tags/list") as response:
            tags = sorted(json.load(response).get("tags") or [])
            return [t for t in tags if referrers or not REFERRERS_TAG.fullmatch(t)]
    except urllib.error.HTTPError as exc:
        assert exc.code == 404, exc
        return []


def layer_tar(entries: Iterable[tuple[str, bytes | str | None]]) -> bytes:
    """An uncompressed layer tar: (name, file bytes | symlink target str | None for a dir)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for name, value in entries:
            info = tarfile.TarInfo(name)
            if value is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif isinstance(value, str):
                info.type, info.linkname = tarfile.SYMTYPE, value
                archive.addfile(info)
            else:
                info.size = len(value)
                archive.addfile(info, io.BytesIO(value))
    return raw.getvalue()


REPO_ROOT = Path(__file__).resolve().parents[2]


class LoginLike(Protocol):
    """What `tool` needs of a registry fixture: the test registry's login."""

    @property
    def user(self) -> str: ...

    @property
    def password(self) -> str: ...


def tool(registry: LoginLike, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, logged in to the test registry through the environment."""
    env = {
        **os.environ,
        "BSI_REGISTRY_USER": registry.user,
        "BSI_REGISTRY_PASSWORD": registry.password,
    }
    return subprocess.run(
        [sys.executable, "-m", "builder", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=timeout,
    )


def blob_status(registry: RegistryLike, repo: str, digest: str) -> int:
    request = urllib.request.Request(
        f"http://{registry.host}/v2/{repo}/blobs/{digest}",
        method="HEAD",
        headers={"Authorization": registry.auth_header()},
    )
    try:
        with NO_PROXY_OPENER.open(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def served_digest(registry: RegistryLike, repo: str, tag: str) -> str:
    with registry_get(registry, f"/v2/{repo}/manifests/{tag}") as response:
        return response.headers["Docker-Content-Digest"]


def push(client: Any, registry: Any, ref: str) -> str:
    """Push a locally tagged `ref` with the test credentials; the manifest digest."""
    repository, _, tag = ref.rpartition(":")
    auth = {"username": registry.user, "password": registry.password}
    digest = None
    for event in client.api.push(repository, tag=tag, auth_config=auth, stream=True, decode=True):
        assert "error" not in event, event
        digest = (event.get("aux") or {}).get("Digest") or digest
    assert digest, f"no digest pushing {ref}"
    return digest


def mount_image(registry: Any, source: str, target: str) -> str:
    """`source` (host/repo:tag or @digest) put under `target` (host/repo:tag) of the same
    registry, logged in as the test registry's user, by the tool's own cross-repository mount
    of each blob: no layer is uploaded again. The manifest's digest."""
    from builder.oci.auth import Credentials
    from builder.oci.client import Registry as RepositoryClient
    from builder.oci.name import ImageRef

    login = Credentials(registry.user, registry.password, "the test registry")
    origin, destination = ImageRef.parse(source), ImageRef.parse(target)
    body, _ = RepositoryClient(origin, None, login).manifest(origin.digest or origin.tag or "")
    manifest = json.loads(body)
    writing = RepositoryClient(destination, None, login)
    for blob in [manifest["config"], *manifest["layers"]]:
        assert writing.mount(blob["digest"], origin.repository), f"{blob['digest']} not mounted"
    return writing.put_manifest(destination.tag or "latest", body, manifest["mediaType"])
