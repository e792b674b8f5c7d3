"""Getting a rebased image into the engine to verify it: local blobs first, a pull otherwise."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from builder.cache import Cache
from builder.engines.connection import Engine as RunEngine
from builder.engines.per_arch import Engines
from builder.oci.remote import Written
from builder.oci.v1 import Image, canonical, digest_of
from builder.orchestration.delivery import Run
from builder.orchestration.produce_rebase import into_engine
from builder.reporter import Reporter

TAR = b"the deps-extra tar"
DIFF_ID = f"sha256:{hashlib.sha256(TAR).hexdigest()}"
CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "rootfs": {"diff_ids": [f"sha256:{'1' * 64}", DIFF_ID]},
}
IMAGE = Image.build(canonical(CONFIG), [])
PUSHED = IMAGE.digest  # the pushed manifest's


class Engine:
    """The few engine calls the rebase makes; `load_error` makes docker load fail."""

    def __init__(self, load_error: Exception | None = None) -> None:
        self.loaded: list[bytes] = []
        self.pulled: list[tuple[str, str]] = []
        self.load_error = load_error
        self.api = self
        self.images = self

    def inspect_image(self, image_id: str) -> Any:
        raise docker.errors.ImageNotFound(image_id)

    def load_image(self, stream: Any) -> list[dict[str, str]]:
        if self.load_error:
            raise self.load_error
        self.loaded.append(b"".join(stream))
        return [{"stream": "Loaded image ID: x"}]

    def pull(self, repository: str, tag: str, **_: Any) -> None:
        self.pulled.append((repository, tag))


def pushed() -> Written:
    """What writing the image by digest gave: the pull's reference and the bytes sent."""
    return Written("127.0.0.1:5000/s", PUSHED, (), 123)


def cache_with_layer(tmp_path: Path) -> Cache:
    cache = Cache(tmp_path / "cache")
    with cache.writing_blob(DIFF_ID.removeprefix("sha256:"), "layer.tar") as out:
        out.write(TAR)
    return cache


def into(engine: Engine, cache: Cache, said: list[str]) -> str:
    client: Any = engine
    run = Run(Engines(RunEngine(client, "amd64")), cache, Reporter(said.append))
    name, written = into_engine(
        run, "amd64", IMAGE.config_bytes, [DIFF_ID], pushed, "127.0.0.1:5000"
    )
    assert written == (None if name == digest_of(IMAGE.config_bytes) else pushed())
    return name


def test_a_cached_deps_layer_is_loaded_not_pulled(tmp_path: Path) -> None:
    engine, said = Engine(), list[str]()
    name = into(engine, cache_with_layer(tmp_path), said)
    assert name == digest_of(IMAGE.config_bytes)  # the id the pushed manifest's config names
    assert engine.pulled == []
    assert len(engine.loaded) == 1 and TAR in engine.loaded[0]
    assert IMAGE.config_bytes in engine.loaded[0]


def test_without_the_layer_here_the_pushed_digest_is_pulled(tmp_path: Path) -> None:
    engine, said = Engine(), list[str]()
    name = into(engine, Cache(tmp_path / "empty"), said)
    assert name == f"127.0.0.1:5000/s@{PUSHED}"
    assert engine.pulled == [("127.0.0.1:5000/s", PUSHED)] and engine.loaded == []


@pytest.mark.parametrize(
    "error", [docker.errors.APIError("layer does not exist"), OSError("broken pipe")]
)
def test_a_failed_load_falls_back_to_the_pull(tmp_path: Path, error: Exception) -> None:
    engine, said = Engine(load_error=error), list[str]()
    name = into(engine, cache_with_layer(tmp_path), said)
    assert name == f"127.0.0.1:5000/s@{PUSHED}"
    assert engine.pulled == [("127.0.0.1:5000/s", PUSHED)]
    assert any("locally failed" in line for line in said)
