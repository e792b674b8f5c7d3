"""/app/deps-extra as a stack of layers: one per distribution (small ones in buckets).

A registry and a node keep blobs by digest, so a layer holding one wheel is the same blob in
every template that installs that wheel, on every base: a requirements change moves only the
layers of what changed. builder.plan.layering decides the groups (largest lowest, the
smallest in name-hashed buckets beyond the budget); builder.layers.layer writes each group's
reproducible tar, leaving out the files a later distribution of the set installs too (pip's
winner), so the stack holds exactly what one `pip install --target` of the set holds.

With bytecode (builder.layers.bytecode) each group gets a second layer above all the distribution
layers, in the same order: its `.pyc`, keyed by the interpreter that compiled them, so the
distribution layers stay base-independent and a new interpreter rewrites only bytecode layers.
Every arch's wheels are compiled once, by one native interpreter (a pure wheel is shared by
sha256, so it compiles once for every arch): the marshal format is machine-independent.

Budget: at most EXTRAS_LAYERS layers for the extras and IMAGE_LAYERS in the whole image
(Docker's hard limit is 127; containerd has failed near 60 before it switched to relative
mount paths). Every extras layer's history line names the root, /app/deps-extra: the rebase
finds the extras by it.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import NotRequired, TypedDict

from packaging.utils import canonicalize_name

from builder.cache import Cache
from builder.errors import UserError
from builder.layers.bytecode import Compiled, Interpreter, bytecode_layer
from builder.layers.install_layout import LAYER_FORMAT
from builder.layers.layer import (
    Layer,
    LayerFacts,
    LayerWheels,
    shadowed_by_group,
    wheels_layer,
)
from builder.plan.layering import LayerGroup, Member, bucket_of, group_layers

EXTRAS_LAYERS = 48  # layers for /app/deps-extra
IMAGE_LAYERS = 64  # layers in the whole image: base, apt and extras
LAYER_FILE = "deps-extra-{arch}-{index:02d}.tar"  # in the context, ADDed in this order
STACK_FORMAT = "extras-layers/2"  # bump when the grouping or the record changes
HISTORY = re.compile(r" # (\S+) (.+) in /\S*$")  # the kind and label created_by writes


class LayerKind(StrEnum):
    """What an extras layer holds: its history line, report.json and the cache name it so."""

    DISTRIBUTION = "distribution"  # installed wheels
    BYTECODE = "bytecode"  # their .pyc
    HOME_SEED = "home"  # the caches built at image-build time for the home (layers.home)


class ExtrasLayerFacts(LayerFacts):
    """An extras layer in report.json's `extras_layers` (docs/report.md): kind and contents
    first, then the tar's facts."""

    kind: str
    distributions: list[str]


class LayerRecord(TypedDict):
    """An extras layer as the cache records a stack of them, to find its tar again."""

    kind: str
    names: list[str]
    label: str
    diff_id: str
    size: int
    sde: int  # its SOURCE_DATE_EPOCH
    wheels: list[str]
    shadowed: list[str]


class StackRecord(TypedDict):
    """A cached stack of extras layers; a bytecode stack also keeps its facts."""

    layers: list[LayerRecord]
    facts: NotRequired[BytecodeRecord]


@dataclass(frozen=True)
class ExtrasLayer:
    """One layer of the extras: what it holds (its kind and distributions) and its tar."""

    kind: LayerKind
    names: tuple[str, ...]  # the distributions in it (normalized names)
    label: str  # how its history line names it: a distribution, or "bucket N"
    layer: Layer
    wheels: tuple[str, ...] = ()  # their wheels' sha256, in lock order
    shadowed: frozenset[str] = frozenset()  # files left to a later distribution's layer

    def to_dict(self) -> ExtrasLayerFacts:
        return {"kind": self.kind, "distributions": list(self.names), **self.layer.to_dict()}


def created_by(arch: str, index: int, extras: ExtrasLayer, root: str) -> str:
    """An extras layer's history line; the rebase path finds the extras by `root` in it (a home
    seed's names it as what the caches were built from, and keeps it above the extras)."""
    added = f"ADD {LAYER_FILE.format(arch=arch, index=index)} /"
    if extras.kind == LayerKind.HOME_SEED:
        return f"{added} # home seed of {extras.label}, built from {root}"
    return f"{added} # {extras.kind} {extras.label} in {root}"


