"""Registry credentials and the OCI client against hostile or careless configurations.

Each test is a way a password could reach a host it was not meant for, or a registry answer
that used to crash or exhaust the client. The registries are loopback HTTP servers in this file
whose handlers record what they were sent.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator

import pytest
from support.credhelp import write_docker_config
from support.fakeregistry import Reply, Server, sha256_digest
from support.registryhelp import CREDENTIAL_VARS

from builder.credentials import SCOPE_ENV, Credentials, lookup
from builder.errors import RegistryAuthError, RegistryError, UserError
from builder.oci import auth
from builder.oci import client as oci
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.v1 import Descriptor, Index, Platform, canonical

LOGIN = Credentials("bsi", "the-password", "test")


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    for name in (*CREDENTIAL_VARS, SCOPE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[str, str], Reply]], Server]]:
    servers: list[Server] = []

    def start(route: Callable[[str, str], Reply]) -> Server:
        servers.append(Server(route))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


# -- credentials --------------------------------------------------------------------------------
def test_environment_login_is_not_sent_to_docker_hub(monkeypatch):
    """A private registry's password in the environment must not go to Docker Hub (and make
    an anonymous Hub base fail with 401) unless BSI_REGISTRY says it is Hub's."""
    monkeypatch.setenv("BSI_REGISTRY_USER", "ci")
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", "private")
    assert lookup(ImageRef.parse("python:3.13").registry) is None
    assert lookup("registry.corp:5000") is not None
    monkeypatch.setenv(SCOPE_ENV, "registry.corp:5000")
    assert lookup("registry.corp:5000") is not None
    assert lookup("ghcr.io") is None
    assert lookup("docker.io") is None
    monkeypatch.setenv(SCOPE_ENV, "index.docker.io")
    assert lookup("docker.io") == Credentials("ci", "private", "BSI_REGISTRY_USER")
    assert lookup("registry.corp:5000") is None


def test_helper_name_with_a_path_is_refused(monkeypatch, tmp_path):
    """`credHelpers: {"reg": "x/../evil"}` would run ./evil from the working directory."""
    work = tmp_path / "work"
    (work / "docker-credential-x").mkdir(parents=True)
    marker = tmp_path / "ran"
    evil = work / "evil"
    evil.write_text(f'#!/bin/sh\ntouch "{marker}"\necho \'{{"Username":"u","Secret":"s"}}\'\n')
    evil.chmod(0o755)
    monkeypatch.chdir(work)
    write_docker_config(
        tmp_path / "cfg", {"credHelpers": {"reg.example": "x/../evil"}}, monkeypatch
    )
    with pytest.raises(UserError, match="not a helper name"):
        lookup("reg.example")
    assert not marker.exists()


