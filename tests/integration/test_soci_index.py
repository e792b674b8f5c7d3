"""Which layers of an image get a ztoc, the reuse of ztocs by blob digest, `soci = false`,
verify's reading of an attached index, and the reference base pushed with its own index."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from support.machine import Registry as LocalRegistry
from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.config import RunSettings, load_config, merge, settings_of
from builder.errors import UserError
from builder.files import sha256_of
from builder.layers import soci as soci_module
from builder.layers.gzipped import gzipped, spans_of
from builder.layers.layer import LayerWheels, wheels_layer
from builder.layers.soci import attached_index_problems, base_ztocs, soci_index, soci_record
from builder.oci.auth import Credentials
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import Attachment, referrers
from builder.oci.remote import Blobs, LocalFile, attach, resolve, write
from builder.oci.v1 import DOCKER_LAYER, Descriptor, Image, Index, Platform, digest_of
from builder.oci.ztoc import SOCI_INDEX, LayerZtoc, SociIndex, ztoc_bytes

SIZE = 9 << 20  # a layer of three spans (builder.layers.gzipped.SPAN: 4 MiB of tar)
REFERENCE = ImageRef.parse("python:3.13-slim-trixie")
CONFIG = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'


def tool_layer(tmp_path: Path, cache: Cache, name: str, size: int) -> Descriptor:
    """A layer the tool writes and gzips: a wheel holding `size` incompressible bytes."""
    files = {f"{name}/__init__.py": b"", f"{name}/data.bin": os.urandom(size)}
    wheel = make_wheel(tmp_path / name, name, "1.0", "py3-none-any", files, top_level=[name])
    layer = wheels_layer(LayerWheels(((sha256_of(wheel), wheel),)), "/app/deps-extra", cache)
    blob = gzipped(layer.path, layer.diff_id, cache)
    return Descriptor(DOCKER_LAYER, blob.digest, blob.size)


@pytest.fixture(scope="module")
def layers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cache, list[Descriptor]]:
    tmp_path = tmp_path_factory.mktemp("layers")
    cache = Cache(tmp_path / "cache")
    large = tool_layer(tmp_path, cache, "large", SIZE)
    small = tool_layer(tmp_path, cache, "small", 1024)
    foreign = Descriptor(DOCKER_LAYER, "sha256:" + "f" * 64, 50 << 20)  # the base's: no record
    return cache, [foreign, large, small]


def test_every_layer_the_tool_gzipped_gets_a_ztoc(layers: tuple[Cache, list[Descriptor]]) -> None:
    """However small: a layer the index leaves out is fetched whole before the container
    starts; only the base's layer this cache never gzipped (and no base index lends) has none."""
    cache, descriptors = layers
    foreign, large, small = descriptors
    image = Image.build(CONFIG, descriptors)
    index = soci_index(image, cache)
    assert index is not None
    assert [one.layer for one in index.ztocs] == [large, small]
    record = soci_record(image, index)
    assert [one.layer for one in record.ztocs] == [large.digest, small.digest]
    assert record.index == digest_of(index.manifest(image.descriptor()))
    assert record.normal_pull_bytes == sum(d.size for d in descriptors)
    sizes = [len(one.ztoc) for one in index.ztocs]
    assert record.lazy_before_mount_bytes == foreign.size + sum(sizes)
    assert record.to_dict()["ztocs"] == [
        {"layer": one.layer.digest, "ztoc": digest_of(one.ztoc), "size": size}
        for one, size in zip(index.ztocs, sizes, strict=True)
    ]
    assert soci_index(Image.build(CONFIG, [foreign]), cache) is None
    assert record.lazy_first_import_bytes is None  # not verified: what the import reads is unknown


def test_the_first_import_fetches_the_spans_of_what_it_read(
    layers: tuple[Cache, list[Descriptor]],
) -> None:
    """report.json's first-import bytes: before the mount, and each span of a file read."""
    cache, descriptors = layers
    _, large, small = descriptors
    image = Image.build(CONFIG, descriptors)
    index = soci_index(image, cache)
    before = soci_record(image, index).lazy_before_mount_bytes

    def first_import(*paths: str) -> int:
        found = soci_record(image, index, paths).lazy_first_import_bytes
        assert found is not None
        return found

    assert first_import("/app/deps-extra/large/__init__.py") == before  # empty: no span
    big = first_import("/app/deps-extra/large/data.bin")  # random bytes: every span of it
    assert before + large.size * 0.9 < big <= before + large.size
    both = first_import("/app/deps-extra/large/data.bin", "/app/deps-extra/small/data.bin")
    assert big < both <= big + small.size
    assert first_import("/nowhere", "/app/deps-extra/large/data.bin") == big


