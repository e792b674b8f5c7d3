"""Publishing: tag naming, credentials, and real pushes to the local htpasswd registry."""

from __future__ import annotations

import io
import re
import tarfile
import uuid

import docker
import docker.errors
import pytest
from registryhelp import CREDENTIAL_VARS, registry_get, registry_tags

from builder.credentials import engine_auth
from builder.errors import UserError
from builder.image.publish import extras_hash, image_tags, push_image

# --- naming -------------------------------------------------------------------------------------


def test_extras_hash_is_short_stable_and_order_independent() -> None:
    locks = ["requests==2.32.3 --hash=sha256:aa\n", "libgomp1\n"]
    value = extras_hash(locks)
    assert re.fullmatch(r"[0-9a-f]{12}", value)
    assert extras_hash(reversed(locks)) == value
    assert extras_hash(["requests==2.32.4 --hash=sha256:bb\n", "libgomp1\n"]) != value
    assert extras_hash(["ab", "c"]) != extras_hash(["a", "bc"])


def test_two_extension_sets_get_different_tags() -> None:
    one = image_tags("reg.example/team/py", "1.4.0", extras_hash(["bs4==4.12.3"]))
    two = image_tags("reg.example/team/py", "1.4.0", extras_hash(["lightgbm==4.5.0", "libgomp1"]))
    assert one != two
    for ref in one + two:
        assert re.fullmatch(r"reg\.example/team/py:1\.4\.0-x[0-9a-f]{12}", ref)


@pytest.mark.parametrize(
    ("version", "tag_start"),
    [
        ("3.13-slim-trixie", "3.13-slim-trixie-x"),
        ("1.2.3+build/7", "1.2.3-build-7-x"),
        ("..v2", "v2-x"),
    ],
)
def test_platform_version_is_made_tag_safe(version: str, tag_start: str) -> None:
    (ref,) = image_tags("localhost:5000/py", version, "0123456789abcdef")
    tag = ref.rsplit(":", 1)[1]
    assert tag == f"{tag_start}0123456789ab"
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag)


def test_long_platform_version_keeps_the_hash() -> None:
    (ref,) = image_tags("py", "v" * 300, "0123456789ab")
    tag = ref.split(":", 1)[1]
    assert len(tag) == 128 and tag.endswith("-x0123456789ab")


@pytest.mark.parametrize(
    "repository", ["Team/Py", "reg.example/py:1.0", "py@sha256:" + "a" * 64, ""]
)
def test_invalid_repositories_are_refused(repository: str) -> None:
    with pytest.raises(UserError, match="push target"):
        image_tags(repository, "1.0", "0123456789ab")


def test_unusable_platform_version_is_refused() -> None:
    with pytest.raises(UserError, match="platform version"):
        image_tags("py", "...", "0123456789ab")


# --- real pushes --------------------------------------------------------------------------------


def build_tiny_image(client: docker.DockerClient, tag: str) -> str:
    """A one-layer image with unique content, so every push uploads fresh blobs."""
    unique = uuid.uuid4().hex
    files = {
        "Dockerfile": f"FROM scratch\nCOPY hello /hello\nLABEL test.run={unique}\n".encode(),
        "hello": unique.encode(),
    }
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, _ = client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True)
    return image.id


@pytest.fixture
def tiny_image(docker_client: docker.DockerClient):
    """(image id, local tag); the image and every tag on it are removed afterwards."""
    local = f"bsi-test-publish:{uuid.uuid4().hex[:12]}"
    image_id = build_tiny_image(docker_client, local)
    yield image_id, local
    docker_client.images.remove(image_id, force=True)


def local_image(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


@pytest.mark.registry
@pytest.mark.engine
def test_push_with_credentials_returns_the_registry_digest(docker_client, registry, tiny_image):
    image_id, _ = tiny_image
    name = f"bsi-test-publish-{uuid.uuid4().hex[:8]}"
    repository = f"{registry.host}/{name}"
    tags = image_tags(repository, "3.13-slim-trixie", extras_hash(["bs4==4.12.3"]))
    credentials = {"username": registry.user, "password": registry.password}
    seen: list[str] = []

    result = push_image(docker_client, image_id, repository, tags, credentials, seen.append)

    assert re.fullmatch(r"sha256:[0-9a-f]{64}", result.digest)
    assert result.reference == f"{repository}@{result.digest}"
    assert result.tags == tuple(tags)
    assert any("Pushed" in line for line in seen)
    tag = tags[0].rsplit(":", 1)[1]
    assert registry_tags(registry, name) == [tag]
    with registry_get(registry, f"/v2/{name}/manifests/{tag}") as response:
        assert response.headers["Docker-Content-Digest"] == result.digest
    with registry_get(registry, f"/v2/{name}/manifests/{result.digest}") as response:
        assert response.status == 200
    assert local_image(docker_client, tags[0]) == image_id


@pytest.mark.registry
@pytest.mark.engine
def test_push_without_credentials_fails_cleanly(
    docker_client, registry, tiny_image, test_env, tmp_path, monkeypatch
):
    """No env credentials and an empty Docker config: the engine gets no auth at all."""
    image_id, local = tiny_image
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # empty: no stored login applies
    name = f"bsi-test-publish-{uuid.uuid4().hex[:8]}"
    repository = f"{registry.host}/{name}"
    tags = image_tags(repository, "3.13-slim-trixie", extras_hash(["x"]))
    credentials = engine_auth(registry.host)
    assert credentials is None
    client = docker.DockerClient(base_url=test_env["docker_host"])  # reads the empty config
    try:
        with pytest.raises(UserError) as caught:
            push_image(client, image_id, repository, tags, credentials)
    finally:
        client.close()

    message = str(caught.value)
    assert "\n" not in message
    assert f"push to {tags[0]} denied" in message
    assert f"docker login {registry.host}" in message and "BSI_REGISTRY_USER" in message
    assert registry_tags(registry, name) == []  # nothing half-pushed on the registry
    assert local_image(docker_client, tags[0]) is None  # push tag removed again
    assert local_image(docker_client, local) == image_id  # the image itself kept


@pytest.mark.registry
@pytest.mark.engine
def test_wrong_password_restores_a_moved_tag(docker_client, registry, tiny_image):
    """A tag that named another image before the failed push names that image again."""
    image_id, _ = tiny_image
    name = f"bsi-test-publish-{uuid.uuid4().hex[:8]}"
    repository = f"{registry.host}/{name}"
    other_id = build_tiny_image(docker_client, f"{repository}:1.0-x0123456789ab")
    try:
        with pytest.raises(UserError, match="denied"):
            push_image(
                docker_client,
                image_id,
                repository,
                ["1.0-x0123456789ab"],
                {"username": registry.user, "password": "wrong-password"},
            )
        assert local_image(docker_client, f"{repository}:1.0-x0123456789ab") == other_id
        assert registry_tags(registry, name) == []
    finally:
        docker_client.images.remove(other_id, force=True)
