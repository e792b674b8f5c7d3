"""Full builds end the way rebases do: the tool, not BuildKit, puts /app/deps-extra on top.

BuildKit builds only the Dockerfile's `system` stage (the base plus the apt layer: small, and
dependent on the base anyway). The extras layers are builder.layers.extras' reproducible blobs
(one per distribution), and the final config (env, user, labels, history) is written by
builder.oci.mutate, the same code the rebase path uses. The result is `docker load`ed (only the
new layers travel: the engine already has every layer below them) so it can be verified, and
pushed later from exactly these blobs: the same wheel gives the same diff ID in the engine and
the same digest in any registry, whatever the day, the machine, the set or the base.
"""

from __future__ import annotations

import contextlib
import json
import tarfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from builder import contract
from builder.assemble.saved import cached_config, read_save, save_cached
from builder.cache import Cache
from builder.context.render import lock_of
from builder.engines.connection import holds_image
from builder.errors import UserError
from builder.layers.bytecode import Interpreter
from builder.layers.extras import (
    EXTRAS_LAYERS,
    ExtrasLayer,
    cached_bytecode,
    check_layer_count,
    created_by,
    distribution_layers,
    own_layers_as_ready,
)
from builder.layers.layer import ZIP_EPOCH, lock_hash
from builder.oci.mutate import ConfigChange, NewLayer, bare_config, extend_config
from builder.oci.v1 import ConfigFile, canonical, digest_of
from builder.plan.plan import EXTRA_DEPS, Plan

CHUNK = 1 << 20
MISSING_LAYER = "layer.tar: no such file or directory"  # the engine lacked a layer not sent
LOAD_BATCH = 1 << 28  # layer tar bytes one docker load carries (one larger layer alone)
BLOCK = 512


@dataclass(frozen=True)
class Assembled:
    """One arch's image as the tool wrote it: loaded in the engine under `image_id`."""

    arch: str
    image_id: str  # the digest of `config`: the engine's id for it after docker load
    config: bytes
    system_id: str  # the BuildKit-built system stage: every layer below deps-extra
    extras: tuple[ExtrasLayer, ...]  # bottom to top


def plan_layers(
    plan: Plan, cache: Cache, interpreter: Interpreter | None, budget: int
) -> dict[str, tuple[ExtrasLayer, ...]]:
    """Each arch's extras layers (built once per lock, in parallel; then a cache lookup), with
    the bytecode layers `interpreter` compiled for them (found in the cache) unless None."""

    def one(arch: str) -> tuple[ExtrasLayer, ...]:
        chosen = next(a.wheels for a in plan.arches if a.arch == arch)
        paths = _wheel_paths(plan, arch, cache)
        pins = [(w.name, w.version, w.sha256) for w in chosen]
        by_sha = {w.sha256: path for w, path in zip(chosen, paths, strict=True)}
        stack = distribution_layers(pins, by_sha, plan.pythonpath_entry, cache, budget)
        return cached_bytecode(stack, interpreter, cache)[0] if interpreter else stack

    arches = [a.arch for a in plan.arches]
    with ThreadPoolExecutor(max_workers=len(arches)) as pool:
        return dict(zip(arches, pool.map(one, arches), strict=True))


def start_own_layers(
    pool: ThreadPoolExecutor,
    pins: Mapping[str, Sequence[tuple[str, str, str]]],
    ready: Iterable[tuple[Path, str]],
    cache: Cache,
    budget: int = EXTRAS_LAYERS,
    done: Callable[[str], None] | None = None,
) -> Future[None] | None:
    """Write each wheel's own layer as `ready` yields it (path, sha256), as its download ends.

    While every arch's set fits `budget`, each distribution gets a layer of its own
    (plan.layering), so a wheel's layer needs no other wheel, unless a later distribution
    shadows one of its files, which needs every wheel's file list. Shadowing is rare: the layer
    written here is the one `start_layers` then finds in the cache, and a shadowed wheel's
    layer is written again there without those files. None: the set is grouped, or nothing to
    write (`ready` is then left unread). `done(sha256)` as each is written.
    """
    if not pins or any(len(arch_pins) > budget for arch_pins in pins.values()):
        return None
    return pool.submit(own_layers_as_ready, ready, EXTRA_DEPS, cache, done)


