"""Which layers of an image get a ztoc, the reuse of ztocs by blob digest, and `soci = false`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.wheelfactory import make_wheel

from builder.cache import Cache, sha256_of
from builder.config import RunSettings, load_config, merge
from builder.errors import UserError
from builder.image import soci as soci_module
from builder.image.gzipped import gzipped
from builder.image.layer import LayerWheels, wheels_layer
from builder.image.soci import soci_index, soci_record
from builder.oci.v1 import DOCKER_LAYER, Descriptor, Image

THRESHOLD = 100 << 10  # the threshold, scaled down with the layers
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
    large = tool_layer(tmp_path, cache, "large", 2 * THRESHOLD)
    small = tool_layer(tmp_path, cache, "small", THRESHOLD // 4)
    foreign = Descriptor(DOCKER_LAYER, "sha256:" + "f" * 64, 50 << 20)  # the base's: no record
    assert large.size >= THRESHOLD > small.size
    return cache, [foreign, large, small]


@pytest.fixture(autouse=True)
def threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soci_module, "MIN_LAYER", THRESHOLD)


def test_only_the_tools_large_layers_get_a_ztoc(layers: tuple[Cache, list[Descriptor]]) -> None:
    cache, descriptors = layers
    image = Image.build(CONFIG, descriptors)
    index = soci_index(image, cache)
    assert index is not None
    assert [one.layer for one in index.ztocs] == [descriptors[1]]
    record = soci_record(image, index)
    assert record["ztocs"][0]["layer"] == descriptors[1].digest
    assert record["normal_pull_bytes"] == sum(d.size for d in descriptors)
    ztoc_size = len(index.ztocs[0].ztoc)
    assert (
        record["lazy_before_mount_bytes"] == descriptors[0].size + descriptors[2].size + ztoc_size
    )
    assert soci_index(Image.build(CONFIG, [descriptors[0], descriptors[2]]), cache) is None


def test_a_second_image_with_the_layer_reuses_its_ztoc(
    layers: tuple[Cache, list[Descriptor]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebase or another template pushing the same layer: the ztoc comes from the cache."""
    cache, descriptors = layers
    first = soci_index(Image.build(CONFIG, descriptors), cache)

    def never(*_: object) -> bytes:
        raise AssertionError("the ztoc was written again")

    monkeypatch.setattr(soci_module, "ztoc_bytes", never)
    again = soci_index(Image.build(CONFIG, [descriptors[1]]), cache)  # a rebased image
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
    flags = RunSettings(requirements=(Path("r.txt"),))
    assert merge(flags, config, output_given=False).soci is False
    path.write_text(base)
    assert merge(RunSettings((), soci=False), load_config(path), output_given=False).soci is False
    path.write_text(base + 'soci = "no"\n')
    with pytest.raises(UserError, match="'soci' must be true or false"):
        load_config(path)
