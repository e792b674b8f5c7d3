"""One docker save per system image: its config and apt layer; the deps layer preloaded meanwhile.

Real engine and registry: a small system image (the stand-in base plus one RUN layer standing
in for the apt layer) gets a small deps-extra layer put on top by `assemble`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from support.images import local_images
from support.registryhelp import layer_tar

from builder.assemble import assemble as assemble_module
from builder.assemble import from_engine
from builder.assemble.assemble import Assembly, assemble, held_layers, load, preload
from builder.assemble.build import BuildSpec, build_image
from builder.assemble.from_engine import assembled_image
from builder.assemble.saved import cached_config, read_save, save_cached
from builder.cache import Cache
from builder.credentials import Credentials
from builder.errors import UserError
from builder.layers.extras import ExtrasLayer
from builder.layers.gzipped import gzipped
from builder.layers.layer import Layer
from builder.oci.client import RepositoryClient
from builder.oci.mutate import bare_config
from builder.oci.name import ImageRef
from builder.oci.remote import write
from builder.oci.v1 import digest_of

pytestmark = pytest.mark.usefixtures("docker_client")


@pytest.fixture(scope="module")
def system_image(test_env: dict, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The stand-in base plus one small layer of this run's own (so no other image shares it)."""
    context = tmp_path_factory.mktemp("system")
    (context / "Dockerfile").write_text(
        f"FROM {test_env['base_image']}\nUSER 0:0\n"
        f"RUN echo {uuid.uuid4().hex} > /etc/bsi-apt-stand-in\nUSER 65532:65532\n"
    )
    with open(context / "build.log", "w") as log:
        return build_image(context, BuildSpec(platform="linux/amd64"), log)


def deps_layer(cache: Cache) -> Layer:
    """A small deps-extra tar, unique to the test, in the cache like the layer writer's."""
    data = layer_tar([("app/deps-extra/", None), ("app/deps-extra/m.py", uuid.uuid4().bytes)])
    sha = hashlib.sha256(data).hexdigest()
    with cache.writing_blob(sha, "layer.tar") as out:
        out.write(data)
    path = cache.blob_path(sha, "layer.tar")
    return Layer(path, f"sha256:{sha}", len(data), 0)


def test_one_save_gives_the_config_and_keeps_the_top_layer(
    docker_client: Any, system_image: str, tmp_path: Path
) -> None:
    cache = Cache(tmp_path / "cache")
    top = docker_client.images.get(system_image).attrs["RootFS"]["Layers"][-1]
    saved = read_save(docker_client, system_image, cache, keep_layer=top)
    assert saved.config["rootfs"]["diff_ids"][-1] == top
    assert saved.layer is not None and saved.layer.diff_id == top
    assert f"sha256:{hashlib.sha256(saved.layer.path.read_bytes()).hexdigest()}" == top
    assert cached_config(system_image, cache) == saved.config
    leftovers = [p.name for p in cache.root.iterdir() if p.name.startswith(".layer-")]
    assert leftovers == []  # the other layers' tars were hashed and dropped


def test_a_layer_the_save_does_not_hold_is_one_error(
    docker_client: Any, system_image: str, tmp_path: Path
) -> None:
    missing = f"sha256:{'0' * 64}"
    with pytest.raises(UserError, match=f"no layer {missing} in its save"):
        read_save(docker_client, system_image, Cache(tmp_path / "cache"), keep_layer=missing)


