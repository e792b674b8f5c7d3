"""Probing the real base through the engine, and how its facts are compared and judged.

Engine tests probe the stand-in base, a small image derived from it (non-root, PYTHONPATH with
two dirs, an unpackaged library in /usr/local/lib, pushed to the local registry for a digest),
and the reference runtime base; unit tests cover the comparison and the contract checks.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from types import SimpleNamespace
from typing import NamedTuple

import docker
import pytest
from support.waiting import wait_for
from support.wheelfactory import compile_so

from builder.base.probe import PROBE_LABEL, _repo_digest, probe_base
from builder.base.profile import base_problems, profile_differences
from builder.cache import Cache
from builder.engines.connection import engine_client
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.plan.debian import packages_providing
from builder.resolve.target import ARCHES, BaseProfile, shipped_facts

AMD64, ARM64 = ARCHES["amd64"], ARCHES["arm64"]


class Probed(NamedTuple):
    profile: BaseProfile
    cache: Cache
    key: str  # the cache key: the image id's hex


PROBE_CONTAINERS: list[str] = []  # the containers the probe below created (other runs' are not)


def probes_created(client: docker.DockerClient, image: str, since: float) -> set[str]:
    """The probe containers the engine created for `image` from `since` until now, read from
    the engine's own event log (by their label, whose value is the reference probed)."""
    events = client.events(
        since=since,
        until=time.time() + 1,  # the log is read up to a second on: a create at the end counts
        decode=True,
        filters={"type": "container", "event": "create", "label": f"{PROBE_LABEL}={image}"},
    )
    return {event["id"] for event in events}


@pytest.fixture(scope="module")
def standin(docker_client, test_env, tmp_path_factory) -> Probed:
    """The stand-in base probed once into a fresh cache."""
    cache = Cache(tmp_path_factory.mktemp("probe-cache"))
    since = time.time()
    profile = probe_base(ImageRef.parse(test_env["base_image"]), docker_client, cache)
    PROBE_CONTAINERS.extend(probes_created(docker_client, test_env["base_image"], since))
    image_id = docker_client.images.get(test_env["base_image"]).id
    return Probed(profile, cache, image_id.removeprefix("sha256:"))


@pytest.fixture(scope="module")
def derived_image(docker_client, test_env, tmp_path_factory):
    """A non-root image on the stand-in with two PYTHONPATH dirs and an unpackaged library."""
    context = tmp_path_factory.mktemp("derived")
    compile_so(context, "int bsi_probe(void) { return 1; }\n", "lib.so", soname="libbsiprobe.so.1")
    (context / "build" / "lib.so").rename(context / "libbsiprobe.so.1.2.3")
    metadata = "Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    for directory, name, version in (
        ("deps", "Foo_Bar", "1.2"),
        ("extra", "foo.bar", "9.9"),  # shadowed by /app/deps: first on PYTHONPATH wins
        ("extra", "Only-Extra", "0.1"),
    ):
        info = context / directory / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(metadata.format(name=name, version=version))
    (context / "Dockerfile").write_text(
        f"FROM {test_env['base_image']}\n"
        "COPY deps /app/deps\n"
        "COPY extra /app/deps-extra\n"
        "COPY libbsiprobe.so.1.2.3 /usr/local/lib/\n"
        "ENV PYTHONPATH=/app/deps:/app/deps-extra\n"
        "USER 65532:65532\n"
    )
    tag = f"bsi-probe-derived:{uuid.uuid4().hex[:8]}"
    image, _ = docker_client.images.build(path=str(context), tag=tag, rm=True)
    yield tag
    docker_client.images.remove(image.id, force=True)


@pytest.mark.usefixtures("docker_client")
def test_standin_facts(standin):
    profile = standin.profile
    assert profile.python_version.startswith("3.13.")
    assert profile.glibc == "2.41"
    assert profile.user == ""
    assert profile.pythonpath == ""
    assert profile.distributions == {}
    assert profile.digest is None  # imported locally: no registry digest
    assert profile.source.startswith("probed ")
    assert {"libc.so.6", "libssl.so.3", "libffi.so.8", "ld-linux-x86-64.so.2"} <= set(
        profile.sonames["amd64"]
    )
    assert {"libc6", "libssl3t64", "libffi8", "python3"} <= set(profile.packages["amd64"])
    assert profile.packages["arm64"] == profile.packages["amd64"]
    # The stand-in breaks the runtime contract in exactly these two ways.
    problems = base_problems(profile)
    assert len(problems) == 2
    assert "runs as root" in problems[0]
    assert "/app/deps is not on PYTHONPATH" in problems[1]


