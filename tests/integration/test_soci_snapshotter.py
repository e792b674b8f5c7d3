"""The real lazy node accepts the tool's SOCI index: Debian 13's soci-snapshotter 0.4.1 beside a
private containerd pulls the pushed image with only the index the tool attached (no `soci
create` anywhere: it finds the index through the referrers fallback tag), mounts the tool's
layers through the tool's ztocs, and the sandbox server starts and imports the set from them.
The real `soci` reads the same ztocs back (its `ztoc info` and `ztoc get-file`), and the same
image still pulls and runs unchanged with plain containerd (overlayfs) and with Docker.

One image (sympy: pure Python; its import reads many files) on the reference base, a local
engine image: the push saves and gzips the base's layers too, so every layer is indexed and
lazily loaded. Pushed once by the
CLI; one node for every test.
"""

from __future__ import annotations

import json
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.images import docker
from support.machine import unavailable
from support.registryhelp import tool
from support.socinode import SociNode, TlsRegistry

from builder.cache import Cache
from builder.layers.gzipped import spans_of
from builder.layers.soci import attached_index_problems
from builder.oci.auth import Credentials
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import referrers
from builder.oci.remote import read
from builder.oci.v1 import Image
from builder.oci.ztoc import SOCI_INDEX, indexed_layers
from builder.oci.ztoc_read import read_ztoc

RUN = uuid.uuid4().hex[:8]
MOUNT = "type=tmpfs,src=tmpfs,dst=/workspace,options=rw:uid=65532:gid=65532"
# Health first (the server is up), then the set imported by a command the server runs.
FIRST_IMPORT = """
import json, time, urllib.request as u
deadline = time.monotonic() + 120  # a lazily pulled server may start slowly on a busy node
while True:
    try:
        u.urlopen("http://127.0.0.1:8888/", timeout=10); break
    except OSError:
        assert time.monotonic() < deadline, "the server did not answer GET /"
        time.sleep(0.1)
body = json.dumps({"command": ["python3", "-c", "import sympy; print(sympy.sqrt(8))"]})
request = u.Request("http://127.0.0.1:8888/execute", body.encode(),
                    {"Content-Type": "application/json"})
print(u.urlopen(request, timeout=120).read().decode())
"""
SAMPLED = 24  # files read back through the real `soci ztoc get-file` per ztoc (all multi-span)


@dataclass(frozen=True)
class Pushed:
    repository: str  # path in the registry, without the host
    digest: str
    report: dict[str, Any]
    cache: Cache
    client: RepositoryClient


