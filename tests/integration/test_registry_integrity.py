"""A registry that serves content not matching its digest ends the run; only an unreachable
registry may be answered with the shipped profile. Plus the OCI client's write side against the
local registry.

The tampering registry is a loopback HTTP server in this file serving one small image; the CLI
runs against it engine-less (`--no-build`), as a CI runner without Docker would.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from functools import partial
from typing import NamedTuple

import pytest
from support.registryhelp import layer_tar

from builder.base.discover import base_profile
from builder.cache import Cache
from builder.credentials import Credentials
from builder.errors import IntegrityError, RegistryAuthError, RegistryError, UserError
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, LocalFile, resolve, write
from builder.oci.v1 import Descriptor, Image, Index, Platform, digest_of
from builder.reporter import QUIET, Reporter
from builder.resolve.target import shipped_profile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, bytes]) -> bytes:
    return gzip.compress(layer_tar(files.items()), mtime=0)


class Served(NamedTuple):
    host: str
    manifest_digest: str
    layer_digest: str
    layer_served: str  # digest of the bytes served for the layer


class Tampered(NamedTuple):
    """One small image's bytes, as named and as a tampering registry serves them."""

    manifest: bytes
    served_manifest: bytes
    layer: bytes
    served_layer: bytes
    blobs: dict[str, bytes]  # digest as named -> bytes as served


def _tampered_image(mode: str) -> Tampered:
    """`x:t1`'s bytes, tampered as `mode` says (see tampering_registry)."""
    status = b"Package: libc6\nStatus: install ok installed\nVersion: 2.41-12\n"
    layer = _layer({"var/lib/dpkg/status": status})
    served_layer = (
        _layer({"var/lib/dpkg/status": status.replace(b"2.41", b"2.99")})
        if mode == "layer"
        else layer
    )
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {"Env": ["PYTHONPATH=/app/deps"]}}
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": _digest(layer), "size": len(layer)}],
        }
    ).encode()  # fmt: skip
    served_manifest = manifest + b"\n" if mode == "manifest" else manifest
    blobs = {_digest(config): config, _digest(layer): served_layer}
    return Tampered(manifest, served_manifest, layer, served_layer, blobs)


@pytest.fixture
def tampering_registry(request) -> Iterator[Served]:
    """A registry front for `x:t1` that tampers as `request.param` says.

    "manifest": the manifest body is changed after its digest was announced; "layer": the layer
    blob served is another gzip tar than the one the manifest names; "down": every API request
    answers 503.
    """
    mode = request.param
    image = _tampered_image(mode)
    manifest, served_manifest, blobs = image.manifest, image.served_manifest, image.blobs

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            if mode == "down":
                body, code, digest = b"", 503, None
            elif self.path == "/v2/x/manifests/t1":
                body, code, digest = served_manifest, 200, _digest(manifest)
            elif self.path.startswith("/v2/x/blobs/") and self.path[12:] in blobs:
                body, code, digest = blobs[self.path[12:]], 200, None
            else:
                body, code, digest = b"", 404, None
            self.send_response(code)
            if digest:
                self.send_header("Docker-Content-Digest", digest)
                self.send_header("Content-Type", OCI_MANIFEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Served(
        f"127.0.0.1:{server.server_address[1]}",
        _digest(manifest),
        _digest(image.layer),
        _digest(image.served_layer),
    )
    server.shutdown()
    server.server_close()


def _cli(image: str, tmp_path) -> subprocess.CompletedProcess:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("six\n")
    return subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(requirements), "--no-build",
         "--base-image", image, "--output", str(tmp_path / "context"),
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "DOCKER_CONFIG": str(tmp_path / "no-docker-config")},
    )  # fmt: skip