def reused_layers(
    pins: Mapping[str, Sequence[tuple[str, str, str]]], reuse_locks: Mapping[str, str] | None
) -> bool:
    """Whether every arch's lock hash equals `reuse_locks`: a rebase reuses its layers."""
    locks = {arch: lock_hash(lock_of(arch_pins)) for arch, arch_pins in pins.items()}
    return reuse_locks is not None and locks == reuse_locks


def start_layers(
    pool: ThreadPoolExecutor,
    pins: Mapping[str, Sequence[tuple[str, str, str]]],
    wheels: Mapping[str, Path],
    cache: Cache,
    budget: int = EXTRAS_LAYERS,
    after: Future[None] | None = None,
) -> dict[str, Future[tuple[ExtrasLayer, ...]]]:
    """Start each arch's extras layers from its (name, version, sha256) pins, before the plan;
    once `after` (start_own_layers' writing) ended, so that no layer is written twice."""

    def stack(arch: str) -> tuple[ExtrasLayer, ...]:
        if after is not None:
            after.result()
        return distribution_layers(pins[arch], wheels, EXTRA_DEPS, cache, budget)

    return {arch: pool.submit(stack, arch) for arch in pins}


def plan_epoch(plan: Plan) -> int:
    """The plan's SOURCE_DATE_EPOCH: the newest of its locks' (one `created` for every arch).

    What source_date_epoch reads from the wheels' zip directories, taken from their inspections
    (cached by sha256): it needs no layer written (the rebase path) and no zip opened again.
    """
    return max([ZIP_EPOCH, *(wheel.newest for arch in plan.arches for wheel in arch.wheels)])


def _wheel_paths(plan: Plan, arch: str, cache: Cache) -> list[Path]:
    chosen = next(a.wheels for a in plan.arches if a.arch == arch)
    paths = []
    for wheel in chosen:
        path = cache.find_blob(wheel.sha256, wheel.filename)
        if path is None:
            raise UserError(f"{wheel.filename}: not in the cache; run the build again")
        paths.append(path)
    return paths


@dataclass(frozen=True)
class Assembly:
    """How a system stage becomes one arch's image: where the deps-extra layer goes, the config
    it gets, the local tag. With `apt_layer` the save also keeps the system stage's top layer
    (the apt layer) for the push."""

    arch: str
    root: str  # the PYTHONPATH entry the layer fills: /app/deps-extra
    labels: Mapping[str, str]
    created: str
    tag: str
    apt_layer: bool = False
    env: Mapping[str, str] = field(default_factory=dict)  # set besides PYTHONPATH (the home's)


def assemble(
    client: docker.DockerClient,
    system_id: str,
    extras: Sequence[ExtrasLayer],
    assembly: Assembly,
    cache: Cache,
) -> Assembled:
    """The system image plus the `extras` layers, loaded into the engine (unless it has
    it) and tagged. The tars of the bottom extras the engine already holds on the system
    image (`held_layers`: an earlier build's, or `preload`'s while the bytecode compiled) are
    not sent again.

    The exact config needs the system image's, which only its save gives, after a few seconds;
    so the first time, the extras layers are loaded meanwhile under a provisional config
    (the same layers), and the final config follows with no layer to send.
    """
    arch = assembly.arch
    below = system_layers(client, system_id, arch)
    check_layer_count(len(below), len(extras), f"the {arch} image")
    tars = [one.layer.path for one in extras]
    diff_ids = [one.layer.diff_id for one in extras]
    held = held_layers(client, arch, below, diff_ids)
    keep = below[-1] if assembly.apt_layer and below else None
    base = cached_config(system_id, cache) if save_cached(system_id, cache, keep) else None
    preloading: Future[str] | None = None
    try:
        if base is None:
            with ThreadPoolExecutor(max_workers=1) as pool:
                preloading = pool.submit(_preload, client, arch, [*below, *diff_ids], tars, held)
                base = read_save(client, system_id, cache, keep_layer=keep).config
            preloading.result()
        data = canonical(extend_config(base, *_on_top(extras, assembly)))
        image_id = load(client, data, tars, len(tars) if preloading else held)
    finally:  # the final image holds the layers now (or nothing does): the save may have failed
        if preloading and preloading.done() and not preloading.exception():
            remove_provisional(client, preloading.result())
    tag = assembly.tag
    repository, _, name = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "")
    client.api.tag(image_id, repository, name or "latest")
    return Assembled(arch, image_id, data, system_id, tuple(extras))


