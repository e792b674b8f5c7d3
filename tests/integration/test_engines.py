"""Per-arch engines for real: arm64 built, loaded and verified on a second Docker engine.

The second engine (tests/support/secondengine.py) runs on this amd64 machine, so its arm64 work runs
under its qemu, as on the local engine; what is shown is where each step happens: the arm64
image is in the second engine's image store and not in the default one's (by image id), the
amd64 image the other way round, and the index pushed names both. An engine that cannot be
reached fails the run with one line naming the arch and the URL, before anything is built.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from support.machine import Registry
from support.registryhelp import registry_get, registry_tags, tool

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

RUN = uuid.uuid4().hex[:8]
PREFIX = f"bsi-h1-engines-{RUN}"


def present(client: Any, image_id: str) -> bool:
    try:
        client.images.get(image_id)
    except docker.errors.ImageNotFound:
        return False
    return True


@pytest.fixture(scope="module")
def cache_dir(shared_cache: Path) -> Path:
    """The session's warm cache (conftest): no test here is about a cold one."""
    return shared_cache


class Built:
    def __init__(self, result: subprocess.CompletedProcess[str], context: Path, repo: str) -> None:
        self.result = result
        self.repository = repo
        self.report = json.loads((context / "report.json").read_text())["image"]


def remove_ours(client: Any) -> None:
    """Every tag this module made (the base command's and the build's): by tag, as an image
    another test tagged too (the same base, built by test_multiarch) must stay."""
    for image in client.api.images():  # one listing: other tests remove images meanwhile
        for tag in image.get("RepoTags") or ():
            if PREFIX in tag:
                with contextlib.suppress(docker.errors.ImageNotFound):
                    client.images.remove(tag)


@pytest.fixture(scope="module")
def on_two_engines(
    tmp_path_factory: pytest.TempPathFactory,
    registry: Registry,
    cache_dir: Path,
    two_arch_base: str,
    second_engine: Any,
    docker_client: Any,
) -> Iterator[Built]:
    """A small pure-Python extension for both arches, arm64 on the second engine, pushed."""
    tmp_path = tmp_path_factory.mktemp("engines")
    (tmp_path / "requirements.txt").write_text("six\n")
    repository = f"{registry.host}/{PREFIX}/six"
    second = second_engine.client()
    try:
        result = tool(
            registry, "-r", str(tmp_path / "requirements.txt"), "--base-image", two_arch_base,
            "--output", str(tmp_path / "context"), "--cache-dir", str(cache_dir),
            "--tag", f"{PREFIX}/six:test", "--push", repository,
            "--engine", f"arm64={second_engine.url}",
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        yield Built(result, tmp_path / "context", repository)
    finally:
        for client in (docker_client, second):
            remove_ours(client)
        second.close()


def test_the_arm64_image_is_made_on_its_engine_and_only_there(
    on_two_engines: Built, second_engine: Any, docker_client: Any
) -> None:
    arches = on_two_engines.report["arches"]
    second = second_engine.client()
    try:
        assert present(second, arches["arm64"]["id"])
        assert not present(docker_client, arches["arm64"]["id"])
        assert present(docker_client, arches["amd64"]["id"])
        assert not present(second, arches["amd64"]["id"])
        assert second.images.get(arches["arm64"]["id"]).attrs["Architecture"] == "arm64"
    finally:
        second.close()


def test_each_arch_is_verified_where_it_was_made(on_two_engines: Built, second_engine: Any) -> None:
    out = on_two_engines.result.stdout
    arm64_id = on_two_engines.report["arches"]["arm64"]["id"]
    assert f"verifying arm64 image {arm64_id} hardened on {second_engine.url} ..." in out
    assert "verifying amd64 image sha256:" in out and "hardened ..." in out
    assert "PASS  [arm64] import six" in out and "PASS  [amd64] import six" in out
    for arch in ("amd64", "arm64"):
        assert on_two_engines.report["arches"][arch]["verification"]["passed"] is True


def test_the_index_pushed_holds_both_arches(on_two_engines: Built, registry: Registry) -> None:
    report = on_two_engines.report
    path = on_two_engines.repository.split("/", 1)[1]
    with registry_get(registry, f"/v2/{path}/manifests/{report['index']}") as response:
        index = json.loads(response.read())
    by_arch = {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}
    assert by_arch == {arch: report["arches"][arch]["digest"] for arch in ("amd64", "arm64")}
    for arch, digest in by_arch.items():  # each image by digest is the one made (its config)
        with registry_get(registry, f"/v2/{path}/manifests/{digest}") as response:
            config = json.loads(response.read())["config"]["digest"]
        assert config == report["arches"][arch]["id"]


@pytest.mark.parametrize("url", ["unix:///nonexistent.sock", "tcp://127.0.0.1:1"])
def test_an_unreachable_engine_fails_first_naming_arch_and_url(
    url: str, tmp_path: Path, registry: Registry, standin_index: str
) -> None:
    (tmp_path / "requirements.txt").write_text("six\n")
    repository = f"{registry.host}/{PREFIX}/unreachable"
    result = tool(
        registry, "-r", str(tmp_path / "requirements.txt"),
        "--base-image", standin_index, "--output", str(tmp_path / "context"),
        "--push", repository, "--engine", f"arm64={url}",
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: engine for arm64 at {url} not reachable: "), lines[0]
    assert result.stdout == "", "something was planned or built before the engine was asked"
    assert not (tmp_path / "context").exists()
    assert registry_tags(registry, repository.split("/", 1)[1]) == []


REBUILD_CONFIG = """\
requirements = ["requirements.txt"]
base-repository = "{base}"
platform-version = "{version}"
architectures = ["amd64", "arm64"]
repository = "{repository}"

[engines]
arm64 = "tcp://127.0.0.1:1"
"""


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ((), "tcp://127.0.0.1:1"),
        (("--engine", "arm64=unix:///nonexistent.sock"), "unix:///nonexistent.sock"),
    ],
)
def test_rebuild_reaches_the_configs_engines_first_and_a_flag_wins(
    flags: tuple[str, ...], named: str, tmp_path: Path, registry: Registry, standin_index: str
) -> None:
    base, version = standin_index.rsplit(":", 1)
    repository = f"{registry.host}/{PREFIX}/rebuild"
    config = tmp_path / "bsi.toml"
    config.write_text(REBUILD_CONFIG.format(base=base, version="0.9", repository=repository))
    (tmp_path / "requirements.txt").write_text("six\n")
    before = config.read_text()
    result = tool(
        registry, "rebuild", "--config", str(config), "--platform-version", version, *flags,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: engine for arm64 at {named} not reachable: ")
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert config.read_text() == before and not (tmp_path / "bsi.state.json").exists()
    assert registry_tags(registry, repository.split("/", 1)[1]) == []


def test_rebuild_takes_engine_flags_for_one_config_only(tmp_path: Path, registry: Registry) -> None:
    for name in ("a.toml", "b.toml"):
        (tmp_path / name).write_text("")
    result = tool(
        registry, "rebuild", "--config", str(tmp_path / "a.toml"), "--config",
        str(tmp_path / "b.toml"), "--platform-version", "2", "--engine", "arm64=ssh://h",
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--engine takes one --config: a fleet's configs name [engines]" in result.stderr
