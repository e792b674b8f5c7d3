"""Probing a base image through its registry, with no engine involved in the probe itself.

The reference base is pushed to the local htpasswd registry and probed both ways: the registry
probe must report what the engine probe reports. A small two-arch index is uploaded through the
registry's HTTP API to cover indexes, arm64 read for real, whiteouts and opaque directories; a
Dockerfile-built image covers whiteouts as the engine writes them.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, NamedTuple

import pytest
from support.credhelp import install_helper, write_docker_config
from support.registryhelp import NO_PROXY_OPENER, forget_credentials, layer_tar, mount_image
from support.wheelfactory import compile_so

from builder.base.from_registry import probe_registry
from builder.base.probe import probe_base
from builder.cache import Cache
from builder.errors import RegistryAuthError, RegistryUnreachable, UserError
from builder.oci.name import ImageRef

pytestmark = pytest.mark.usefixtures("docker_client", "registry")

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


class Pushed(NamedTuple):
    reference: str  # host/repo:tag as pushed
    digest: str  # the manifest digest the registry holds (from RepoDigests)


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """No registry credentials anywhere: no environment variables, an empty Docker config."""
    home = tmp_path / "empty-home"
    home.mkdir()
    forget_credentials(monkeypatch, home)
    monkeypatch.setenv("DOCKER_CONFIG", str(home / ".docker"))


@pytest.fixture
def credentials(registry, monkeypatch, no_credentials):
    """Registry credentials in the environment only; no Docker config to fall back on."""
    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)


def _push(docker_client, registry, image: str, repository: str, tag: str) -> Pushed:
    docker_client.images.get(image).tag(repository, tag)
    auth = {"username": registry.user, "password": registry.password}
    for event in docker_client.images.push(
        repository, tag=tag, auth_config=auth, stream=True, decode=True
    ):
        assert "error" not in event, event
    digests = docker_client.images.get(f"{repository}:{tag}").attrs["RepoDigests"]
    digest = next(d.partition("@")[2] for d in digests if d.startswith(f"{repository}@"))
    return Pushed(f"{repository}:{tag}", digest)


@pytest.fixture(scope="module")
def namespace() -> str:
    return f"bsi-regprobe-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pushed_reference(pushed_reference, registry, namespace):
    """The session's pushed reference base (conftest), tagged t1 in this module's repository."""
    reference = f"{registry.host}/{namespace}/runtime:t1"
    return Pushed(reference, mount_image(registry, pushed_reference, reference))


@pytest.fixture(scope="module")
def engine_profile(docker_client, reference_image, tmp_path_factory):
    return probe_base(
        ImageRef.parse(reference_image), docker_client, Cache(tmp_path_factory.mktemp("engine"))
    )


# ---------------------------------------------------------------------------------------------
# The reference base, probed both ways
# ---------------------------------------------------------------------------------------------
def test_registry_probe_matches_the_engine_probe(
    pushed_reference, engine_profile, credentials, tmp_path
):
    started = time.monotonic()
    profile = probe_registry(ImageRef.parse(pushed_reference.reference), Cache(tmp_path / "cache"))
    elapsed = time.monotonic() - started
    assert profile.python_version == engine_profile.python_version
    assert profile.glibc == engine_profile.glibc == "2.41"
    assert profile.user == engine_profile.user == "65532:65532"
    assert profile.pythonpath == engine_profile.pythonpath
    assert dict(profile.distributions) == dict(engine_profile.distributions)
    assert {"pandas", "requests", "pydantic"} <= set(profile.distributions)
    # The engine reads `ldconfig -p` and the library directories inside the container; the
    # registry probe reads the same ld.so.cache and directories from the layers.
    assert profile.sonames["amd64"] == engine_profile.sonames["amd64"]
    assert profile.packages["amd64"] == engine_profile.packages["amd64"]
    # A single-arch image: arm64 is derived from the package list exactly as the engine does.
    assert profile.sonames["arm64"] == engine_profile.sonames["arm64"]
    # The engine knows no digest for a local tag; the registry's is the pushed manifest's.
    assert profile.digest == pushed_reference.digest
    assert profile.source == f"registry {pushed_reference.digest.removeprefix('sha256:')[:12]}"
    assert elapsed < 60, f"registry probe took {elapsed:.1f}s"


def test_probe_by_digest(pushed_reference, engine_profile, credentials, tmp_path):
    repository = pushed_reference.reference.rsplit(":", 1)[0]
    image = f"{repository}@{pushed_reference.digest}"
    profile = probe_registry(ImageRef.parse(image), Cache(tmp_path / "cache"))
    assert profile.image == image
    assert profile.digest == pushed_reference.digest
    assert dict(profile.distributions) == dict(engine_profile.distributions)


def test_second_probe_is_served_from_the_cache(
    pushed_reference, credentials, tmp_path, monkeypatch
):
    cache = Cache(tmp_path / "cache")
    first = probe_registry(ImageRef.parse(pushed_reference.reference), cache)
    record = cache.get_record("registry-probe", first.digest.removeprefix("sha256:"))
    assert record["digest"] == first.digest

    requests: list[str] = []
    real_open = urllib.request.OpenerDirector.open

    def counting_open(self, request, *args, **kwargs):
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        requests.append(url)
        if "/blobs/" in url:
            raise AssertionError(f"a cached probe fetched a blob: {url}")
        return real_open(self, request, *args, **kwargs)

    monkeypatch.setattr(urllib.request.OpenerDirector, "open", counting_open)
    assert probe_registry(ImageRef.parse(pushed_reference.reference), cache) == first
    manifests = [url for url in requests if "/manifests/" in url]
    assert len(manifests) <= 1, requests  # one HEAD (plus an auth retry at most)
    requests.clear()
    by_digest = pushed_reference.reference.rsplit(":", 1)[0] + "@" + first.digest
    assert probe_registry(ImageRef.parse(by_digest), cache).distributions == first.distributions
    assert requests == []  # a digest reference needs no request at all


def test_docker_config_basic_auth_is_used(pushed_reference, registry, no_credentials, tmp_path):
    config_dir = tmp_path / "empty-home" / ".docker"
    config_dir.mkdir()
    auth = registry.auth_header().removeprefix("Basic ")
    (config_dir / "config.json").write_text(
        json.dumps({"auths": {f"http://{registry.host}": {"auth": auth}}})
    )
    profile = probe_registry(ImageRef.parse(pushed_reference.reference), Cache(tmp_path / "cache"))
    assert profile.digest == pushed_reference.digest


def test_without_credentials_is_a_user_error(pushed_reference, no_credentials, tmp_path):
    with pytest.raises(RegistryAuthError) as caught:
        probe_registry(ImageRef.parse(pushed_reference.reference), Cache(tmp_path / "cache"))
    message = str(caught.value)
    assert pushed_reference.reference in message
    assert "unauthorized" in message and "BSI_REGISTRY_USER" in message


def test_wrong_password_is_a_user_error(pushed_reference, monkeypatch, credentials, tmp_path):
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", "not-the-password")
    with pytest.raises(RegistryAuthError, match="refused access"):
        probe_registry(ImageRef.parse(pushed_reference.reference), Cache(tmp_path / "cache"))


def test_missing_tag_is_a_user_error(pushed_reference, credentials, tmp_path):
    image = pushed_reference.reference.rsplit(":", 1)[0] + ":no-such-tag"
    with pytest.raises(UserError) as caught:
        probe_registry(ImageRef.parse(image), Cache(tmp_path / "cache"))
    assert image in str(caught.value) and "not found" in str(caught.value)


def test_unreachable_registry_is_a_user_error(credentials, tmp_path):
    image = "127.0.0.1:9/nothing/here:t1"  # discard port: nothing listens
    with pytest.raises(RegistryUnreachable, match="unreachable") as caught:
        probe_registry(ImageRef.parse(image), Cache(tmp_path / "cache"))
    assert image in str(caught.value)


# ---------------------------------------------------------------------------------------------
# Whiteouts as the engine writes them
# ---------------------------------------------------------------------------------------------
def test_dockerfile_whiteouts(
    docker_client, registry, reference_image, namespace, engine_profile, credentials, tmp_path
):
    """`rm -rf` in a later layer hides a dist-info; re-creating a removed dir makes it opaque."""
    assert "idna" in engine_profile.distributions
    metadata = "Metadata-Version: 2.1\\nName: {0}\\nVersion: 1.0\\n"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {reference_image}\n"
        "USER root\n"
        "RUN mkdir -p /app/extra/old-1.0.dist-info"
        f" && printf '{metadata.format('Old')}' > /app/extra/old-1.0.dist-info/METADATA\n"
        "RUN rm -rf /app/deps/idna-*.dist-info\n"
        "RUN rm -rf /app/extra && mkdir -p /app/extra/new-1.0.dist-info"
        f" && printf '{metadata.format('New')}' > /app/extra/new-1.0.dist-info/METADATA\n"
        "ENV PYTHONPATH=/app/deps:/app/extra\n"
        "USER 65532:65532\n"
    )
    image, _ = docker_client.images.build(path=str(tmp_path), rm=True)
    repository = f"{registry.host}/{namespace}/whiteout"
    try:
        pushed = _push(docker_client, registry, image.id, repository, "t1")
        profile = probe_registry(ImageRef.parse(pushed.reference), Cache(tmp_path / "cache"))
        engine = probe_base(
            ImageRef.parse(pushed.reference), docker_client, Cache(tmp_path / "engine")
        )
    finally:
        docker_client.images.remove(image.id, force=True)
    assert "idna" not in profile.distributions
    assert "old" not in profile.distributions
    assert profile.distributions["new"] == "1.0"
    expected = {k: v for k, v in engine_profile.distributions.items() if k != "idna"}
    assert dict(profile.distributions) == {**expected, "new": "1.0"}
    assert dict(profile.distributions) == dict(engine.distributions)
    assert profile.sonames == engine.sonames
    assert profile.digest == engine.digest == pushed.digest


# ---------------------------------------------------------------------------------------------
# A synthetic two-arch index uploaded through the HTTP API
# ---------------------------------------------------------------------------------------------
def _layer(files: dict[str, bytes | str]) -> bytes:
    """A gzip tar: bytes are regular files, str values are symlink targets."""
    return gzip.compress(layer_tar(files.items()), mtime=0)


def _status(*packages: tuple[str, str, str]) -> bytes:
    stanzas = [f"Package: {n}\nStatus: {s}\nVersion: {v}\n" for n, v, s in packages]
    return "\n".join(stanzas).encode()


def _metadata(name: str, version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n".encode()


class Uploader:
    def __init__(self, registry, repository: str) -> None:
        self.registry, self.repository = registry, repository
        self.base = f"http://{registry.host}/v2/{repository}"

    def _send(self, url: str, method: str, data: bytes = b"", content_type: str = "") -> dict:
        request = urllib.request.Request(url, data=data or None, method=method)
        request.add_header("Authorization", self.registry.auth_header())
        if content_type:
            request.add_header("Content-Type", content_type)
        with NO_PROXY_OPENER.open(request, timeout=30) as response:
            return dict(response.headers)

    def blob(self, data: bytes, media_type: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        location = self._send(f"{self.base}/blobs/uploads/", "POST")["Location"]
        if location.startswith("/"):
            location = f"http://{self.registry.host}{location}"
        separator = "&" if "?" in location else "?"
        self._send(f"{location}{separator}digest={digest}", "PUT", data, "application/octet-stream")
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def manifest(self, document: dict, reference: str) -> dict:
        data = json.dumps(document).encode()
        url = f"{self.base}/manifests/{reference}"
        headers = self._send(url, "PUT", data, document["mediaType"])
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        assert headers.get("Docker-Content-Digest") == digest
        return {"mediaType": document["mediaType"], "digest": digest, "size": len(data)}

    def image(self, arch: str, layers: list[bytes], env: list[str]) -> dict:
        descriptors = [self.blob(layer, OCI_LAYER) for layer in layers]
        config = {
            "architecture": arch,
            "os": "linux",
            "config": {"Env": env, "User": "65532:65532"},
            "rootfs": {
                "type": "layers",
                "diff_ids": [
                    "sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest()
                    for layer in layers
                ],
            },
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": self.blob(json.dumps(config).encode(), OCI_CONFIG),
            "layers": descriptors,
        }
        descriptor = self.manifest(manifest, f"{arch}-only")
        return {**descriptor, "platform": {"os": "linux", "architecture": arch}}


@pytest.fixture(scope="module")
def synthetic_index(registry, namespace, tmp_path_factory) -> Pushed:
    build = tmp_path_factory.mktemp("synthetic")
    libs = {
        soname: compile_so(
            build, f"int f{i}(void) {{ return {i}; }}\n", f"{i}.so", soname=soname
        ).read_bytes()
        for i, soname in enumerate(["libbsireal.so.1", "libbsigone.so.7", "libbsiarm.so.3"])
    }
    amd64_dir, arm64_dir = "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu"
    status = _status(
        ("libc6", "2.41-12", "install ok installed"),
        ("python3.13-minimal", "3.13.7-1", "install ok installed"),
        ("python3.13", "3.13.7-1", "install ok installed"),
        ("python3.12", "3.12.9-1", "install ok installed"),
        ("oldpkg", "1.0-1", "deinstall ok config-files"),
    )
    lower = _layer(
        {
            "lib": "usr/lib",  # merged /usr
            "usr/bin/python3": "python3.13",
            "var/lib/dpkg/status": status,
            "app/deps/Keep_Me-1.0.dist-info/METADATA": _metadata("Keep_Me", "1.0"),
            "app/deps/gone-2.0.dist-info/METADATA": _metadata("gone", "2.0"),
            "app/extra/keep.me-9.9.dist-info/METADATA": _metadata("keep.me", "9.9"),
            "app/extra/old-1.0.dist-info/METADATA": _metadata("old", "1.0"),
            f"{amd64_dir}/libbsireal.so.1.2.3": libs["libbsireal.so.1"],
            f"{amd64_dir}/libbsireal.so.1": "libbsireal.so.1.2.3",
            f"{amd64_dir}/libbsigone.so.7": libs["libbsigone.so.7"],
            f"{amd64_dir}/libnotelf.so.1": b"not an ELF file",
        }
    )
    upper = _layer(
        {
            "app/deps/.wh.gone-2.0.dist-info": b"",
            "app/extra/.wh..wh..opq": b"",
            "app/extra/new-3.0.dist-info/METADATA": _metadata("new", "3.0"),
            f"{amd64_dir}/.wh.libbsigone.so.7": b"",
        }
    )
    arm64 = _layer(
        {
            "var/lib/dpkg/status": status,
            "app/deps/Keep_Me-1.0.dist-info/METADATA": _metadata("Keep_Me", "1.0"),
            f"{arm64_dir}/libbsiarm.so.3": libs["libbsiarm.so.3"],
        }
    )
    env = ["PATH=/usr/bin", "PYTHONPATH=/app/deps:/app/extra"]
    uploader = Uploader(registry, f"{namespace}/synthetic")
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            uploader.image("arm64", [arm64], env),
            uploader.image("amd64", [lower, upper], env),
        ],
    }
    descriptor = uploader.manifest(index, "t1")
    return Pushed(f"{registry.host}/{namespace}/synthetic:t1", descriptor["digest"])


def test_synthetic_index_whiteouts_and_both_arches(synthetic_index, credentials, tmp_path):
    profile = probe_registry(ImageRef.parse(synthetic_index.reference), Cache(tmp_path / "cache"))
    assert profile.digest == synthetic_index.digest  # the index's digest, not an entry's
    # `gone` is whited out; /app/extra is opaque in the upper layer, so only `new` is left
    # there; `keep-me` is in both dirs and the first on PYTHONPATH wins.
    assert dict(profile.distributions) == {"keep-me": "1.0", "new": "3.0"}
    # libbsigone is whited out; libnotelf is not an ELF file (the engine skips those too).
    assert profile.sonames["amd64"] == {"libbsireal.so.1"}
    assert profile.sonames["arm64"] == {"libbsiarm.so.3"}  # read from the arm64 image
    assert profile.packages["amd64"] == {"libc6", "python3.13-minimal", "python3.13", "python3.12"}
    assert profile.python_version == "3.13.7"  # the python3 link names 3.13, not 3.12
    assert profile.glibc == "2.41"
    assert profile.user == "65532:65532"
    assert profile.pythonpath == "/app/deps:/app/extra"


def test_synthetic_single_manifest_derives_arm64(synthetic_index, credentials, tmp_path):
    image = synthetic_index.reference.rsplit(":", 1)[0] + ":amd64-only"
    profile = probe_registry(ImageRef.parse(image), Cache(tmp_path / "cache"))
    assert profile.sonames["amd64"] == {"libbsireal.so.1"}
    # Derived: what trixie's arm64 packages of the same names ship, plus unpackaged libraries.
    assert "libc.so.6" in profile.sonames["arm64"]
    assert "libbsireal.so.1" in profile.sonames["arm64"]  # no dpkg list owns it


# ---------------------------------------------------------------------------------------------
# Token authentication, through a loopback front that speaks Bearer to the client
# ---------------------------------------------------------------------------------------------
class _TokenFront(http.server.BaseHTTPRequestHandler):
    """A registry front speaking Bearer: a token service at /token (the real registry's login
    asked for), everything else forwarded to `registry` once the request carries `token`.
    `seen` gathers the token service's queries and the Authorization each came with."""

    registry: Any
    token: str
    seen: dict[str, list[str]]

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        if self.path.startswith("/token"):
            self.issue_token()
        elif self.headers.get("Authorization") != f"Bearer {self.token}":
            self.challenge()
        else:
            self.forward()

    def issue_token(self):
        """The token, to the real registry's login only."""
        self.seen["token_queries"].append(self.path.partition("?")[2])
        self.seen["token_auth"].append(self.headers.get("Authorization", ""))
        if self.headers.get("Authorization") != self.registry.auth_header():
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"token": self.token}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def challenge(self):
        """A 401 naming this front's token service as the realm."""
        port = self.server.server_address[1]
        self.send_response(401)
        self.send_header(
            "WWW-Authenticate",
            f'Bearer realm="http://127.0.0.1:{port}/token",service="front",'
            'scope="repository:anything:pull"',
        )
        self.send_header("Content-Length", "0")
        self.end_headers()

    def forward(self):
        """The request asked of the real registry with its login, the answer passed back."""
        request = urllib.request.Request(
            f"http://{self.registry.host}{self.path}", method=self.command
        )
        request.add_header("Authorization", self.registry.auth_header())
        if self.headers.get("Accept"):
            request.add_header("Accept", self.headers["Accept"])
        try:
            response = NO_PROXY_OPENER.open(request, timeout=30)
        except urllib.error.HTTPError as exc:
            response = exc
        with response:
            self.send_response(response.status)
            for name in ("Content-Type", "Content-Length", "Docker-Content-Digest"):
                if response.headers.get(name):
                    self.send_header(name, response.headers[name])
            self.end_headers()
            if self.command == "GET":
                shutil.copyfileobj(response, self.wfile)