def test_assemble_preloads_then_loads_the_exact_config_and_leaves_no_provisional_image(
    docker_client: Any, system_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = Cache(tmp_path / "cache")
    deps = deps_layer(cache)
    more = deps_layer(cache)
    stack = (_extras(deps), _extras(more))
    sent = _spy_sends(monkeypatch)
    tag = f"bsi-saved-{uuid.uuid4().hex[:8]}:test"
    built = assemble(
        docker_client, system_image, stack, assembly({"x": "y"}, tag, apt_layer=True), cache
    )
    try:
        found = docker_client.images.get(tag)
        assert found.id == built.image_id == digest_of(built.config)
        system_layers = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
        assert found.attrs["RootFS"]["Layers"] == [*system_layers, deps.diff_id, more.diff_id]
        assert found.attrs["Config"]["User"] == "65532:65532"
        entries = json.loads(built.config)["history"]
        history = [h.get("created_by", "") for h in entries if not h.get("empty_layer")][-2:]
        assert all("/app/deps-extra" in line for line in history)
        assert sent == [[deps.path, more.path], []]  # layers sent once, the config alone
        holding = [*system_layers, deps.diff_id, more.diff_id]
        assert _holding(docker_client, holding) == [built.image_id]
        assert cache.find_blob(system_layers[-1].removeprefix("sha256:"), "layer.tar")
        # the second time the config is cached: no save, no preload, the one load sends nothing
        sent.clear()
        docker_client.images.remove(tag)
        monkeypatch.setattr(docker_client.api, "get_image", _no_save)
        again = assemble(
            docker_client, system_image, stack, assembly({"x": "y"}, tag, apt_layer=True), cache
        )
        assert again.image_id == built.image_id and sent == [[deps.path, more.path]]
    finally:
        docker_client.images.remove(tag, force=True)


def test_a_build_that_does_not_push_keeps_no_apt_layer_and_a_push_then_saves_for_it(
    docker_client: Any, system_image: str, tmp_path: Path
) -> None:
    """The apt layer's tar is only a push's (gzipped from it): a build that only loads keeps
    the config alone, and a later pushing build of the same stage saves it again for the tar
    rather than trusting the config it finds."""
    cache = Cache(tmp_path / "cache")
    stack = (_extras(deps_layer(cache)),)
    tag = f"bsi-saved-{uuid.uuid4().hex[:8]}:test"
    apt = docker_client.images.get(system_image).attrs["RootFS"]["Layers"][-1]
    try:
        assemble(docker_client, system_image, stack, assembly({}, tag), cache)
        assert cached_config(system_image, cache) is not None
        assert cache.find_blob(apt.removeprefix("sha256:"), "layer.tar") is None
        assert save_cached(system_image, cache)
        assert not save_cached(system_image, cache, apt)
        docker_client.images.remove(tag)
        assemble(docker_client, system_image, stack, assembly({}, tag, apt_layer=True), cache)
        kept = cache.find_blob(apt.removeprefix("sha256:"), "layer.tar")
        assert kept is not None
        assert f"sha256:{hashlib.sha256(kept.read_bytes()).hexdigest()}" == apt
        assert save_cached(system_image, cache, apt)
    finally:
        docker_client.images.remove(tag, force=True)


def test_the_push_takes_the_kept_apt_layer_not_another_save(
    docker_client: Any, system_image: str, registry: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    cache = Cache(tmp_path / "cache")
    deps = deps_layer(cache)
    tag = f"bsi-saved-{uuid.uuid4().hex[:8]}:test"
    stack = (_extras(deps),)
    built = assemble(docker_client, system_image, stack, assembly({}, tag, apt_layer=True), cache)
    target = RepositoryClient(
        ImageRef.parse_repository(f"{registry.host}/bsi-saved-{uuid.uuid4().hex[:8]}/img"),
        credentials=Credentials(registry.user, registry.password, "test"),
    )
    missing: list[list[bool]] = []  # per docker save the push made: which layers it still needed
    real_save = from_engine._save

    def spied(client: Any, image_id: str, diff_ids: Any, layers: list[Any], *rest: Any) -> bytes:
        missing.append([layer is None for layer in layers])
        return real_save(client, image_id, diff_ids, layers, *rest)

    monkeypatch.setattr(from_engine, "_save", spied)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    try:
        image, blobs = assembled_image(docker_client, built, None, cache, scratch)  # no base
        pushed = write(target, [image], blobs)
        # Pushed again (the next build on this base, say): every layer's blob is in the cache
        # now, so no save at all, and the same image.
        again, _ = assembled_image(docker_client, built, None, cache, scratch)
    finally:
        docker_client.images.remove(tag, force=True)
    below = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
    assert missing == [[True] * (len(below) - 1) + [False]]  # the save only for the base's layers
    assert again.digest == image.digest
    manifest = json.loads(target.manifest(pushed.digest)[0])
    assert [layer["digest"] for layer in manifest["layers"]][-2:] == [
        gzipped(cache.blob_path(below[-1].removeprefix("sha256:"), "layer.tar"), below[-1],
                cache).digest,
        gzipped(deps.path, deps.diff_id, cache).digest,
    ]  # fmt: skip
    assert all(target.blob_exists(layer["digest"]) for layer in manifest["layers"])


def _spy_sends(monkeypatch: pytest.MonkeyPatch) -> list[list[Path]]:
    """What each docker load of an image (not a probe of `held_layers`) sent: its layer tars."""
    sent: list[list[Path]] = []
    real_send = assemble_module._send

    def spied(client: Any, image_id: str, config: bytes, tops: Any) -> None:
        if tops or b"bsi.provisional" not in config:
            sent.append(list(tops))
        real_send(client, image_id, config, tops)

    monkeypatch.setattr(assemble_module, "_send", spied)
    return sent


def test_held_layers_counts_the_chain_the_engine_holds_and_leaves_no_probe(
    docker_client: Any, system_image: str, tmp_path: Path
) -> None:
    cache = Cache(tmp_path / "cache")
    layers = [deps_layer(cache) for _ in range(3)]
    below = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
    tag = f"bsi-saved-{uuid.uuid4().hex[:8]}:held"
    assemble(docker_client, system_image, tuple(map(_extras, layers)), assembly({}, tag), cache)
    try:
        ids = [one.diff_id for one in layers]
        other = deps_layer(cache).diff_id  # a layer no image holds
        arch = "amd64"
        assert held_layers(docker_client, arch, below, ids) == 3
        assert held_layers(docker_client, arch, below, [*ids[:2], other]) == 2
        assert held_layers(docker_client, arch, below, [ids[0], other, ids[2]]) == 1
        assert held_layers(docker_client, arch, below, [other, *ids]) == 0
        assert held_layers(docker_client, arch, below, [ids[1], ids[2]]) == 0  # not on its parent
        for count in range(1, 4):
            assert _holding(docker_client, [*below, *ids[:count]]) == (
                [docker_client.images.get(tag).id] if count == 3 else []
            )  # every probe loaded was removed
    finally:
        docker_client.images.remove(tag, force=True)


def test_a_preload_leaves_only_the_layers_above_it_to_send(
    docker_client: Any, system_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a build does while its bytecode compiles: the distribution layers loaded early."""
    cache = Cache(tmp_path / "cache")
    distribution, bytecode = deps_layer(cache), deps_layer(cache)
    below = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
    sent = _spy_sends(monkeypatch)
    provisional = preload(docker_client, system_image, "amd64", (_extras(distribution),))
    assert provisional is not None and sent == [[distribution.path]]
    assert preload(docker_client, system_image, "amd64", (_extras(distribution),)) is None
    assert sent == [[distribution.path]]  # held already: nothing loaded again
    tag = f"bsi-saved-{uuid.uuid4().hex[:8]}:preloaded"
    stack = (_extras(distribution), _extras(bytecode))
    try:
        built = assemble(docker_client, system_image, stack, assembly({}, tag), cache)
        assert sent[1:] == [[bytecode.path], []]  # the preloaded layer did not travel again
    finally:
        docker_client.api.remove_image(provisional, noprune=False)
    try:
        chain = [*below, distribution.diff_id, bytecode.diff_id]
        assert docker_client.images.get(tag).attrs["RootFS"]["Layers"] == chain
        assert _holding(docker_client, chain[:-1]) == []  # the provisional image is gone ...
        assert _holding(docker_client, chain) == [built.image_id]  # ... its layer stays
    finally:
        docker_client.images.remove(tag, force=True)


def test_a_load_whose_held_layers_vanished_sends_them_all(
    docker_client: Any, system_image: str, tmp_path: Path
) -> None:
    """Another process removed the image that held the bottom layer between the count and the
    load: the load is tried again with every tar."""
    cache = Cache(tmp_path / "cache")
    layers = [deps_layer(cache), deps_layer(cache)]
    below = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
    config = bare_config("amd64", [*below, *(one.diff_id for one in layers)], {"t": "vanished"})
    image_id = load(docker_client, config, [one.path for one in layers], held=1)
    try:
        found = docker_client.api.inspect_image(image_id)["RootFS"]["Layers"]
        assert found == [*below, *(one.diff_id for one in layers)]
    finally:
        docker_client.api.remove_image(image_id, noprune=False)


def test_a_large_set_is_loaded_in_batches_and_leaves_no_batch_image(
    docker_client: Any, system_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each docker load carries at most LOAD_BATCH bytes of layers (the engine copies a load's
    archive whole before reading it); the image is the same, and only it holds the layers."""
    cache = Cache(tmp_path / "cache")
    layers = [deps_layer(cache) for _ in range(3)]
    monkeypatch.setattr(assemble_module, "LOAD_BATCH", layers[0].size + layers[1].size)
    sent = _spy_sends(monkeypatch)
    tag = f"bsi-saved-{uuid.uuid4().hex[:8]}:batches"
    built = assemble(
        docker_client, system_image, tuple(map(_extras, layers)), assembly({}, tag), cache
    )
    try:
        paths = [one.path for one in layers]
        assert sent[:2] == [paths[:2], paths[2:]]  # the provisional image's load, in two
        below = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
        chain = [*below, *(one.diff_id for one in layers)]
        assert docker_client.images.get(tag).attrs["RootFS"]["Layers"] == chain
        assert _holding(docker_client, chain[:-1]) == []  # the first batch's image is gone
        assert _holding(docker_client, chain) == [built.image_id]
    finally:
        docker_client.images.remove(tag, force=True)


def test_a_batch_pruned_before_the_next_one_is_loaded_again(
    docker_client: Any, system_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune took the first batch's provisional image (untagged) before the second batch
    arrived: the engine lacks a layer it was not sent, and the load starts over whole."""
    cache = Cache(tmp_path / "cache")
    layers = [deps_layer(cache) for _ in range(2)]
    monkeypatch.setattr(assemble_module, "LOAD_BATCH", layers[0].size)
    real_send = assemble_module._send
    pruned: list[str] = []

    def pruning(client: Any, named: str, config: bytes, tops: Any) -> None:
        real_send(client, named, config, tops)
        if b"bsi.provisional" in config and tops and not pruned:  # the first batch, once
            pruned.append(digest_of(config))
            client.api.remove_image(pruned[0], noprune=False)

    monkeypatch.setattr(assemble_module, "_send", pruning)
    below = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
    chain = [*below, *(one.diff_id for one in layers)]
    config = bare_config("amd64", chain, {"t": uuid.uuid4().hex})
    image_id = load(docker_client, config, [one.path for one in layers], held=0)
    try:
        assert pruned and docker_client.api.inspect_image(image_id)["RootFS"]["Layers"] == chain
        assert _holding(docker_client, chain[:-1]) == []  # the second try's batch is gone too
    finally:
        docker_client.api.remove_image(image_id, noprune=False)


def assembly(labels: dict[str, str], tag: str, apt_layer: bool = False) -> Assembly:
    """The amd64 image with /app/deps-extra at a fixed date, as the tests assemble it."""
    return Assembly("amd64", "/app/deps-extra", labels, "2026-01-01T00:00:00Z", tag, apt_layer)


def _extras(layer: Layer) -> ExtrasLayer:
    return ExtrasLayer("distribution", ("m",), "m", layer)


def _no_save(*args: object, **kwargs: object) -> None:
    raise AssertionError("docker save must not run: the config and the apt layer are cached")


def _holding(docker_client: Any, layers: list[str]) -> list[str]:
    """The engine's images whose layers are exactly `layers` (the deps layer is the test's)."""
    found = []
    for image_id, _ in local_images(docker_client, all_layers=True):
        with contextlib.suppress(docker.errors.NotFound):  # removed meanwhile by another test
            if docker_client.api.inspect_image(image_id)["RootFS"].get("Layers") == layers:
                found.append(image_id)
    return found


def test_a_failed_save_leaves_no_provisional_image(
    docker_client: Any, system_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = Cache(tmp_path / "cache")
    deps = deps_layer(cache)
    preloading = threading.Event()
    real_preload = assemble_module._preload

    def preload(*args: Any) -> str:
        preloading.set()
        return real_preload(*args)

    def failing(*args: object, **kwargs: object) -> None:
        assert preloading.wait(120), "the preload did not start"  # as with a real save
        raise UserError(f"image {system_image}: docker save gave no config")

    monkeypatch.setattr(assemble_module, "_preload", preload)
    monkeypatch.setattr(assemble_module, "read_save", failing)
    with pytest.raises(UserError, match="gave no config"):
        assemble(
            docker_client,
            system_image,
            (_extras(deps),),
            assembly({}, "bsi-saved-unused:test"),
            cache,
        )
    below = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
    assert _holding(docker_client, [*below, deps.diff_id]) == []  # no 1 GB leftover


def test_two_runs_assembling_one_layer_at_once_both_succeed(
    docker_client: Any, system_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A's whole assemble happens while run B reads its save, after B's preload ended
    (separate caches, other labels): neither's cleanup may break the other."""
    deps = deps_layer(Cache(tmp_path / "b"))
    preloaded = threading.Event()
    real_preload, real_read_save = assemble_module._preload, assemble_module.read_save
    tags = [f"bsi-saved-{uuid.uuid4().hex[:8]}:{run}" for run in ("a", "b")]

    def preload(*args: Any) -> str:
        found = real_preload(*args)
        preloaded.set()
        return found

    def read_save_with_run_a(client: Any, image_id: str, cache: Cache, **kwargs: Any) -> Any:
        if not others:  # run B's save: run A goes first, once B's preload has ended
            others.append(None)
            assert preloaded.wait(60)
            others[0] = assemble(
                client,
                system_image,
                (_extras(deps),),
                assembly({"run": "a"}, tags[0]),
                Cache(tmp_path / "a"),
            )
        return real_read_save(client, image_id, cache, **kwargs)

    others: list[Any] = []
    monkeypatch.setattr(assemble_module, "_preload", preload)
    monkeypatch.setattr(assemble_module, "read_save", read_save_with_run_a)
    try:
        b = assemble(
            docker_client,
            system_image,
            (_extras(deps),),
            assembly({"run": "b"}, tags[1]),
            Cache(tmp_path / "b"),
        )
        assert len(others) == 1
        below = docker_client.images.get(system_image).attrs["RootFS"]["Layers"]
        chain = [*below, deps.diff_id]
        assert sorted(_holding(docker_client, chain)) == sorted([others[0].image_id, b.image_id])
    finally:
        for tag in tags:
            with contextlib.suppress(Exception):
                docker_client.images.remove(tag, force=True)