def test_helper_printing_binary_garbage_means_no_login(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-garbage"
    helper.write_text("#!/bin/sh\nprintf '\\377\\376\\377{'\n")
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    write_docker_config(tmp_path / "cfg", {"credsStore": "garbage"}, monkeypatch)
    assert lookup("reg.example") is None


# -- where the OCI client sends credentials ------------------------------------------------------
def test_upload_location_on_another_host_gets_no_authorization(serve):
    """A registry's upload Location on another origin must not receive the Basic password."""
    elsewhere = serve(lambda method, path: (202 if method == "PATCH" else 201, {}, b""))
    other = f"http://localhost:{elsewhere.port}/upload/1"
    registry = serve(lambda method, path: (202, {"Location": other}, b""))
    client = RepositoryClient(ImageRef.parse(f"127.0.0.1:{registry.port}/repo"), credentials=LOGIN)
    client.upload_blob(b"data")
    assert [m for m, _, _ in elsewhere.seen] == ["PUT"]
    assert all(auth == "" for _, _, auth in elsewhere.seen)
    assert registry.seen[0][2].startswith("Basic ")  # the registry itself still gets it


@pytest.mark.parametrize("realm", ["http://bsi-test.invalid/token", "file:///etc/passwd"])
def test_token_realm_must_be_https(serve, realm):
    """A Bearer challenge pointing at plain HTTP elsewhere (or a file) gets no password."""
    challenge = {"WWW-Authenticate": f'Bearer realm="{realm}",service="x"'}
    registry = serve(lambda method, path: (401, challenge, b""))
    client = RepositoryClient(
        ImageRef.parse(f"127.0.0.1:{registry.port}/repo:1"), credentials=LOGIN
    )
    with pytest.raises(RegistryAuthError, match="only an https token service"):
        client.manifest("1")


def test_malformed_digest_from_a_manifest_is_not_requested(serve):
    registry = serve(lambda method, path: (404, {}, b""))
    client = RepositoryClient(ImageRef.parse(f"127.0.0.1:{registry.port}/repo"), credentials=LOGIN)
    for digest in ("sha256:../../../v2/other/manifests/x", "sha256:abc?x=1", "latest"):
        with pytest.raises(RegistryError, match="malformed"):
            client.blob(digest)
    with pytest.raises(RegistryError, match="malformed"):
        client.manifest("../../other/manifests/1")
    assert registry.seen == []


def test_oversized_manifest_and_config_are_refused_by_size(serve, monkeypatch):
    """Bounded reads say the answer is too large, rather than failing on a truncated body;
    an oversized config blob is not drained to its end."""
    monkeypatch.setattr(oci, "MAX_MANIFEST", 1000)
    monkeypatch.setattr(oci, "MAX_JSON_BLOB", 1000)
    big = json.dumps({"pad": "x" * 5000}).encode()
    registry = serve(lambda method, path: (200, {}, big))
    client = RepositoryClient(ImageRef.parse(f"127.0.0.1:{registry.port}/repo"))
    with pytest.raises(RegistryError, match="larger than"):
        client.manifest("1")
    with pytest.raises(RegistryError, match="larger than"):
        client.small_blob(sha256_digest(big))


def test_token_service_answer_is_bounded(serve):
    """A token service streaming megabytes is cut off, not held in memory whole."""
    huge = json.dumps({"token": "t", "pad": "x" * (auth.MAX_TOKEN_ANSWER + 10)}).encode()

    def route(method: str, path: str) -> Reply:
        if path.startswith("/token"):
            return 200, {"Content-Type": "application/json"}, huge
        realm = f"http://127.0.0.1:{registry.port}/token"
        return 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="x"'}, b""

    registry = serve(route)
    client = RepositoryClient(
        ImageRef.parse(f"127.0.0.1:{registry.port}/repo:1"), credentials=LOGIN
    )
    with pytest.raises(RegistryError, match="answered no JSON"):
        client.manifest("1")


def test_one_variant_rule_picks_an_index_entry():
    """amd64: plain or v1-v4, plain (or v1) preferred; arm64: v8, a missing variant is v8."""

    def entry(arch, variant=None, os="linux", n=0):
        platform = {"os": os, "architecture": arch} | ({"variant": variant} if variant else {})
        digest = f"sha256:{hashlib.sha256(f'{os}/{arch}/{variant}/{n}'.encode()).hexdigest()}"
        return {"mediaType": "m", "digest": digest, "size": 1, "platform": platform}

    def pick(entries, arch):
        index = Index.parse(canonical({"manifests": entries}))
        found = index.pick(Platform.linux(arch))
        return found.to_dict() if found else None

    unknown = {
        "digest": "sha256:" + "0" * 64,
        "size": 1,
        "mediaType": "m",
        "platform": {"os": "unknown", "architecture": "unknown"},
    }
    entries = [
        unknown,
        entry("amd64", os="windows"),
        entry("amd64", "v3"),
        entry("amd64"),
        entry("arm64", "v8"),
        entry("arm64"),
    ]
    assert pick(entries, "amd64") == entry("amd64")  # plain beats the v3 listed first
    assert pick([entry("amd64", "v3"), entry("amd64", "v2")], "amd64") == entry("amd64", "v2")
    assert pick([entry("amd64", "v3"), entry("amd64", "v1")], "amd64") == entry("amd64", "v1")
    assert pick([entry("amd64", "v5")], "amd64") is None
    assert pick(entries, "arm64") == entry("arm64", "v8")
    assert pick([entry("arm64")], "arm64") == entry("arm64")  # no variant counts as v8
    assert pick([entry("arm64", "v9")], "arm64") is None
    assert pick(entries, "s390x") is None
    assert pick([], "amd64") is None
    assert Platform.of_machine("aarch64") == Platform("arm64", "linux", "v8")
    assert Platform.of_machine("x86_64") == Platform("amd64")
    assert Descriptor.from_dict(entry("arm64")).platform == Platform("arm64")