@pytest.mark.usefixtures("docker_client")
def test_shipped_profile_has_the_standin_libraries(standin):
    """The reference base is built on the stand-in, so its profile lists all of these."""
    assert standin.profile.sonames["amd64"] <= shipped_facts().sonames["amd64"]


@pytest.mark.usefixtures("docker_client")
def test_arm64_is_derived_the_way_amd64_is_observed(standin):
    profile = standin.profile
    arm64 = profile.sonames["arm64"]
    assert {"libc.so.6", "libssl.so.3", "libffi.so.8", "ld-linux-aarch64.so.1"} <= arm64
    assert "ld-linux-x86-64.so.2" not in arm64
    # The same derivation applied to the arch we can run explains everything observed there.
    facts = standin.cache.get_record("probe", standin.key)["facts"]
    explained = packages_providing(profile.packages["amd64"], AMD64) | set(facts["unpackaged"])
    assert profile.sonames["amd64"] <= explained


@pytest.mark.usefixtures("docker_client")
def test_second_probe_uses_the_cache(standin, docker_client, test_env, tmp_path):
    """A probed image id is read back from the cache, not probed again: a record whose facts
    name a library the image lacks gives a profile that names it (a container would not)."""
    profile, cache, key = standin
    record = cache.get_record("probe", key)
    assert record["image_id"] == f"sha256:{key}"
    base = ImageRef.parse(test_env["base_image"])
    assert probe_base(base, docker_client, cache) == profile
    marked = Cache(tmp_path / "marked")
    facts = {**record["facts"], "sonames": [*record["facts"]["sonames"], "libbsi-cached.so.1"]}
    marked.put_record("probe", key, {**record, "facts": facts})
    read_back = probe_base(base, docker_client, marked)
    assert read_back.sonames["amd64"] == profile.sonames["amd64"] | {"libbsi-cached.so.1"}


@pytest.mark.usefixtures("docker_client")
def test_probe_container_is_removed(standin, docker_client):
    """Only the probe's containers count. Another run probing the same base at the same time
    (one the event log also names) removes its own within seconds; one left stays."""
    assert PROBE_CONTAINERS, "the probe created no container"

    def left() -> set[str]:
        # the engine's own listing: docker-py's inspects each container, and one of another
        # test's probes may be gone by then (a 404 for a container that is no concern here)
        listed = docker_client.api.containers(all=True, filters={"label": PROBE_LABEL})
        return {container["Id"] for container in listed} & set(PROBE_CONTAINERS)

    wait_for(lambda: not left(), deadline_s=60, what="the probe's containers removed")


@pytest.mark.usefixtures("docker_client")
def test_missing_image_is_a_user_error(docker_client, tmp_path):
    name = f"bsi-probe-missing-{uuid.uuid4().hex[:8]}:none"
    with pytest.raises(UserError, match=name):
        probe_base(ImageRef.parse(name), docker_client, Cache(tmp_path))


@pytest.mark.usefixtures("docker_client")
def test_derived_image_config_and_unpackaged_library(derived_image, docker_client, tmp_path):
    profile = probe_base(ImageRef.parse(derived_image), docker_client, Cache(tmp_path))
    assert profile.user == "65532:65532"
    assert profile.pythonpath == "/app/deps:/app/deps-extra"
    assert profile.distributions == {"foo-bar": "1.2", "only-extra": "0.1"}
    # Its ELF soname, not its file name; no package ships it, so every arch has it.
    for arch in ("amd64", "arm64"):
        assert "libbsiprobe.so.1" in profile.sonames[arch]
        assert "libbsiprobe.so.1.2.3" not in profile.sonames[arch]
    assert base_problems(profile) == []


@pytest.mark.usefixtures("docker_client")
@pytest.mark.usefixtures("registry")
def test_pushed_image_is_pinned_by_its_registry_digest(
    derived_image, docker_client, registry, tmp_path
):
    repository = f"{registry.host}/bsi-probe-test"
    docker_client.images.get(derived_image).tag(repository, "1")
    auth = {"username": registry.user, "password": registry.password}
    try:
        pushed = [
            line
            for line in docker_client.images.push(
                repository, "1", auth_config=auth, stream=True, decode=True
            )
            if "error" in line or "aux" in line
        ]
        assert all("error" not in line for line in pushed), pushed
        digest = next(line["aux"]["Digest"] for line in pushed if "aux" in line)
        profile = probe_base(ImageRef.parse(f"{repository}:1"), docker_client, Cache(tmp_path))
        assert profile.digest == digest
        # The same image under its local tag has no digest for that repository.
        assert (
            probe_base(ImageRef.parse(derived_image), docker_client, Cache(tmp_path)).digest is None
        )
    finally:
        docker_client.images.remove(f"{repository}:1")


