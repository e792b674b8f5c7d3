"""What a build learned, as a document pushed with its images: the registry as the cache.

A fresh CI runner starts with an empty cache, although the registry holds every layer of the
last push, addressed by digest. The build facts document says what the plan learned of each
wheel (its inspection record, keyed by the wheel's sha256) and which distribution layer holds
which wheels (diff ID, size, date, what it leaves to a later distribution), with the formats
they were made in. `--cache-from REF` (builder.publish.cache_from) reads it back and seeds the
local cache, so a distribution whose wheel and formats match is neither inspected nor laid
out again.

Trust: a referrer can be added by anyone who may push to the repository, so the document is
pinned by the image itself: its digest is a label of the image's config (`FACTS_LABEL`), the
config the tool built and verification verified (the push checks it byte for byte), so the
label costs nothing verification did not see. With bytecode, the document also says which
interpreter build compiled it, what each wheel's compile made and each bytecode layer: a layer
holding one wheel's bytecode alone and whole is that wheel's compile, read back. A reader
takes only the attached document that hashes to the label, and every layer it names must be
one of the config's diff IDs. The
document is a function of the lock alone (records normalized through `WheelInspection`), so a
cold build and a warm one label the same image the same way.

Pure: the document's shape, and the decision which of a run's wheels it may serve
(`reusable`); reading and pulling are cache_from's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, cast

from builder.inspect.wheels import WheelInspection, WheelRecord
from builder.oci.v1 import canonical

FACTS_TYPE = "application/vnd.build-sandbox-image.facts.v1+json"  # the attachment's type
FACTS_LABEL = "org.build-sandbox-image.facts"  # the config label: sha256 of the document
FORMAT = "build-facts/1"  # bump when the document's shape changes


@dataclass(frozen=True)
class Formats:
    """The formats a document's facts were made in: a run reuses only what it would make."""

    inspection: int  # builder.inspect.wheels.SCHEMA
    layer: str  # builder.layers.layer.LAYER_FORMAT
    root: str  # where the distribution layers install (builder.plan.plan.EXTRA_DEPS)
    bytecode: str  # builder.layers.bytecode.BYTECODE_FORMAT


class LaidOutRecord(TypedDict):
    """A distribution layer as the document holds it."""

    wheels: list[str]
    shadowed: list[str]
    diff_id: str
    size: int
    sde: int


@dataclass(frozen=True)
class LaidOut:
    """One distribution layer: the wheels it holds (lock order), the files it leaves to a later
    distribution, and its tar's diff ID, size and date."""

    wheels: tuple[str, ...]
    shadowed: tuple[str, ...]
    diff_id: str
    size: int
    sde: int

    def to_dict(self) -> LaidOutRecord:
        return LaidOutRecord(
            wheels=list(self.wheels),
            shadowed=list(self.shadowed),
            diff_id=self.diff_id,
            size=self.size,
            sde=self.sde,
        )


class CompiledRecord(TypedDict):
    """What one wheel's compile made (builder.layers.bytecode.compiled_record)."""

    compiled: int  # modules
    skipped: list[str]  # sources that did not compile


@dataclass(frozen=True)
class Bytecode:
    """The bytecode facts: the interpreter build that compiled it, what each wheel's compile
    made, and each bytecode layer (its wheels are the distribution layer's below it)."""

    interpreter: str
    wheels: Mapping[str, CompiledRecord]  # wheel sha256 -> its compile
    layers: tuple[LaidOut, ...]


@dataclass(frozen=True)
class BuildFacts:
    """The document: formats, each wheel's inspection record, each distribution layer, and
    the bytecode's facts when the images have bytecode."""

    formats: Formats
    inspections: Mapping[str, WheelRecord]  # wheel sha256 -> its record
    layers: tuple[LaidOut, ...]
    bytecode: Bytecode | None = None

    def document(self) -> bytes:
        """Canonical JSON: the same facts give the same bytes, so the same label."""
        formats = self.formats
        document: dict[str, object] = {
            "format": FORMAT,
            "formats": {
                "inspection": formats.inspection,
                "layer": formats.layer,
                "root": formats.root,
                "bytecode": formats.bytecode,
            },
            "wheels": {sha: dict(record) for sha, record in sorted(self.inspections.items())},
            "layers": [one.to_dict() for one in self.layers],
        }
        if self.bytecode is not None:
            document["bytecode"] = {
                "interpreter": self.bytecode.interpreter,
                "wheels": {sha: dict(one) for sha, one in sorted(self.bytecode.wheels.items())},
                "layers": [one.to_dict() for one in self.bytecode.layers],
            }
        return canonical(document)


def facts_of(
    formats: Formats,
    inspections: Sequence[WheelInspection],
    layers: Sequence[LaidOut],
    bytecode: Bytecode | None = None,
) -> BuildFacts:
    """A build's facts, each record normalized (as it reads back), each layer once."""
    records = {one.sha256: one.to_dict() for one in inspections}
    if bytecode is not None:
        bytecode = replace(bytecode, layers=_once(bytecode.layers))
    return BuildFacts(formats, records, _once(layers), bytecode)