def preload(
    client: docker.DockerClient, system_id: str, arch: str, extras: Sequence[ExtrasLayer]
) -> str | None:
    """Load `extras` on the system image under a provisional config, before the image's own
    layers above them exist (its bytecode being compiled): `assemble` then finds them held and
    sends only the rest. The provisional image's id, which the caller removes once the image is
    assembled; None when the engine held them all already (a rerun)."""
    below = system_layers(client, system_id, arch)
    diff_ids = [one.layer.diff_id for one in extras]
    held = held_layers(client, arch, below, diff_ids)
    if held == len(diff_ids):
        return None
    tars = [one.layer.path for one in extras]
    return _preload(client, arch, [*below, *diff_ids], tars, held)


def system_layers(client: docker.DockerClient, system_id: str, arch: str) -> list[str]:
    """The system image's diff IDs, bottom to top, refusing one built for another arch."""
    found = client.images.get(system_id).attrs
    if found.get("Architecture") != arch:
        raise UserError(f"image {system_id}: built as {found.get('Architecture')}, not {arch}")
    return list((found.get("RootFS") or {}).get("Layers") or [])


def held_layers(
    client: docker.DockerClient, arch: str, below: Sequence[str], diff_ids: Sequence[str]
) -> int:
    """How many of `diff_ids`, bottom up, the engine holds on the layers `below`.

    The engine answers no such question; but a load whose archive holds no layer tar succeeds
    exactly when the engine holds the whole chain (it reads a layer's tar only when it lacks the
    layer), and holding a chain means holding every shorter one. So a bisection of such loads
    finds the count, under 0.1 s each; each one loaded is removed at once. The whole chain is
    tried first: a rerun holds it all.
    """
    if _holds_chain(client, arch, [*below, *diff_ids]):
        return len(diff_ids)
    low, high = 0, len(diff_ids) - 1  # the engine holds `low` of them, and not more than `high`
    while low < high:
        middle = (low + high + 1) // 2
        if _holds_chain(client, arch, [*below, *diff_ids[:middle]]):
            low = middle
        else:
            high = middle - 1
    return low


def _holds_chain(client: docker.DockerClient, arch: str, diff_ids: Sequence[str]) -> bool:
    probe = bare_config(arch, diff_ids, {"bsi.provisional": uuid.uuid4().hex})
    try:
        _send(client, digest_of(probe), probe, [])
    except UserError:
        return False
    remove_provisional(client, digest_of(probe))
    return True


def _on_top(
    extras: Sequence[ExtrasLayer], assembly: Assembly
) -> tuple[list[NewLayer], ConfigChange]:
    """What the extras layers put on the system image's config: the layers (their digests are
    known only when pushed), on PYTHONPATH, run as the sandbox user."""
    arch, root = assembly.arch, assembly.root
    layers = [
        NewLayer("", one.layer.diff_id, one.layer.size, created_by(arch, i, one, root))
        for i, one in enumerate(extras, 1)
    ]
    change = ConfigChange(
        {"PYTHONPATH": f"$PYTHONPATH:{root}", **assembly.env},
        contract.SANDBOX_USER,
        assembly.labels,
        assembly.created,
    )
    return layers, change


def load(client: docker.DockerClient, config: bytes, tars: Sequence[Path], held: int) -> str:
    """Load the image `config` describes into the engine (unless it has it); its image id.

    `tars` are the layers above the ones the engine holds anyway (bottom to top), and the
    engine holds the bottom `held` of them already, so only the rest travel. When the engine
    then lacks a layer it was not sent (another process removed the image that held it, or a
    prune took a batch's provisional image meanwhile), the load is tried once more with every
    tar.
    """
    image_id = digest_of(config)
    if holds_image(client, image_id):
        return image_id
    try:
        _send_in_batches(client, image_id, config, tars, held)
    except UserError as error:
        if MISSING_LAYER not in str(error):
            raise
        _send_in_batches(client, image_id, config, tars, 0)
    return image_id