@pytest.mark.usefixtures("docker_client")
def test_reference_base_matches_the_shipped_profile(reference_image, docker_client, tmp_path):
    shipped = shipped_facts()
    profile = probe_base(ImageRef.parse(reference_image), docker_client, Cache(tmp_path))
    assert profile.python_version == shipped.python_version
    assert profile.distributions == shipped.distributions
    assert profile.sonames["amd64"] >= shipped.sonames["amd64"]
    assert base_problems(profile) == []


def test_engine_client_is_none_quickly_without_an_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    started = time.monotonic()
    assert engine_client() is None
    assert time.monotonic() - started < 60  # not the API's 300 s timeout; 60: a busy machine


def test_repo_digest_matches_the_repository():
    digest = "sha256:" + "a" * 64
    other = "sha256:" + "b" * 64

    def image(*repo_digests: str) -> SimpleNamespace:
        return SimpleNamespace(attrs={"RepoDigests": list(repo_digests)})

    assert (
        _repo_digest(ImageRef.parse("python:3.13-slim-trixie"), image(f"python@{digest}")) == digest
    )
    assert (
        _repo_digest(ImageRef.parse("docker.io/library/python:3.13"), image(f"python@{digest}"))
        == digest
    )
    assert (
        _repo_digest(
            ImageRef.parse("127.0.0.1:5000/rt:1"),
            image(f"mirror/rt@{other}", f"127.0.0.1:5000/rt@{digest}"),
        )
        == digest
    )
    assert _repo_digest(ImageRef.parse("local-build:1"), image()) is None
    assert _repo_digest(ImageRef.parse("renamed:1"), image(f"python@{digest}")) is None
    assert _repo_digest(ImageRef.parse(f"python@{other}"), image(f"python@{digest}")) == other


def _profile(**changes) -> BaseProfile:
    base = BaseProfile(
        reference=ImageRef.parse("runtime:1"),
        python_version="3.13.5",
        glibc="2.41",
        user="65532:65532",
        pythonpath="/app/deps",
        distributions={"pandas": "3.1.1", "requests": "2.34.2", "idna": "3.20"},
        sonames={
            "amd64": frozenset({"libc.so.6", "libstdc++.so.6"}),
            "arm64": frozenset({"libc.so.6", "libstdc++.so.6"}),
        },
    )
    return dataclasses.replace(base, **changes)


def test_identical_profiles_have_no_differences():
    assert profile_differences(_profile(), _profile(source="probed abc")) == []


def test_differences_name_what_changed():
    many = frozenset(f"libx{i}.so.1" for i in range(8))
    probed = _profile(
        python_version="3.13.7",
        user="",
        pythonpath="/app/deps:/opt/more",
        distributions={"pandas": "3.2.0", "requests": "2.34.2", "numpy": "2.5.5"},
        sonames={
            "amd64": frozenset({"libc.so.6"}) | many,
            "arm64": frozenset({"libc.so.6", "libstdc++.so.6"}),
        },
    )
    lines = profile_differences(_profile(), probed)
    text = "\n".join(lines)
    assert "python: 3.13.7 (shipped profile says 3.13.5)" in lines
    assert "user: root (shipped profile says 65532:65532)" in lines
    assert "PYTHONPATH: /app/deps:/opt/more (shipped profile says /app/deps)" in lines
    assert "distributions only in the base: numpy==2.5.5" in lines
    assert "distributions missing from the base: idna==3.20" in lines
    assert "distributions at other versions: pandas 3.2.0 (shipped 3.1.1)" in lines
    assert "amd64: 1 soname (libstdc++.so.6) of the shipped profile missing" in lines
    assert (
        "amd64: 8 sonames (libx0.so.1, libx1.so.1, libx2.so.1, libx3.so.1, libx4.so.1, …)" in text
    )
    assert "glibc" not in text and "arm64" not in text


@pytest.mark.parametrize("user", ["", "0", "root", "0:0", "root:root"])
def test_root_user_is_a_problem(user):
    assert [p for p in base_problems(_profile(user=user)) if "runs as root" in p]


def test_contract_problems():
    assert base_problems(_profile()) == []
    assert base_problems(_profile(pythonpath="/app/deps-extra:/app/deps")) == []
    problems = base_problems(
        _profile(pythonpath="/app/deps-extra", python_version="3.12.9", glibc="2.36")
    )
    assert problems == [
        "runtime:1: /app/deps is not on PYTHONPATH (/app/deps-extra)",
        "runtime:1: python is 3.12.9, not 3.13",
        "runtime:1: glibc is 2.36, not 2.41",
    ]