@pytest.mark.parametrize("tampering_registry", ["manifest"], indirect=True)
def test_tampered_manifest_ends_the_run_naming_both_digests(tampering_registry, tmp_path):
    result = _cli(f"{tampering_registry.host}/x:t1", tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"expected {tampering_registry.manifest_digest}, got sha256:" in lines[0]
    assert "does not match its digest" in lines[0]
    assert "shipped" not in result.stdout  # no fallback note
    assert not (tmp_path / "context").exists()


@pytest.mark.parametrize("tampering_registry", ["layer"], indirect=True)
def test_tampered_layer_ends_the_run_naming_both_digests(tampering_registry, tmp_path):
    result = _cli(f"{tampering_registry.host}/x:t1", tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    expected, actual = tampering_registry.layer_digest, tampering_registry.layer_served
    assert (
        f"blob {expected} does not match its digest: expected {expected}, got {actual}" in lines[0]
    )
    assert "shipped" not in result.stdout
    assert not (tmp_path / "context").exists()


@pytest.mark.parametrize("tampering_registry", ["down"], indirect=True)
def test_unreachable_registry_falls_back_with_a_note(tampering_registry, tmp_path):
    for image in (f"{tampering_registry.host}/x:t1", "127.0.0.1:9/x:t1"):  # 503, refused
        notes: list[str] = []
        ref = ImageRef.parse(image)
        profile = base_profile(ref, None, Cache(tmp_path / "cache"), Reporter(notes.append))
        assert profile == shipped_profile(ref)
        warnings = [line for line in notes if line.startswith("warning: base image ")]
        assert len(warnings) == 1, notes  # each retry a note before it
        assert "unreachable" in warnings[0] or "503" in warnings[0]
        assert f"planning against the {profile.source}" in warnings[0]


@pytest.mark.usefixtures("registry")
def test_refused_access_does_not_fall_back(registry, monkeypatch, tmp_path):
    for name in ("BSI_REGISTRY_USER", "BSI_REGISTRY_PASSWORD", "REGISTRY_USERNAME",
                 "REGISTRY_PASSWORD"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "empty"))
    with pytest.raises(RegistryAuthError, match="refused access"):
        base_profile(
            ImageRef.parse(f"{registry.host}/bsi-any/x:t1"), None, Cache(tmp_path / "c"), QUIET
        )


# ---------------------------------------------------------------------------------------------
# The write side, against the local registry
# ---------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("registry")
def test_write_side_upload_mount_and_manifest(registry, tmp_path):
    login = Credentials(registry.user, registry.password, "test")
    namespace = f"bsi-oci-{uuid.uuid4().hex[:8]}"
    one = RepositoryClient(ImageRef.parse(f"{registry.host}/{namespace}/one"), credentials=login)
    two = RepositoryClient(ImageRef.parse(f"{registry.host}/{namespace}/two"), credentials=login)
    small = uuid.uuid4().bytes * 10
    big_file = tmp_path / "big"
    big_file.write_bytes(os.urandom(300_000))
    small_digest = one.upload_blob(small)
    assert small_digest == _digest(small) and one.blob_exists(small_digest)
    # A file larger than a chunk goes in PATCHes; a stream too.
    assert one.upload_blob(big_file, _digest(big_file.read_bytes()), chunk=64 << 10) == _digest(
        big_file.read_bytes()
    )
    opener = partial(big_file.open, "rb")  # a stream is given as its opener: read again on a fault
    assert one.upload_blob(opener, chunk=100_000) == _digest(big_file.read_bytes())
    with one.blob(_digest(big_file.read_bytes())) as blob:
        assert blob.read() == big_file.read_bytes()
    with pytest.raises(IntegrityError, match=f"expected {_digest(b'other')}"):
        one.upload_blob(small, _digest(b"other"))
    assert not two.blob_exists(small_digest)
    assert two.mount(small_digest, f"{namespace}/one")
    assert two.blob_exists(small_digest)
    assert not two.mount(_digest(b"never uploaded"), f"{namespace}/one")
    config = json.dumps({"architecture": "amd64", "os": "linux"}).encode()
    config_digest = two.upload_blob(config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": small_digest, "size": len(small)}],
        }
    ).encode()  # fmt: skip
    digest = two.put_manifest("t1", manifest, OCI_MANIFEST)
    assert digest == _digest(manifest)
    assert two.head_manifest("t1") == digest
    body, fetched = two.manifest(digest)
    assert fetched == digest and json.loads(body)["layers"][0]["digest"] == small_digest


@pytest.mark.usefixtures("registry")
def test_write_mounts_uploads_and_moves_tags_only_at_the_end(registry, tmp_path):
    """`remote.write`: a shared blob is mounted (not uploaded), a local one uploaded; a blob
    with no source fails the write before any tag moves; then the index, and only it, is
    tagged, and `resolve` reads each arch back through it."""
    login = Credentials(registry.user, registry.password, "test")
    namespace = f"bsi-write-{uuid.uuid4().hex[:8]}"
    source = RepositoryClient(
        ImageRef.parse(f"{registry.host}/{namespace}/source"), credentials=login
    )
    target = RepositoryClient(
        ImageRef.parse(f"{registry.host}/{namespace}/target"), credentials=login
    )
    shared = os.urandom(1000)
    shared_digest = source.upload_blob(shared)
    local = tmp_path / "layer"
    local.write_bytes(os.urandom(2000))

    def image(arch, *extra):
        config = json.dumps({"architecture": arch, "rootfs": {"diff_ids": []}}).encode()
        layers = [
            Descriptor("", shared_digest, 1000),
            Descriptor("", digest_of(local.read_bytes()), 2000),
        ]
        return Image.build(config, [*layers, *extra])

    images = [image("amd64"), image("arm64")]
    index = Index.build([(Platform.linux(i.architecture), i) for i in images])
    blobs = Blobs({digest_of(local.read_bytes()): LocalFile(local)}, (source,))
    broken = image("arm64", Descriptor("", _digest(b"nowhere"), 7))
    with pytest.raises(UserError, match="no source for blob"):
        write(target, [images[0], broken], blobs, index=index, tags=["t1"])
    with pytest.raises(RegistryError, match="not found"):
        target.head_manifest("t1")
    written = write(target, images, blobs, index=index, tags=["t1", f"{target.label}:t2"])
    assert written.tags == (f"{target.label}:t1", f"{target.label}:t2")
    assert target.head_manifest("t1") == target.head_manifest("t2") == index.digest
    manifests = sum(len(i.manifest_bytes) for i in images) + len(index.manifest_bytes)
    configs = sum(len(i.config_bytes) for i in images) - len(images[0].config_bytes)
    # the first, failed write left amd64's blobs and manifest: only arm64's config is new
    assert written.bytes_uploaded == configs + manifests
    for found in images:
        platform = Platform.linux(found.architecture)
        assert resolve(target, platform, "t1").manifest_bytes == found.manifest_bytes
