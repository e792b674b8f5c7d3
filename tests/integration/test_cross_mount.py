"""Cross-repository mounts (issue 20 item 3): what another repository holds is not uploaded.

Against the local registry (docker's distribution, which mounts): images of gzipped tar layers
written with `remote.write` and the file-backed blob memory; every request the client sends is
logged, so "no shared blob uploaded" is read off the wire, not off the tool's own counters.
Then, against a loopback token registry, the mount asks one token for both repositories and a
source the token service refuses falls back to the upload.
"""

from __future__ import annotations

import gzip
import http.server
import json
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.machine import Registry as LocalRegistry
from support.registryhelp import layer_tar

from builder.credentials import Credentials
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, LocalFile, write
from builder.oci.transport import Exchange
from builder.oci.v1 import Descriptor, Image, digest_of
from builder.publish.blob_memory import MAX_HOLDERS, FileBlobMemory
from builder.publish.node_update import baseline, chain_ids, node_update, previous_images
from builder.publish.state import BuildState

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


class Logged(RepositoryClient):
    """The real client, with every request it sends recorded as (method, url)."""

    def __init__(self, ref: ImageRef, credentials: Credentials) -> None:
        super().__init__(ref, credentials=credentials)
        self.sent: list[tuple[str, str]] = []

    def _once(self, exchange: Exchange) -> Any:  # every request but the token's is sent here
        self.sent.append((exchange.method, exchange.url))
        return super()._once(exchange)

    def uploaded(self) -> set[str]:
        """Digests of the blobs whose upload was completed (the closing PUT names them)."""
        return {
            urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["digest"][0]
            for method, url in self.sent
            if method == "PUT" and "/blobs/uploads/" in url
        }

    def mounted_from(self) -> list[str]:
        return [
            urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["from"][0]
            for method, url in self.sent
            if method == "POST" and "mount=" in url
        ]


def layer(directory: Path, name: str) -> tuple[Descriptor, str, Path]:
    """A gzipped one-file layer: its descriptor, diff ID, and the file holding the blob."""
    tar = layer_tar([(f"app/{name}", f"{name} {uuid.uuid4().hex}\n".encode() * 50)])
    blob = gzip.compress(tar, mtime=0)
    path = directory / name
    path.write_bytes(blob)
    return Descriptor(LAYER, digest_of(blob), len(blob)), digest_of(tar), path


def image(layers: list[tuple[Descriptor, str, Path]]) -> tuple[Image, Blobs]:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id for _, diff_id, _ in layers]},
    }
    built = Image.build(json.dumps(config).encode(), [d for d, _, _ in layers])
    return built, Blobs({d.digest: LocalFile(path) for d, _, path in layers})


@pytest.fixture
def world(registry: LocalRegistry, tmp_path: Path) -> Iterator[tuple[str, Credentials]]:
    yield (
        f"bsi-h3-mount-{uuid.uuid4().hex[:8]}",
        Credentials(registry.user, registry.password, "test"),
    )


def test_a_second_repository_mounts_every_shared_blob_and_uploads_only_the_new(
    registry: LocalRegistry, world: tuple[str, Credentials], tmp_path: Path
) -> None:
    namespace, login = world
    base, numpy, scipy, own = (layer(tmp_path, n) for n in ("base", "numpy", "scipy", "own"))
    memory_file = tmp_path / "cache" / "registry-blobs.json"
    first, first_blobs = image([base, numpy, scipy])
    one = Logged(ImageRef.parse(f"{registry.host}/{namespace}/one"), login)
    written = write(one, [first], first_blobs, tags=["t"], memory=FileBlobMemory(memory_file))
    assert written.bytes_mounted == written.bytes_present == 0
    assert one.uploaded() == {d.digest for d in (*first.layers, first.config_descriptor)}

    # another run: the memory comes back from the file
    memory = FileBlobMemory(memory_file)
    assert memory.holders(registry.host, numpy[0].digest) == [f"{namespace}/one"]
    second, second_blobs = image([base, numpy, scipy, own])
    two = Logged(ImageRef.parse(f"{registry.host}/{namespace}/two"), login)
    written = write(two, [second], second_blobs, tags=["t"], memory=memory)
    shared = [base[0], numpy[0], scipy[0]]
    assert two.uploaded() == {own[0].digest, second.config_descriptor.digest}  # on the wire
    assert two.mounted_from() == [f"{namespace}/one"] * 3
    assert written.bytes_mounted == sum(d.size for d in shared)
    assert written.bytes_present == 0
    assert written.bytes_uploaded == (
        own[0].size + len(second.config_bytes) + len(second.manifest_bytes)
    )
    for descriptor in second.layers:  # the registry's side: all of them there
        assert two.blob_exists(descriptor.digest)

    # the file was updated after the write: both repositories, the newest first
    again = json.loads(memory_file.read_text())[registry.host]
    assert again[numpy[0].digest] == [f"{namespace}/two", f"{namespace}/one"]
    assert again[own[0].digest] == [f"{namespace}/two"]