def test_a_second_image_with_the_layer_reuses_its_ztoc(
    layers: tuple[Cache, list[Descriptor]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebase or another template pushing the same layer: the ztoc comes from the cache."""
    cache, descriptors = layers
    first = soci_index(Image.build(CONFIG, descriptors), cache)

    def never(*_: object) -> bytes:
        raise AssertionError("the ztoc was written again")

    monkeypatch.setattr(soci_module, "ztoc_bytes", never)
    again = soci_index(Image.build(CONFIG, descriptors[1:]), cache)  # a rebased image
    assert first is not None and again is not None
    assert again.ztocs == first.ztocs


def test_soci_is_on_unless_the_config_or_the_flag_turns_it_off(tmp_path: Path) -> None:
    path = tmp_path / "bsi.toml"
    base = 'requirements = ["r.txt"]\nbase-repository = "reg.example/rt"\nplatform-version = "1"\n'
    path.write_text(base)
    assert load_config(path).soci is True
    path.write_text(base + "soci = false\n")
    config = load_config(path)
    assert config.soci is False
    flags = RunSettings((Path("r.txt"),), REFERENCE)
    assert merge(flags, config, output_given=False, base_given=False).soci is False
    path.write_text(base)
    off = RunSettings((), REFERENCE, soci=False)
    assert merge(off, load_config(path), output_given=False, base_given=False).soci is False
    assert settings_of(load_config(path)).soci is True  # a rebuild: the config's
    path.write_text(base + 'soci = "no"\n')
    with pytest.raises(UserError, match="'soci' must be true or false"):
        load_config(path)


def test_verify_reads_the_attached_index_back_and_finds_a_ztoc_of_another_layer(
    registry: LocalRegistry,
    layers: tuple[Cache, list[Descriptor]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Pushed with its index beside an SBOM (listed in the fallback index), the image checks
    clean; an index whose ztoc describes another layer under this layer's digest does not, and
    an image on it as a base never reuses that ztoc."""
    cache, descriptors = layers
    large = descriptors[1]
    repository = f"{registry.host}/bsi-soci-{uuid.uuid4().hex[:8]}/app"
    target = RepositoryClient(
        ImageRef.parse(f"{repository}:x"),
        credentials=Credentials(registry.user, registry.password, "test"),
    )
    image = Image.build(CONFIG, [large])
    blob = cache.find_blob(large.digest.removeprefix("sha256:"), "layer.tar.gz")
    assert blob is not None
    index = soci_index(image, cache)
    assert index is not None
    sbom = Attachment("application/vnd.cyclonedx+json", b"{}")
    attached = {image.digest: (sbom, index)}
    write(
        target, [image], Blobs({large.digest: LocalFile(blob)}), tags=["v1"], attachments=attached
    )
    kinds = [one.artifact_type for one in referrers(target, image.digest)]
    assert kinds == ["application/vnd.cyclonedx+json", SOCI_INDEX]
    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)  # how verify logs in
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
    reference = ImageRef.parse(f"{repository}:v1")
    found = attached_index_problems(reference)
    assert found == (digest_of(index.manifest(image.descriptor())), [])
    small = descriptors[2]  # another layer's ztoc, claimed for the large one
    other = LayerZtoc(large, ztoc_bytes(*_blob_spans(cache, small.digest)))
    attach(target, image.descriptor(), [SociIndex((other,))])
    found = attached_index_problems(reference)
    assert found is not None and found[1]
    assert any("file table differs" in line or "size" in line for line in found[1])
    # as another machine's base: the right ztoc is lent, the other layer's never
    elsewhere = Cache(tmp_path / "elsewhere")
    assert base_ztocs(reference, image, elsewhere) == {large.digest: index.ztocs[0].ztoc}
    # a base that carries only the wrong one lends nothing, and says so from the cache next time
    lone = ImageRef.parse(f"{registry.host}/bsi-soci-{uuid.uuid4().hex[:8]}/base:1")
    lone_target = RepositoryClient(
        lone, credentials=Credentials(registry.user, registry.password, "test")
    )
    write(lone_target, [image], Blobs({large.digest: LocalFile(blob)}), tags=["1"])
    attach(lone_target, image.descriptor(), [SociIndex((other,))])
    assert base_ztocs(lone, image, elsewhere) == {}

    def never(*_: object) -> bool:
        raise AssertionError("the refused ztoc was checked again")

    monkeypatch.setattr(soci_module, "_is_our_ztoc", never)
    assert base_ztocs(lone, image, elsewhere) == {}


def test_verify_checks_the_index_of_every_arch_image_an_index_names(
    registry: LocalRegistry,
    layers: tuple[Cache, list[Descriptor]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node of each arch reads its own image's SOCI index: verify of the multi-arch tag
    checks both, and names the arch whose index is wrong."""
    cache, (_, large, small) = layers
    amd64 = Image.build(CONFIG, [large])
    arm64 = Image.build(CONFIG.replace(b"amd64", b"arm64"), [small])
    index = Index.build([(Platform.linux("amd64"), amd64), (Platform.linux("arm64"), arm64)])
    own = {image.digest: soci_index(image, cache) for image in (amd64, arm64)}
    ref = ImageRef.parse(f"{registry.host}/bsi-soci-{uuid.uuid4().hex[:8]}/multi:1")
    target = RepositoryClient(ref, credentials=Credentials(registry.user, registry.password, "t"))
    blobs = Blobs(
        {one.digest: LocalFile(_blob_spans(cache, one.digest)[0]) for one in (large, small)}
    )
    attached = {digest: (found,) for digest, found in own.items() if found is not None}
    write(target, [amd64, arm64], blobs, index=index, tags=["1"], attachments=attached)
    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
    found = attached_index_problems(ref)
    assert found is not None and found[1] == []
    amd, arm = f"[{Platform.linux('amd64')}]", f"[{Platform.linux('arm64')}]"
    assert found[0].count(f"{amd} sha256:") == 1 and found[0].count(f"{arm} sha256:") == 1
    wrong = LayerZtoc(small, ztoc_bytes(*_blob_spans(cache, large.digest)))
    attach(target, arm64.descriptor(), [SociIndex((wrong,))])  # only the arm64 image's
    found = attached_index_problems(ref)
    assert found is not None and found[1]
    assert all(line.startswith(f"{arm} {small.digest}: ") for line in found[1]), found
    # an arch without an index beside one with: its nodes pull it whole, and verify says so
    bare = RepositoryClient(
        ImageRef.parse(f"{registry.host}/bsi-soci-{uuid.uuid4().hex[:8]}/half:1"),
        credentials=Credentials(registry.user, registry.password, "t"),
    )
    half = {amd64.digest: attached[amd64.digest]}
    write(bare, [amd64, arm64], blobs, index=index, tags=["1"], attachments=half)
    found = attached_index_problems(bare.ref)
    assert found is not None and f"{amd} sha256:" in found[0]
    assert found[1] == [f"{arm} no SOCI index attached: a lazy node pulls it whole"]


def _blob_spans(cache: Cache, digest: str) -> tuple[Path, int, tuple[int, ...]]:
    blob = spans_of(digest, cache)
    assert blob is not None
    return blob.path, blob.span_size, blob.spans


def test_base_tag_pushes_the_reference_base_with_an_index_of_its_own_layers(
    registry: LocalRegistry,
    reference_image: str,
    shared_cache: Path,
    test_env: dict,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`base --tag` (one arch here) saves and gzips the base's layers itself: each one gets
    a ztoc, the SBOM and provenance beside the index, and the pushed base checks clean; an
    image on it built from another cache reuses its ztocs through that index."""
    from builder.orchestration.reference_base import build_base_index

    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
    ref = ImageRef.parse(f"{registry.host}/bsi-soci-{uuid.uuid4().hex[:8]}/runtime:1.0")
    base = ImageRef.parse(test_env["base_image"])
    cache = Cache(shared_cache)  # reference_image warmed BuildKit: the build takes seconds
    pushed = build_base_index(ref, ("amd64",), base_image=base, cache=cache)
    client = RepositoryClient(ref, credentials=Credentials(registry.user, registry.password, "t"))
    image = resolve(client, Platform.linux("amd64"), pushed.digest)
    kinds = [one.artifact_type for one in referrers(client, image.digest)]
    assert SOCI_INDEX in kinds and "application/vnd.cyclonedx+json" in kinds
    every = {layer.digest for layer in image.layers}
    assert all(spans_of(digest, cache) for digest in every)  # gzipped by the push
    found = attached_index_problems(ref.with_tag(None).with_digest(image.digest))
    assert found is not None and found[1] == []
    index = soci_index(image, cache)
    assert index is not None and {one.layer.digest for one in index.ztocs} == every
    assert found[0] == digest_of(index.manifest(image.descriptor()))
    # another machine's cache holds none of these blobs: the base's own index lends its ztocs
    pinned = ref.with_tag(None).with_digest(pushed.digest)
    elsewhere = Cache(tmp_path / "elsewhere")
    lent = base_ztocs(pinned, image, elsewhere)
    assert soci_index(image, elsewhere, lent) == index
    no_such = pinned.with_digest("sha256:" + "0" * 64)
    assert base_ztocs(no_such, image, Cache(tmp_path / "third")) == {}
    # base --no-soci: the same base, its SBOM and provenance, and no index
    plain = ImageRef.parse(f"{registry.host}/bsi-soci-{uuid.uuid4().hex[:8]}/runtime:1.0")
    again = build_base_index(plain, ("amd64",), base_image=base, cache=cache, soci=False)
    plain_client = RepositoryClient(
        plain, credentials=Credentials(registry.user, registry.password, "t")
    )
    plain_image = resolve(plain_client, Platform.linux("amd64"), again.digest)
    kinds = [one.artifact_type for one in referrers(plain_client, plain_image.digest)]
    assert SOCI_INDEX not in kinds and "application/vnd.cyclonedx+json" in kinds