@pytest.fixture
def token_front(registry):
    """A loopback registry front with a token service; it forwards to the real registry."""
    seen: dict[str, list[str]] = {"token_queries": [], "token_auth": []}
    handler = type(
        "Handler", (_TokenFront,), {"registry": registry, "token": uuid.uuid4().hex, "seen": seen}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_bearer_token_authentication(token_front, synthetic_index, registry, credentials, tmp_path):
    host, seen = token_front
    image = host + "/" + synthetic_index.reference.split("/", 1)[1]
    profile = probe_registry(ImageRef.parse(image), Cache(tmp_path / "cache"))
    assert profile.digest == synthetic_index.digest
    assert dict(profile.distributions) == {"keep-me": "1.0", "new": "3.0"}
    assert seen["token_auth"] and set(seen["token_auth"]) == {registry.auth_header()}
    assert "service=front" in seen["token_queries"][0]
    assert "scope=repository:anything:pull" in seen["token_queries"][0]


@pytest.mark.usefixtures("docker_client")
@pytest.mark.usefixtures("registry")
@pytest.mark.usefixtures("package_index")
def test_no_build_plans_against_the_registry_base(
    pushed_reference, registry, no_credentials, monkeypatch, tmp_path
):
    """Without building, the CLI still plans against the real base, read from its registry,
    logging in through a credential helper the Docker config names for that registry."""
    log = install_helper(
        tmp_path / "bin", "bsitest", {registry.host: (registry.user, registry.password)},
        monkeypatch,
    )  # fmt: skip
    write_docker_config(
        tmp_path / "docker", {"credHelpers": {registry.host: "bsitest"}}, monkeypatch
    )
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("beautifulsoup4\n")
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(requirements), "--no-build",
         "--base-image", pushed_reference.reference, "--output", str(tmp_path / "context"),
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert registry.host in log.read_text().splitlines()  # the helper was asked, by server
    digest = pushed_reference.digest
    assert f"base: {pushed_reference.reference}@{digest} (python 3.13.5, registry " in result.stdout
    dockerfile = (tmp_path / "context" / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE={pushed_reference.reference}@{digest}" in dockerfile
    report = json.loads((tmp_path / "context" / "report.json").read_text())
    assert report["base"]["source"].startswith("registry ")
    assert "typing-extensions==" in " ".join(report["architectures"]["amd64"]["provided_by_base"])