def test_a_stale_memory_falls_back_to_the_upload_and_is_corrected(
    registry: LocalRegistry, world: tuple[str, Credentials], tmp_path: Path
) -> None:
    namespace, login = world
    kept, lost = layer(tmp_path, "kept"), layer(tmp_path, "lost")
    memory = FileBlobMemory(tmp_path / "registry-blobs.json")
    # remembered in a repository that never got it (as if it was deleted since)
    memory.remember(registry.host, f"{namespace}/gone", [lost[0].digest])
    built, blobs = image([kept, lost])
    target = Logged(ImageRef.parse(f"{registry.host}/{namespace}/target"), login)
    written = write(target, [built], blobs, tags=["t"], memory=memory)
    assert target.mounted_from() == [f"{namespace}/gone"]  # tried, refused by the registry
    assert lost[0].digest in target.uploaded()
    assert written.bytes_mounted == 0 and target.blob_exists(lost[0].digest)
    assert FileBlobMemory(memory.path).holders(registry.host, lost[0].digest) == [
        f"{namespace}/target"
    ]


def test_the_memory_is_a_hint_a_corrupt_file_is_an_empty_one(tmp_path: Path) -> None:
    path = tmp_path / "registry-blobs.json"
    path.write_text("{not json")
    memory = FileBlobMemory(path)
    assert memory.holders("r:5000", "sha256:a") == []
    for number in range(MAX_HOLDERS + 2):
        memory.remember("r:5000", f"repo{number}", ["sha256:a"])
    holders = FileBlobMemory(path).holders("r:5000", "sha256:a")
    assert holders[0] == f"repo{MAX_HOLDERS + 1}" and len(holders) == MAX_HOLDERS
    memory.forget("r:5000", holders[0], "sha256:a")
    assert FileBlobMemory(path).holders("r:5000", "sha256:a") == holders[1:]
    unwritable = FileBlobMemory(path / "under-a-file.json")  # its directory is a file
    unwritable.remember("r:5000", "repo", ["sha256:a"])  # a lost hint, not a failed push
    assert unwritable.holders("r:5000", "sha256:a") == []


def test_node_update_counts_new_blobs_and_every_layer_above_the_first_change(
    tmp_path: Path,
) -> None:
    base, numpy, scipy, own = (layer(tmp_path, n) for n in ("base", "numpy", "scipy", "own"))
    previous, _ = image([base, numpy, scipy])
    changed, _ = image([base, own, scipy])  # scipy's blob is on the node, its chain ID is not
    update = node_update(changed, previous)
    assert (update.download, update.download_layers) == (own[0].size, 1)
    assert (update.unpack, update.unpack_layers) == (own[0].size + scipy[0].size, 2)
    assert chain_ids([base[1]]) == [base[1]]
    same = node_update(previous, previous)
    assert (same.download, same.unpack_layers) == (0, 0)
    assert node_update(previous, None).download_layers == 3