def _send_in_batches(
    client: docker.DockerClient, image_id: str, config: bytes, tars: Sequence[Path], held: int
) -> None:
    """Send `tars[held:]` at most LOAD_BATCH bytes a load (one larger layer alone), each batch
    under a provisional config naming the layers up to it, removed once the image is loaded.

    The engine copies a load's whole archive to its own disk before it reads a layer from it,
    so a single load of a 6 GB set would hold a second 6 GB while it lasts.
    """
    parsed = ConfigFile.parse(config)
    below = len(parsed.diff_ids) - len(tars)
    ends = [held + end for end in batch_ends([t.stat().st_size for t in tars[held:]], LOAD_BATCH)]
    steps: list[str] = []
    try:
        start = held
        for end in ends[:-1]:
            label = {"bsi.provisional": uuid.uuid4().hex}
            provisional = bare_config(parsed.architecture, parsed.diff_ids[: below + end], label)
            steps.append(digest_of(provisional))
            _send(client, image_id, provisional, tars[start:end])
            start = end
        _send(client, image_id, config, tars[start:])
    finally:  # the image holds the batches' layers now, or nothing needs them
        for step in steps:
            remove_provisional(client, step)


def remove_provisional(client: docker.DockerClient, image_id: str) -> None:
    """Remove a provisional image, and the layers only it held. One already gone (a prune),
    or that the engine will not remove now, is left: a cleanup must not replace the error or
    result it follows."""
    with contextlib.suppress(docker.errors.APIError):
        client.api.remove_image(image_id, noprune=False)


def batch_ends(sizes: Sequence[int], limit: int) -> list[int]:
    """Where consecutive runs of `sizes` end, each run at most `limit` in total (a larger
    item alone); the last end is len(sizes), so there is always one run, maybe empty."""
    ends: list[int] = []
    total = 0
    for index, size in enumerate(sizes):
        if total and total + size > limit:
            ends.append(index)
            total = 0
        total += size
    return [*ends, len(sizes)]


def _send(client: docker.DockerClient, named: str, config: bytes, tops: Sequence[Path]) -> None:
    """One docker load of `config` with the layer tars `tops`; a failure names image `named`
    (the image being loaded, not a batch's provisional config)."""
    image_id = digest_of(config)
    diff_ids = ConfigFile.parse(config).diff_ids
    for line in client.api.load_image(_load_stream(image_id, config, diff_ids, tops)):
        if "error" in line:
            raise UserError(f"docker load of {named}: {line['error']}")


def _preload(
    client: docker.DockerClient,
    arch: str,
    diff_ids: Sequence[str],
    tars: Sequence[Path],
    held: int,
) -> str:
    """Load `tars` (the bottom `held` already in the engine) on the layers below them under a
    config that names only them; its id.

    The config is this run's own (a random label): another run assembling the same layer at
    once must not find it loaded, rely on it, and see this run remove it.
    """
    provisional = bare_config(arch, diff_ids, {"bsi.provisional": uuid.uuid4().hex})
    return load(client, provisional, tars, held)


def _load_stream(
    image_id: str, config: bytes, diff_ids: Sequence[str], tops: Sequence[Path]
) -> Iterator[bytes]:
    """A `docker save`-format tar holding the config and at most the top layers (plain tars).

    The engine skips reading the layers it has (the system image's, and the top ones when they
    were preloaded): the manifest names files the archive need not hold.
    """
    hex_id = image_id.removeprefix("sha256:")
    layers = [f"{index}/layer.tar" for index in range(len(diff_ids))]
    manifest = json.dumps([{"Config": f"{hex_id}.json", "RepoTags": None, "Layers": layers}])
    yield from _member(f"{hex_id}.json", len(config), iter([config]))
    for index, top in enumerate(tops, len(diff_ids) - len(tops)):
        yield from _member(layers[index], top.stat().st_size, _chunks(top))
    yield from _member("manifest.json", len(manifest), iter([manifest.encode()]))
    yield b"\0" * (2 * BLOCK)


def _member(name: str, size: int, body: Iterator[bytes]) -> Iterator[bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    yield info.tobuf(tarfile.PAX_FORMAT)
    yield from body
    yield b"\0" * (-size % BLOCK)


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while data := handle.read(CHUNK):
            yield data