def push_sympy(
    registry: Any, base: str, cache: Path, work: Path, repository: str, *flags: str
) -> dict[str, Any]:
    """sympy on `base`, built and pushed by the CLI to `repository` (tagged locally as
    `<repository>:test`); report.json's image record."""
    (work / "requirements.txt").write_text("sympy\n")
    result = tool(
        registry, "-r", str(work / "requirements.txt"), "--base-image", base,
        "--arch", "amd64", "--tag", f"{repository}:test", "--push",
        f"{registry.host}/{repository}", "--output", str(work / "context"),
        "--cache-dir", str(cache), *flags,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report: dict[str, Any] = json.loads((work / "context" / "report.json").read_text())["image"]
    return report


@pytest.fixture(scope="module")
def pushed(
    registry: Any,
    reference_image: str,
    shared_cache: Path,
    package_index: str,
    test_env: dict,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pushed]:
    """sympy on the reference base, built, verified and pushed with its SOCI index (the local
    tags this module's builds leave are removed at its end)."""
    work = tmp_path_factory.mktemp("soci")
    repository = f"bsi-soci-{RUN}/sympy"
    report = push_sympy(registry, reference_image, shared_cache, work, repository)
    ref = ImageRef.parse(f"{registry.host}/{repository}:x")
    client = RepositoryClient(
        ref, credentials=Credentials(registry.user, registry.password, "test")
    )
    yield Pushed(repository, report["digest"], report, Cache(shared_cache), client)
    for local in (repository, f"{repository}-plain"):
        docker(test_env, "rmi", "-f", f"{local}:test", check=False)


@pytest.fixture(scope="module")
def node(test_env: dict, registry: Any, pushed: Pushed, tmp_path_factory) -> Iterator[SociNode]:
    binaries = [Path(test_env.get(key) or "/nonexistent") for key in ("soci", "soci_snapshotter")]
    if not all(binary.is_file() for binary in binaries):
        unavailable("no soci-snapshotter in the test-env file (scripts/setup-env.sh --all)")
    work = tmp_path_factory.mktemp("soci-node")
    with (
        TlsRegistry(work, Path(test_env["registry_dir"])) as tls,
        SociNode(
            work, test_env["soci"], test_env["soci_snapshotter"], tls,
            (registry.user, registry.password),
        ) as started,
    ):  # fmt: skip
        yield started


def test_the_index_is_attached_and_names_every_layer(
    pushed: Pushed, registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = [r for r in referrers(pushed.client, pushed.digest) if r.artifact_type == SOCI_INDEX]
    assert [r.digest for r in found] == [pushed.report["soci"]["index"]]
    manifest, _ = pushed.client.manifest(found[0].digest)
    indexed = indexed_layers(manifest)
    image = read(pushed.client, pushed.digest)
    assert isinstance(image, Image)
    # every layer, however small: the extras' and the base's, all gzipped by this push
    every = {layer.digest for layer in image.layers}
    extras = {x["digest"] for x in pushed.report["extras_layers"]}
    bytecode = {x["digest"] for x in pushed.report["extras_layers"] if x["kind"] == "bytecode"}
    assert set(indexed) == every and bytecode and every - extras
    assert {z["layer"]: z["ztoc"] for z in pushed.report["soci"]["ztocs"]} == indexed
    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
    reference = ImageRef.parse(f"{registry.host}/{pushed.repository}@{pushed.digest}")
    assert attached_index_problems(reference) == (found[0].digest, [])  # verify's soci line


def test_no_soci_pushes_the_image_without_an_index(
    pushed: Pushed, registry: Any, reference_image: str, shared_cache: Path, tmp_path: Path
) -> None:
    repository = f"bsi-soci-{RUN}/sympy-plain"
    report = push_sympy(
        registry, reference_image, shared_cache, tmp_path, repository, "--no-soci", "--no-verify"
    )
    assert "soci" not in report
    ref = ImageRef.parse(f"{registry.host}/{repository}:x")
    client = RepositoryClient(
        ref, credentials=Credentials(registry.user, registry.password, "test")
    )
    kinds = {r.artifact_type for r in referrers(client, report["digest"])}
    assert SOCI_INDEX not in kinds and "application/vnd.cyclonedx+json" in kinds


def test_a_lazy_node_starts_the_server_and_imports_the_set_with_only_the_tools_index(
    node: SociNode, pushed: Pushed
) -> None:
    reference = f"{node.registry.host}/{pushed.repository}@{pushed.digest}"
    started, (_, lines) = time.monotonic(), node.registry.sent()
    pulled = node.soci("image", "rpull", "--user", ":".join(node.login), reference)
    assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:]
    ran = node.ctr("run", "-d", "--snapshotter", "soci", "--read-only", "--mount", MOUNT,
                   reference, "lazy")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    imported = node.ctr("task", "exec", "--exec-id", "first", "lazy", "python3", "-c", FIRST_IMPORT)
    elapsed, (sent, _) = time.monotonic() - started, node.registry.sent(lines)
    assert imported.returncode == 0, (
        imported.stderr[-3000:] + node.log("soci-snapshotter-grpc")[-3000:]
    )
    assert json.loads(imported.stdout)["stdout"] == "2*sqrt(2)\n"
    log = node.log("soci-snapshotter-grpc")
    index = pushed.report["soci"]["index"]
    assert f'"digest":"{index}","level":"info","msg":"fetching SOCI index from remote' in log
    for ztoc in pushed.report["soci"]["ztocs"]:  # every indexed layer mounted through its ztoc
        downloaded = "[Resolver.Resolve] downloaded layer ZTOC"
        assert f'"layer_sha":"{ztoc["layer"]}","level":"debug","msg":"{downloaded}"' in log
    # Up to the first import the node fetched the index, the ztocs, the layers without one and
    # the spans the import read (0.4.1 logs no on-demand span; its background fetch of the rest
    # waits for a silence period): well under the whole image.
    record = pushed.report["soci"]
    whole = record["normal_pull_bytes"]
    assert record["lazy_before_mount_bytes"] < sent < whole, (sent, whole)
    # report.json's estimate from what verification saw the import read, whole files counted:
    # within the same bounds; the node also read what starting the server reads
    estimate = record["lazy_first_import_bytes"]
    assert record["lazy_before_mount_bytes"] < estimate < whole, record
    print(f"lazy pull to first import: {elapsed:.1f} s, {sent / 2**20:.1f} of {whole / 2**20:.1f}"
          f" MiB fetched; report.json's estimate {estimate / 2**20:.1f} MiB")  # fmt: skip


def test_the_real_soci_reads_every_ztoc_back_as_the_layers_are(
    node: SociNode, pushed: Pushed, tmp_path: Path
) -> None:
    """`soci ztoc info` lists what the tar holds; `soci ztoc get-file` returns its bytes."""
    manifest, _ = pushed.client.manifest(pushed.report["soci"]["index"])
    content = "/var/lib/soci-snapshotter-grpc/content/blobs/sha256"
    blobs = {pushed.report["soci"]["index"]: manifest}
    for ztoc in indexed_layers(manifest).values():
        with pushed.client.blob(ztoc) as stream:
            blobs[ztoc] = stream.read()
    for digest, data in blobs.items():
        (tmp_path / digest.removeprefix("sha256:")).write_bytes(data)
    copied = node.run("sh", "-c", f"mkdir -p {content} && cp {tmp_path}/* {content}/")
    assert copied.returncode == 0, copied.stderr
    rebuilt = node.soci("rebuild-db")
    assert rebuilt.returncode == 0, rebuilt.stderr
    reference = f"{node.registry.host}/{pushed.repository}@{pushed.digest}"
    fetched = node.ctr("content", "fetch", "--user", ":".join(node.login), reference)
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    sympy = {  # sympy's bytecode layer
        x["digest"]
        for x in pushed.report["extras_layers"]
        if x["kind"] == "bytecode" and x["distributions"] == ["sympy"]
    }
    assert len(sympy) == 1
    crossing = 0  # files read from two spans or more, in all the layers
    for layer, ztoc in indexed_layers(manifest).items():
        info = node.soci("ztoc", "info", ztoc)
        assert info.returncode == 0, info.stderr
        described = json.loads(info.stdout)
        files = described["files"] or []  # null for a layer of no entry (the base's WORKDIR)
        ours = read_ztoc(blobs[ztoc])
        blob = spans_of(layer, pushed.cache)  # the layer as pushed (a base's has no kept tar)
        assert blob is not None
        with tarfile.open(blob.path) as archive:
            members = archive.getmembers()
            regular = {m.name: m for m in members if m.isfile()}
            assert described["num_files"] == len(members) == len(ours.files)
            assert [f["filename"].rstrip("/") for f in files] == [m.name for m in members]
            assert [(f["offset"], f["size"]) for f in files if f["type"] == "reg"] == [
                (m.offset_data, m.size) for m in members if m.isfile()
            ]
            if layer in sympy:  # laid out for the first import, not sorted
                pycs = [f["filename"] for f in files if f["type"] == "reg"]
                pyc = "app/deps-extra/{}/__pycache__/{}.cpython-313.pyc".format
                assert pycs[:2] == [pyc("", "isympy").replace("//", "/"), pyc("sympy", "__init__")]
                # what `import sympy` reads leads; sorted, sympy/abc.py's would come first
                assert pycs.index(pyc("sympy/core", "basic")) < pycs.index(pyc("sympy", "abc"))
            multi = [f for f in files if f["start_span"] != f["end_span"]]
            assert described["num_spans"] == len(ours.checkpoints)
            crossing += len(multi)
            sample = [*multi, *[f for f in files if f["type"] == "reg"][::97]]
            for entry in sample[:SAMPLED] + sample[-1:]:
                out = tmp_path / "file"
                got = node.soci("ztoc", "get-file", "-o", str(out), ztoc, entry["filename"])
                assert got.returncode == 0, got.stderr
                member = archive.extractfile(regular[entry["filename"]])
                assert member is not None and out.read_bytes() == member.read(), entry
    assert crossing


def test_plain_containerd_and_docker_pull_and_run_the_same_image_unchanged(
    node: SociNode, pushed: Pushed, registry: Any, docker_client: Any
) -> None:
    """The index is beside the image, not in it: overlayfs and Docker pull it as any image."""
    reference = f"{registry.host}/{pushed.repository}@{pushed.digest}"
    started = time.monotonic()
    pulled = node.ctr("images", "pull", "--plain-http", "--user", ":".join(node.login), reference)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    ran = node.ctr("run", "-d", "--read-only", "--mount", MOUNT, reference, "plain")
    assert ran.returncode == 0, ran.stderr
    imported = node.ctr(
        "task", "exec", "--exec-id", "first", "plain", "python3", "-c", FIRST_IMPORT
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert json.loads(imported.stdout)["stdout"] == "2*sqrt(2)\n"
    print(f"normal pull to first import: {time.monotonic() - started:.1f} s")
    auth = {"username": registry.user, "password": registry.password}
    image = docker_client.images.pull(reference, auth_config=auth)
    try:
        out = docker_client.containers.run(
            image.id, ["-c", "import sympy; print(sympy.sqrt(8))"], entrypoint="python3",
            remove=True, read_only=True, user="65532:65532",
        )  # fmt: skip
        assert out == b"2*sqrt(2)\n"
    finally:
        docker_client.images.remove(reference, force=True)