def _once(layers: Sequence[LaidOut]) -> tuple[LaidOut, ...]:
    """Each layer once (every arch's stack names a pure wheel's)."""
    return tuple({one.diff_id: one for one in layers}.values())


def parse_facts(data: bytes) -> BuildFacts:
    """The document `data` is; ValueError when it is not one of this format."""
    document = json.loads(data)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} document")
    try:
        formats = document["formats"]
        found = Formats(
            int(formats["inspection"]),
            str(formats["layer"]),
            str(formats["root"]),
            str(formats["bytecode"]),
        )
        wheels = document["wheels"]
        layers = _layers(document["layers"])
        bytecode = None
        if (compiled := document.get("bytecode")) is not None:
            bytecode = Bytecode(
                str(compiled["interpreter"]),
                {
                    str(sha): CompiledRecord(
                        compiled=int(one["compiled"]), skipped=[str(s) for s in one["skipped"]]
                    )
                    for sha, one in compiled["wheels"].items()
                },
                _layers(compiled["layers"]),
            )
        records = {str(k): cast(WheelRecord, v) for k, v in wheels.items()}
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"malformed build facts ({error})") from None
    return BuildFacts(found, records, layers, bytecode)


def _layers(value: Iterable[Any]) -> tuple[LaidOut, ...]:
    return tuple(
        LaidOut(
            tuple(str(sha) for sha in one["wheels"]),
            tuple(str(path) for path in one["shadowed"]),
            str(one["diff_id"]),
            int(one["size"]),
            int(one["sde"]),
        )
        for one in value
    )


@dataclass(frozen=True)
class Reuse:
    """What a document may serve a run: inspections and layers, and the distributions both
    cover (neither inspected nor laid out again)."""

    inspections: Mapping[str, WheelInspection] = field(default_factory=dict)  # sha256 ->
    layers: tuple[LaidOut, ...] = ()
    distributions: frozenset[str] = frozenset()  # wheel sha256s
    # each wheel's bytecode: the layer holding it alone and whole, and what its compile made
    compiled: tuple[tuple[LaidOut, CompiledRecord], ...] = ()
    interpreter: str | None = None  # the build that compiled it: only it may use it


def reusable(
    facts: BuildFacts, formats: Formats, lock: Mapping[str, str], diff_ids: Sequence[str]
) -> Reuse:
    """What of `facts` a run may use: `lock` is its wheels (sha256 -> file name), `diff_ids`
    the layers the trusted image's config names.

    An inspection is used only for a wheel of the lock, of the same file name and sha256, in
    this run's schema, that reads as one; a layer only when every wheel it holds is in the lock,
    in this run's layer format and root, and the image holds it. A layer the image does not
    hold means the document is not the image's: ValueError, nothing of it is used.
    """
    held = set(diff_ids)
    named = (*facts.layers, *(facts.bytecode.layers if facts.bytecode else ()))
    if stray := [one.diff_id for one in named if one.diff_id not in held]:
        raise ValueError(f"it names layer {stray[0][:19]} that the image does not hold")
    inspections = {}
    if facts.formats.inspection == formats.inspection:
        for sha, record in facts.inspections.items():
            if (
                lock.get(sha) is not None
                and record.get("schema") == formats.inspection
                and record.get("sha256") == sha
                and record.get("filename") == lock[sha]
                and (inspection := _read(record)) is not None
            ):
                inspections[sha] = inspection
    same_layers = (facts.formats.layer, facts.formats.root) == (formats.layer, formats.root)
    layers = tuple(
        one
        for one in facts.layers
        if same_layers and one.wheels and all(sha in lock for sha in one.wheels)
    )
    laid = {sha for one in layers for sha in one.wheels}
    compiled = _compiled(facts, formats, lock)
    interpreter = facts.bytecode.interpreter if facts.bytecode else None
    return Reuse(inspections, layers, frozenset(laid & inspections.keys()), compiled, interpreter)


def _compiled(
    facts: BuildFacts, formats: Formats, lock: Mapping[str, str]
) -> tuple[tuple[LaidOut, CompiledRecord], ...]:
    """The bytecode layers that hold one wheel of the lock alone and whole (none left to a
    later distribution), made in this run's bytecode format and root, with its compile's
    record: what a wheel's compile would make is read back from them."""
    compiled = facts.bytecode
    same = (facts.formats.bytecode, facts.formats.root) == (formats.bytecode, formats.root)
    if compiled is None or not same:
        return ()
    return tuple(
        (one, compiled.wheels[one.wheels[0]])
        for one in compiled.layers
        if len(one.wheels) == 1
        and not one.shadowed
        and one.wheels[0] in lock
        and one.wheels[0] in compiled.wheels
    )


def _read(record: WheelRecord) -> WheelInspection | None:
    """The inspection a record holds; None when it does not read as one of its schema."""
    try:
        return WheelInspection.from_dict(record)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