def holding_layers(added: Sequence[tuple[str, str]], names: Iterable[str]) -> dict[str, str]:
    """Which extras layer (diff ID) holds each of `names`, read back from the layers' (diff ID,
    history line) as created_by wrote them: a distribution's own layer names it, a bucket holds
    the names bucket_of sends to it. Bytecode layers hold none. An image of before layers by
    distribution has one extras layer, whose line names no kind: it holds them all."""
    wanted = [canonicalize_name(name) for name in names]
    lines = [(diff_id, HISTORY.search(line)) for diff_id, line in added]
    if added and not any(found for _, found in lines):
        return {name: added[0][0] for name in wanted}
    own, buckets = {}, {}
    for diff_id, found in lines:
        if found is None or found.group(1) != LayerKind.DISTRIBUTION:
            continue
        label = found.group(2)
        if label.startswith("bucket ") and label[7:].isdigit():
            buckets[int(label[7:])] = diff_id
        else:
            own[label] = diff_id
    holding = {name: own.get(name) or buckets.get(bucket_of(name)) for name in wanted}
    return {name: layer for name, layer in holding.items() if layer}


def group_budget(bytecode: bool) -> int:
    """How many groups the extras budget allows: each group has two layers with bytecode."""
    return EXTRAS_LAYERS // 2 if bytecode else EXTRAS_LAYERS


def check_layer_count(below: int, extras: int, what: str) -> None:
    """Refuse an image over the whole-image budget, in one line."""
    if below + extras > IMAGE_LAYERS:
        raise UserError(
            f"{what}: {below} base and apt layers + {extras} extras layers pass the"
            f" {IMAGE_LAYERS}-layer limit; use a base with fewer layers"
        )


def distribution_layers(
    pins: Sequence[tuple[str, str, str]],
    wheels: Mapping[str, Path],
    root: str,
    cache: Cache,
    budget: int = EXTRAS_LAYERS,
) -> tuple[ExtrasLayer, ...]:
    """The distribution layers of one arch's (name, version, sha256) pins, bottom to top.

    Cached by the pins: a rerun with the same lock reads no wheel. A set with no distribution
    still gets one (empty) layer, so every image has the root directory and its history line.
    """
    key_text = "\n".join(
        [STACK_FORMAT, LAYER_FORMAT, root, str(budget), *(f"{n} {s}" for n, _, s in pins)]
    )
    key = hashlib.sha256(key_text.encode()).hexdigest()
    cached = _cached(cache.get_record("extras-layers", key), cache)
    if cached is not None:
        return cached
    names = [canonicalize_name(name) for name, _, _ in pins]
    paths = [wheels[sha] for _, _, sha in pins]
    groups = group_layers(
        [Member(n, installed_size(p)) for n, p in zip(names, paths, strict=True)], budget
    )
    if not groups:
        groups = (LayerGroup((), 0),)
    group_index = {name: index for index, group in enumerate(groups) for name in group.names}
    group_of = [group_index[name] for name in names]
    shadowed = shadowed_by_group(paths, group_of)
    stack = []
    for index, group in enumerate(groups):
        members = tuple(
            (sha, paths[i]) for i, (_, _, sha) in enumerate(pins) if group_of[i] == index
        )
        left = shadowed.get(index, frozenset())
        layer = wheels_layer(LayerWheels(members, left), root, cache)
        label = group.label if group.names else "none"
        shas = tuple(sha for sha, _ in members)
        stack.append(ExtrasLayer(LayerKind.DISTRIBUTION, group.names, label, layer, shas, left))
    cache.put_record("extras-layers", key, StackRecord(layers=[_record(one) for one in stack]))
    return tuple(stack)


def own_layers_as_ready(
    ready: Iterable[tuple[Path, str]],
    root: str,
    cache: Cache,
    done: Callable[[str], None] | None = None,
) -> None:
    """Each (path, sha256) `ready` yields written as a layer of its own, nothing shadowed, in
    the order they come (each wheel once): distribution_layers finds them by the same key.
    `done(sha256)` is called as each is written (a run's timeline)."""
    written: set[str] = set()
    for path, sha256 in ready:
        if sha256 not in written:
            written.add(sha256)
            wheels_layer(LayerWheels(((sha256, path),)), root, cache)
            if done is not None:
                done(sha256)


def installed_size(wheel: Path) -> int:
    """The bytes a wheel unpacks to: what decides how low its layer goes."""
    with zipfile.ZipFile(wheel) as archive:
        return sum(info.file_size for info in archive.infolist())


def _record(one: ExtrasLayer) -> LayerRecord:
    layer = one.layer
    return LayerRecord(
        kind=one.kind,
        names=list(one.names),
        label=one.label,
        diff_id=layer.diff_id,
        size=layer.size,
        sde=layer.source_date_epoch,
        wheels=list(one.wheels),
        shadowed=sorted(one.shadowed),
    )