def test_the_previous_image_is_the_states_else_the_tags(
    registry: LocalRegistry,
    world: tuple[str, Credentials],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pipeline's tag changes with its extras: the state's last image is what nodes hold."""
    namespace, login = world
    monkeypatch.setenv("BSI_REGISTRY_USER", login.username)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", login.secret)
    base, numpy, scipy, own = (layer(tmp_path, n) for n in ("base", "numpy", "scipy", "own"))
    old, old_blobs = image([base, numpy, scipy])
    app = RepositoryClient(ImageRef.parse(f"{registry.host}/{namespace}/app"), credentials=login)
    write(app, [old], old_blobs, tags=["1.0-xaaaa"])
    state = tmp_path / "state.json"
    recorded = BuildState("1.0", "base", None, "3.13", {}, {}, f"{app.label}@{old.digest}")
    state.write_text(json.dumps(recorded.to_dict()))

    where, reference = baseline(state, app, "1.0-xbbbb")
    assert reference == old.digest
    previous, found = previous_images(where, reference, ["amd64", "arm64"])
    assert previous == old.digest and list(found) == ["amd64"]
    new, _ = image([base, numpy, own])
    update = node_update(new, found["amd64"])
    assert (update.previous, update.download, update.unpack_layers) == (old.digest, own[0].size, 1)

    assert baseline(None, app, "1.0-xbbbb") == (app, "1.0-xbbbb")
    assert previous_images(app, "1.0-xbbbb", ["amd64"]) == (None, {})  # no such tag: no figure
    assert previous_images(*baseline(None, app, "1.0-xaaaa"), ["amd64"])[0] == old.digest


# -- token auth: one token for both repositories ------------------------------------------------
class TokenRegistry:
    """A loopback registry with Bearer auth: a token names the scopes it was granted; a mount
    is made only with a token holding pull on its source; `secret` is never granted."""

    def __init__(self) -> None:
        self.token_scopes: list[list[str]] = []
        self.uploads = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, body = owner.route(
                    self.command, self.path, self.headers.get("Authorization", "")
                )
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = answer

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def route(self, method: str, path: str, authorization: str) -> tuple[int, dict, bytes]:
        parts = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(parts.query)
        if parts.path == "/token":
            scopes = query.get("scope", [])
            self.token_scopes.append(scopes)
            if any("repository:secret:" in s for s in scopes):
                return 403, {}, b""
            return 200, {}, json.dumps({"token": " ".join(scopes)}).encode()
        if not authorization.startswith("Bearer "):
            realm = f"http://{self.host}/token"
            scope = 'scope="repository:target:pull,push"'
            return 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="t",{scope}'}, b""
        granted = authorization.removeprefix("Bearer ").split()
        if method == "HEAD":
            return 404, {}, b""
        if method == "POST" and "mount" in query:
            if f"repository:{query['from'][0]}:pull" in granted:
                return 201, {}, b""
            return 202, {"Location": "/v2/target/blobs/uploads/declined"}, b""
        if method == "POST":
            return 202, {"Location": f"/v2/target/blobs/uploads/{uuid.uuid4().hex}"}, b""
        if method == "PUT" and "/blobs/uploads/" in parts.path:
            self.uploads += 1
        return 201, {}, b""


@pytest.fixture
def token_registry() -> Iterator[TokenRegistry]:
    server = TokenRegistry()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_a_mount_asks_one_token_for_both_repositories(
    token_registry: TokenRegistry, tmp_path: Path
) -> None:
    login = Credentials("bsi", "pw", "test")
    target = RepositoryClient(ImageRef.parse(f"{token_registry.host}/target"), credentials=login)
    assert not target.blob_exists(digest_of(b"x"))  # logs in for the target alone
    assert token_registry.token_scopes == [["repository:target:pull,push"]]
    assert target.mount(digest_of(b"x"), "other")
    assert token_registry.token_scopes[-1] == [
        "repository:target:pull,push",
        "repository:other:pull",
    ]


def test_a_source_the_token_service_refuses_falls_back_to_the_upload(
    token_registry: TokenRegistry, tmp_path: Path
) -> None:
    login = Credentials("bsi", "pw", "test")
    target = RepositoryClient(ImageRef.parse(f"{token_registry.host}/target"), credentials=login)
    memory = FileBlobMemory(tmp_path / "registry-blobs.json")
    only = layer(tmp_path, "only")
    memory.remember(token_registry.host, "secret", [only[0].digest])
    built, blobs = image([only])
    written = write(target, [built], blobs, tags=["t"], memory=memory)
    assert written.bytes_mounted == 0
    assert token_registry.uploads == 2  # the layer and the config
    assert memory.holders(token_registry.host, only[0].digest) == ["target"]


def test_a_refused_source_is_asked_for_once_per_write(
    token_registry: TokenRegistry, tmp_path: Path
) -> None:
    login = Credentials("bsi", "pw", "test")
    target = RepositoryClient(ImageRef.parse(f"{token_registry.host}/target"), credentials=login)
    secret = RepositoryClient(ImageRef.parse(f"{token_registry.host}/secret"), credentials=login)
    built, blobs = image([layer(tmp_path, "one"), layer(tmp_path, "two")])
    mountable = Blobs(blobs.sources, (secret,))
    written = write(target, [built], mountable, tags=["t"])
    assert written.bytes_mounted == 0
    assert token_registry.uploads == 3  # two layers and the config, none mounted
    asked = [s for s in token_registry.token_scopes if "repository:secret:pull" in s]
    assert len(asked) == 1  # not again for the second layer, nor the config
    assert target.refused_sources == {"secret"}


def test_a_rebase_that_pushes_early_counts_each_blob_once(
    registry: LocalRegistry, world: tuple[str, Credentials], tmp_path: Path
) -> None:
    """The rebase's early write (by digest, to pull it) and the final one add up to the image."""
    namespace, login = world
    base, own = layer(tmp_path, "base"), layer(tmp_path, "own")
    target = RepositoryClient(ImageRef.parse(f"{registry.host}/{namespace}/app"), credentials=login)
    before, before_blobs = image([base])
    write(target, [before], before_blobs, tags=["old"])  # the base's layer is there already
    rebased, blobs = image([base, own])
    early = write(target, [rebased], blobs)
    assert early.bytes_present == base[0].size
    digests = {d.digest for d in (*rebased.layers, rebased.config_descriptor)}
    final = write(target, [rebased], blobs, tags=["t"], written=digests).after(early)
    manifests = 2 * len(rebased.manifest_bytes)  # sent by each write
    blob_bytes = sum(d.size for d in (*rebased.layers, rebased.config_descriptor))
    assert final.bytes_uploaded == own[0].size + len(rebased.config_bytes) + manifests
    assert final.bytes_present == base[0].size and final.bytes_mounted == 0
    assert final.bytes_uploaded + final.bytes_mounted + final.bytes_present == (
        blob_bytes + manifests
    )
