"""`--cache-from REF`: a fresh runner's build seeded by the registry (issue 57 item 1).

Tiny pure wheels from a local wheelhouse (`--no-index`: no network), one arch, on the
reference base, pushed to the local registry. A first build pushes; a second one, with an
empty cache directory and `--cache-from` that image, one distribution added, reuses the two
others (their inspections and layers; bytecode is always compiled: report.json and the
summary say so), mounts the first push's blobs, passes verification and pushes the image a
cold build of the same set pushes. A cache image whose only facts attachment is not the one
its label names, whose manifest names another blob for a layer, or whose config, facts and
layer agree with each other but not with the wheel, is not trusted: a warning, and the same
image as the cold build; a facts attachment added beside the labelled one is ignored. An
absent or unreachable REF is a warning."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from docker.errors import APIError
from support.images import local_images
from support.machine import Registry
from support.wheelfactory import make_wheel

from builder.oci.auth import Credentials
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import Attachment, attached_document, referrers
from builder.oci.remote import attach, read
from builder.oci.v1 import Descriptor, Image, canonical, digest_of
from builder.publish.build_facts import FACTS_LABEL, FACTS_TYPE

pytestmark = pytest.mark.usefixtures("docker_client", "registry")

RUN = uuid.uuid4().hex[:8]
PURE = "py3-none-any"
ALL = ("alpha", "beta", "gamma")


@dataclass
class Build:
    report: dict[str, Any]
    stdout: str
    seconds: float

    @property
    def digest(self) -> str:
        return str(self.report["image"]["digest"])

    def layers(self) -> dict[str, str]:
        """distribution -> the diff ID of its own layer."""
        stack = self.report["architectures"]["amd64"]["extras_layers"]
        return {
            one["distributions"][0]: one["diff_id"]
            for one in stack
            if one["kind"] == "distribution" and len(one["distributions"]) == 1
        }


@pytest.fixture(scope="module", autouse=True)
def _images_removed(docker_client: Any) -> Iterator[None]:
    """The module's local tags (bsi-cache-from-RUN/...) removed when it ends, and the images
    only they kept: every build here tags one, and a rerun must not pile them up."""
    yield
    for image_id, tags in local_images(docker_client):
        if tags and all(tag.startswith(f"bsi-cache-from-{RUN}/") for tag in tags):
            with contextlib.suppress(APIError):  # gone already: another cleanup's
                docker_client.images.remove(image_id, force=True)


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheelhouse of three tiny pure distributions."""
    where = tmp_path_factory.mktemp("house")
    for name in ("alpha", "beta", "gamma"):
        body = f"VALUE = {name!r}\n".encode() * 50
        make_wheel(where, f"bsi-{name}", "1.0", PURE, {f"bsi_{name}/__init__.py": body})
    return where


def build(
    registry: Registry,
    base: str,
    work: Path,
    house: Path,
    names: tuple[str, ...],
    repository: str,
    *flags: str,
    verify: bool = False,
) -> Build:
    """A build of `names` from the wheelhouse, pushed to `repository` (empty: not built),
    verified only when `verify` says so."""
    work.mkdir(parents=True)
    (work / "requirements.txt").write_text("".join(f"bsi-{name}==1.0\n" for name in names))
    env = {
        **os.environ,
        "BSI_REGISTRY_USER": registry.user,
        "BSI_REGISTRY_PASSWORD": registry.password,
    }
    push = ("--push", repository) if repository else ("--no-build",)
    flags = flags if verify else ("--no-verify", *flags)
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(work / "requirements.txt"),
         "--no-index", "--find-links", str(house), "--arch", "amd64",
         "--base-image", base, "--tag", f"bsi-cache-from-{RUN}/{work.name}:test",
         "--output", str(work / "context"), "--cache-dir", str(work / "cache"),
         "--no-soci", *push, *flags],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    seconds = time.monotonic() - began
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((work / "context" / "report.json").read_text())
    return Build(report, result.stdout + result.stderr, seconds)