def _cached(record: StackRecord | None, cache: Cache) -> tuple[ExtrasLayer, ...] | None:
    """The stack a record names, if every tar is still in the cache."""
    if not record:
        return None
    stack = []
    for entry in record["layers"]:
        path = cache.checked_blob(entry["diff_id"].split(":", 1)[1], "layer.tar")
        if path is None:
            return None
        layer = Layer(path, entry["diff_id"], entry["size"], entry["sde"])
        stack.append(
            ExtrasLayer(
                LayerKind(entry["kind"]),
                tuple(entry["names"]),
                entry["label"],
                layer,
                tuple(entry["wheels"]),
                frozenset(entry["shadowed"]),
            )
        )
    return tuple(stack)


class BytecodeRecord(TypedDict):
    """`BytecodeFacts` in report.json's `bytecode` (docs/report.md) and in the cache."""

    interpreter: dict[str, str]
    compiled: int
    skipped: list[str]
    size: int


@dataclass(frozen=True)
class BytecodeFacts:
    """What one arch's bytecode layers hold, for report.json and the summary."""

    interpreter: Interpreter
    compiled: int  # .pyc files
    skipped: tuple[str, ...]  # sources that did not compile (as pip skips them)
    size: int  # bytes of the bytecode tars: what bytecode adds to the image

    def to_dict(self) -> BytecodeRecord:
        return BytecodeRecord(
            interpreter=self.interpreter.to_dict(),
            compiled=self.compiled,
            skipped=list(self.skipped),
            size=self.size,
        )


def with_bytecode(
    stacks: Mapping[str, tuple[ExtrasLayer, ...]],
    parts: Mapping[str, Compiled],
    interpreter: Interpreter,
    root: str,
    cache: Cache,
) -> tuple[dict[str, tuple[ExtrasLayer, ...]], dict[str, BytecodeFacts]]:
    """Every arch's distribution layers followed by their bytecode layers, same group order.

    `parts` holds each distinct wheel's bytecode by sha256, compiled once by `interpreter` for
    every arch (builder.layers.bytecode.CompileQueue, fed as the downloads end); each group's
    bytecode layer leaves out the sources its distribution layer leaves to a later one, and
    takes that layer's date, so it is as reproducible as it is.
    """
    result, facts = {}, {}
    for arch, stack in stacks.items():
        added = []
        for one in stack:
            if not one.wheels:
                continue
            compiled = bytecode_layer(
                [parts[sha] for sha in one.wheels],
                interpreter,
                root,
                one.layer.source_date_epoch,
                cache,
                one.shadowed,
            )
            added.append(
                ExtrasLayer(
                    LayerKind.BYTECODE,
                    one.names,
                    one.label,
                    compiled.layer,
                    one.wheels,
                    one.shadowed,
                )
            )
        result[arch] = (*stack, *added)
        used = [parts[sha] for one in stack for sha in one.wheels]
        skipped = tuple(sorted({path for part in used for path in part.skipped}))
        size = sum(one.layer.size for one in added)
        facts[arch] = BytecodeFacts(interpreter, sum(p.compiled for p in used), skipped, size)
        record = StackRecord(layers=[_record(one) for one in added], facts=facts[arch].to_dict())
        cache.put_record("bytecode-stack", _bytecode_key(stack, interpreter.build), record)
    return result, facts


def cached_bytecode(
    stack: tuple[ExtrasLayer, ...], interpreter: Interpreter, cache: Cache
) -> tuple[tuple[ExtrasLayer, ...], BytecodeFacts]:
    """The distribution layers followed by the bytecode layers `with_bytecode` recorded for
    them and this interpreter (what the run's own compile left in the cache), and their facts."""
    record = cache.get_record("bytecode-stack", _bytecode_key(stack, interpreter.build))
    added = _cached(record, cache) if record else None
    if record is None or added is None:
        raise UserError("the extras' bytecode is not in the cache; run the build again")
    facts = record["facts"]
    found = BytecodeFacts(interpreter, facts["compiled"], tuple(facts["skipped"]), facts["size"])
    return (*stack, *added), found


def remember_interpreter(cache: Cache, base_image: str, interpreter: Interpreter) -> None:
    """Record which interpreter `base_image` (pinned) holds, for labels and later steps."""
    key = hashlib.sha256(base_image.encode()).hexdigest()
    cache.put_record("interpreter", key, interpreter.to_dict() | {"image": interpreter.image})


def known_interpreter(cache: Cache, base_image: str) -> Interpreter | None:
    """The interpreter `remember_interpreter` recorded for `base_image`, if any."""
    record = cache.get_record("interpreter", hashlib.sha256(base_image.encode()).hexdigest())
    if not record:
        return None
    return Interpreter(record["image"], record["version"], record["cache_tag"], record["build"])


def _bytecode_key(stack: Sequence[ExtrasLayer], build: str) -> str:
    text = "\n".join([STACK_FORMAT, build, *(one.layer.diff_id for one in stack)])
    return hashlib.sha256(text.encode()).hexdigest()
