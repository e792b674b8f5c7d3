"""A system stage built before from the same inputs is the image it built, without `docker build`,
only while the engine still holds that image; a changed Dockerfile, base or engine builds again.
No engine: its images are a dict, `docker build` a function that records it ran."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import docker.errors
import pytest

from builder.assemble.build import BuildSpec
from builder.cache import Cache
from builder.engines.connection import Engine
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.orchestration import produce_build
from builder.orchestration.produce_build import SystemStages

BASE = "reg.example/runtime:1"
APT = "FROM ${BASE_IMAGE} AS system\nRUN apt-get install -y libgomp1\n"


class Images:
    """The engine's images by id or tag, as `client.api.inspect_image` answers for them."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, str]] = {
            BASE: {"Id": "sha256:base1", "Architecture": "amd64"}
        }

    def inspect_image(self, name: str) -> dict[str, str]:
        if name not in self.held:
            raise docker.errors.ImageNotFound(name)
        return self.held[name]


class World:
    """One engine and the builds it ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.images = Images()
        self.builds: list[str] = []  # the Dockerfile of each `docker build`
        engine = Engine(cast(Any, SimpleNamespace(api=self.images)), "amd64")
        self.engines: Any = SimpleNamespace(for_arch=lambda arch: engine)
        monkeypatch.setattr(produce_build, "build_image", self.build)
        monkeypatch.setattr(produce_build, "dockerfile", lambda plan, secrets: plan.text)
        monkeypatch.setattr(produce_build, "base_logins", lambda reference: None)

    def build(self, context: Path, spec: BuildSpec, log: Any, started: Any = None) -> str:
        self.builds.append((context / "Dockerfile").read_text())
        image = f"sha256:built{len(self.builds)}"
        self.images.held[image] = {"Id": image, "Architecture": "amd64"}
        return image

    def stage(
        self, cache: Cache | None, text: str = APT, secrets: dict[str, Path] | None = None
    ) -> tuple[str | None, str]:
        """The amd64 stage's image id and its log, from a fresh SystemStages (a new run)."""
        plan: Any = SimpleNamespace(
            text=text,
            arches=(SimpleNamespace(arch="amd64", apt_packages=()),),
            base_reference=ImageRef.parse(BASE),
            base_image=BASE,
        )
        log = io.StringIO()
        with SystemStages(secrets or {}, self.engines, cache) as stages:
            stages.start(plan)
            return stages.built("amd64", log), log.getvalue()


def test_a_rerun_keeps_the_stage_image_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, cache = World(monkeypatch), Cache(tmp_path / "cache")
    first, _ = world.stage(cache)
    again, log = world.stage(cache)
    assert again == first == "sha256:built1"
    assert len(world.builds) == 1, "the unchanged stage was built again"
    assert "system stage unchanged" in log


def test_an_engine_that_lost_the_image_builds_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, cache = World(monkeypatch), Cache(tmp_path / "cache")
    world.stage(cache)
    del world.images.held["sha256:built1"]  # an image prune removes the untagged stage
    assert world.stage(cache)[0] == "sha256:built2"
    assert world.stage(cache)[0] == "sha256:built2"  # and that one is kept in turn


def test_a_changed_base_or_dockerfile_builds_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, cache = World(monkeypatch), Cache(tmp_path / "cache")
    world.stage(cache)
    world.images.held[BASE] = {"Id": "sha256:base2", "Architecture": "amd64"}  # retagged
    assert world.stage(cache)[0] == "sha256:built2"
    other = APT.replace("libgomp1", "libgomp1 libmagic1t64")  # another apt set
    assert world.stage(cache, other)[0] == "sha256:built3"
    assert world.builds == [APT, APT, other]
    del world.images.held[BASE]  # BuildKit would pull the base: nothing known to key on
    assert world.stage(cache)[0] == "sha256:built4"
    world.images.held[BASE] = {"Id": "sha256:base2", "Architecture": "arm64"}  # another arch's
    assert world.stage(cache)[0] == "sha256:built5"


def test_without_a_cache_every_run_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    assert [world.stage(None)[0], world.stage(None)[0]] == ["sha256:built1", "sha256:built2"]


def test_a_missing_secret_fails_a_reuse_as_it_fails_a_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, cache = World(monkeypatch), Cache(tmp_path / "cache")
    secret = tmp_path / "auth.conf"
    secret.write_text("machine apt.example login x password y\n")
    world.stage(cache, secrets={"apt-auth": secret})
    secret.unlink()
    with pytest.raises(UserError, match="apt-auth"):
        world.stage(cache, secrets={"apt-auth": secret})