def client_of(registry: Registry, repository: str) -> RepositoryClient:
    ref = ImageRef.parse(f"{repository}:x")
    return RepositoryClient(ref, credentials=Credentials(registry.user, registry.password, "test"))


@dataclass
class Pushed:
    repository: str
    build: Build

    @property
    def ref(self) -> str:
        return f"{self.repository}@{self.build.digest}"


@pytest.fixture(scope="module")
def first(
    registry: Registry, reference_image: str, house: Path, tmp_path_factory: pytest.TempPathFactory
) -> Pushed:
    repository = f"{registry.host}/bsi-cache-from-{RUN}/first"
    work = tmp_path_factory.mktemp("first") / "run"
    return Pushed(
        repository, build(registry, reference_image, work, house, ("alpha", "beta"), repository)
    )


@pytest.fixture(scope="module")
def cold(
    registry: Registry,
    reference_image: str,
    first: Pushed,
    house: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Build:
    """The three distributions built cold: what every seeded build must push too."""
    repository = f"{registry.host}/bsi-cache-from-{RUN}/cold"
    work = tmp_path_factory.mktemp("cold") / "run"
    return build(registry, reference_image, work, house, ALL, repository)


def test_the_pushed_image_carries_the_facts_its_label_names(
    registry: Registry, first: Pushed
) -> None:
    client = client_of(registry, first.repository)
    image = read(client, first.build.digest)
    assert isinstance(image, Image)
    label = image.config_file.labels[FACTS_LABEL]
    documents = [
        attached_document(client, one)
        for one in referrers(client, image.digest)
        if one.artifact_type == FACTS_TYPE
    ]
    assert [digest_of(one) for one in documents] == [label]
    facts = json.loads(documents[0])
    assert len(facts["wheels"]) == 2
    assert {one["diff_id"] for one in facts["layers"]} <= set(image.diff_ids)


def test_a_fresh_runner_reuses_what_the_registry_holds(
    registry: Registry,
    reference_image: str,
    first: Pushed,
    cold: Build,
    house: Path,
    tmp_path: Path,
) -> None:
    repository = f"{registry.host}/bsi-cache-from-{RUN}/warm"
    warm = build(
        registry, reference_image, tmp_path / "warm", house, ALL, repository,
        "--cache-from", first.ref, verify=True,
    )  # fmt: skip
    assert "checks passed" in warm.stdout  # verified, and pushed as verified
    record = warm.report["cache_from"]
    assert (record["reused"], record["distributions"]) == (2, 3)
    assert "compiled" not in record  # bytecode is always compiled here
    assert f"reused 2 of 3 distributions from {first.ref}" in warm.stdout
    assert "warning" not in warm.stdout.lower()
    before, after = first.build.layers(), warm.layers()
    assert {name: after[name] for name in before} == before  # the same layers for the others
    assert warm.digest == cold.digest  # the image a cold build pushes
    pushed = next(line for line in warm.stdout.splitlines() if line.startswith("push: "))
    assert " 0 kB mounted" not in pushed, pushed  # REF's blobs mounted, not uploaded again
    print(f"\ncold {cold.seconds:.1f} s; fresh runner, --cache-from, verified {warm.seconds:.1f} s")


def _copy(
    registry: Registry, source: Pushed, name: str, layers: list[Descriptor]
) -> RepositoryClient:
    """`source`'s image (config as it is, `layers` for its layers) put into a new repository;
    its client."""
    target = client_of(registry, f"{registry.host}/bsi-cache-from-{RUN}/{name}")
    original = read(client_of(registry, source.repository), source.build.digest)
    assert isinstance(original, Image)
    path = source.repository.split("/", 1)[1]
    for blob in (original.config_descriptor, *original.layers):
        assert target.mount(blob.digest, path)
    image = Image.build(original.config_bytes, layers)
    target.put_manifest(image.digest, image.manifest_bytes, image.media_type)
    target.put_manifest("cache", image.manifest_bytes, image.media_type)
    return target


def test_a_facts_attachment_not_the_labelled_one_is_not_trusted(
    registry: Registry,
    reference_image: str,
    first: Pushed,
    cold: Build,
    house: Path,
    tmp_path: Path,
) -> None:
    original = read(client_of(registry, first.repository), first.build.digest)
    assert isinstance(original, Image)
    target = _copy(registry, first, "tampered-facts", list(original.layers))
    source = client_of(registry, first.repository)
    kept = next(r for r in referrers(source, original.digest) if r.artifact_type == FACTS_TYPE)
    facts = json.loads(attached_document(source, kept))
    for record in facts["wheels"].values():
        record["top_level"] = ["os"]  # a lie the plan would act on
    tampered = json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()
    attach(target, original.descriptor(), [Attachment(FACTS_TYPE, tampered)])
    ref = f"{target.ref.registry}/{target.ref.repository}:cache"
    repository = f"{registry.host}/bsi-cache-from-{RUN}/after-facts"
    seeded = build(
        registry, reference_image, tmp_path / "seeded", house, ALL, repository,
        "--cache-from", ref,
    )  # fmt: skip
    assert f"warning: --cache-from {ref}:" in seeded.stdout
    assert "not trusted" in seeded.stdout
    assert seeded.digest == cold.digest


def test_a_facts_attachment_someone_added_beside_the_labelled_one_is_ignored(
    registry: Registry,
    reference_image: str,
    first: Pushed,
    cold: Build,
    house: Path,
    tmp_path: Path,
) -> None:
    source = client_of(registry, first.repository)
    original = read(source, first.build.digest)
    assert isinstance(original, Image)
    target = _copy(registry, first, "extra-facts", list(original.layers))
    kept = next(r for r in referrers(source, original.digest) if r.artifact_type == FACTS_TYPE)
    genuine = attached_document(source, kept)
    facts = json.loads(genuine)
    for record in facts["wheels"].values():
        record["top_level"] = ["os"]
    added = Attachment(FACTS_TYPE, json.dumps(facts, sort_keys=True).encode())
    attach(target, original.descriptor(), [added, Attachment(FACTS_TYPE, genuine)])
    ref = f"{target.ref.registry}/{target.ref.repository}:cache"
    repository = f"{registry.host}/bsi-cache-from-{RUN}/after-extra"
    seeded = build(
        registry, reference_image, tmp_path / "seeded", house, ALL, repository,
        "--cache-from", ref,
    )  # fmt: skip
    assert "warning" not in seeded.stdout.lower()
    assert seeded.report["cache_from"]["reused"] == 2  # from the labelled document alone
    assert seeded.digest == cold.digest


def test_a_layer_not_the_one_its_config_names_is_not_trusted(
    registry: Registry,
    reference_image: str,
    first: Pushed,
    cold: Build,
    house: Path,
    tmp_path: Path,
) -> None:
    source = client_of(registry, first.repository)
    original = read(source, first.build.digest)
    assert isinstance(original, Image)
    alpha = first.build.layers()["bsi-alpha"]
    index = list(original.diff_ids).index(alpha)
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        data = b"VALUE = 'tampered'\n"
        info = tarfile.TarInfo("app/deps-extra/bsi_alpha/__init__.py")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    blob = gzip.compress(tar.getvalue(), mtime=0)
    target = client_of(registry, f"{registry.host}/bsi-cache-from-{RUN}/tampered-layer")
    target.upload_blob(blob, digest_of(blob))
    layers = list(original.layers)
    layers[index] = Descriptor(layers[index].media_type, digest_of(blob), len(blob))
    target = _copy(registry, first, "tampered-layer", layers)
    image = read(target, "cache")
    kept = next(r for r in referrers(source, original.digest) if r.artifact_type == FACTS_TYPE)
    attach(target, image.descriptor(), [Attachment(FACTS_TYPE, attached_document(source, kept))])
    ref = f"{target.ref.registry}/{target.ref.repository}:cache"
    repository = f"{registry.host}/bsi-cache-from-{RUN}/after-layer"
    seeded = build(
        registry, reference_image, tmp_path / "seeded", house, ALL, repository,
        "--cache-from", ref,
    )  # fmt: skip
    assert f"warning: --cache-from {ref}: layer {alpha[:19]} is not trusted" in seeded.stdout
    assert seeded.report["cache_from"]["reused"] == 1  # beta's layer was the image's own
    assert seeded.digest == cold.digest


def test_a_forged_but_consistent_cache_image_is_not_trusted(
    registry: Registry,
    reference_image: str,
    first: Pushed,
    cold: Build,
    house: Path,
    tmp_path: Path,
) -> None:
    """REF's pusher controls its config: a layer named by the config's diff IDs and the facts
    its label pins alike, but not what the wheel installs, is still not taken."""
    source = client_of(registry, first.repository)
    original = read(source, first.build.digest)
    assert isinstance(original, Image)
    alpha = first.build.layers()["bsi-alpha"]
    index = list(original.diff_ids).index(alpha)
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w", format=tarfile.PAX_FORMAT) as archive:
        data = b"import os; os.system('id')\n"
        info = tarfile.TarInfo("app/deps-extra/bsi_alpha/__init__.py")
        info.size, info.mode = len(data), 0o644
        archive.addfile(info, io.BytesIO(data))
    forged_tar = tar.getvalue()
    forged = digest_of(forged_tar)
    blob = gzip.compress(forged_tar, mtime=0)
    target = client_of(registry, f"{registry.host}/bsi-cache-from-{RUN}/forged")
    target.upload_blob(blob, digest_of(blob))
    kept = next(r for r in referrers(source, original.digest) if r.artifact_type == FACTS_TYPE)
    facts = json.loads(attached_document(source, kept))
    for one in facts["layers"]:
        if one["diff_id"] == alpha:
            one["diff_id"], one["size"] = forged, len(forged_tar)
    document = canonical(facts)
    config = json.loads(original.config_bytes)
    config["rootfs"]["diff_ids"][index] = forged
    config["config"]["Labels"][FACTS_LABEL] = digest_of(document)
    config_bytes = canonical(config)
    target.upload_blob(config_bytes, digest_of(config_bytes))
    path = first.repository.split("/", 1)[1]
    for layer in original.layers:
        assert target.mount(layer.digest, path)
    layers = list(original.layers)
    layers[index] = Descriptor(layers[index].media_type, digest_of(blob), len(blob))
    image = Image.build(config_bytes, layers)
    target.put_manifest("cache", image.manifest_bytes, image.media_type)
    attach(target, image.descriptor(), [Attachment(FACTS_TYPE, document)])
    ref = f"{target.ref.registry}/{target.ref.repository}:cache"
    repository = f"{registry.host}/bsi-cache-from-{RUN}/after-forged"
    seeded = build(
        registry, reference_image, tmp_path / "seeded", house, ALL, repository,
        "--cache-from", ref,
    )  # fmt: skip
    warning = f"warning: --cache-from {ref}: layer {forged[:19]} is not trusted"
    assert warning in seeded.stdout
    assert "not the layer of bsi_alpha-1.0-py3-none-any.whl" in seeded.stdout
    assert seeded.report["cache_from"]["reused"] == 1  # beta's layer was the image's own
    assert seeded.digest == cold.digest


def test_an_absent_or_unreachable_cache_image_is_a_warning(
    registry: Registry, reference_image: str, first: Pushed, house: Path, tmp_path: Path
) -> None:
    absent = f"{registry.host}/bsi-cache-from-{RUN}/never-pushed:latest"
    unreachable = "127.0.0.1:9/bsi/nowhere:latest"
    planned = build(
        registry, reference_image, tmp_path / "plan", house, ("alpha",), "",
        "--cache-from", absent, "--cache-from", unreachable,
    )  # fmt: skip
    assert f"warning: --cache-from {absent}:" in planned.stdout
    assert f"warning: --cache-from {unreachable}:" in planned.stdout
    assert planned.report["cache_from"]["reused"] == 0
