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
label costs nothing verification did not see. A reader takes only the attached document that
hashes to the label, and every layer it names must be one of the config's diff IDs; since REF's
pusher chose that config too, a pulled layer is also checked against the run's own wheels
before it counts (builder.layers.layer.pulled_mismatch). Bytecode is not in the document: a
`.pyc` cannot be checked against its source without compiling it, so a run always compiles.
The document holds what the run computed from its wheels and its layers (records normalized
through `WheelInspection`), never what its cache happened to hold, so a cold build and a warm
one of the same wheels, laid out the same way, label the same image the same way.

Pure: the document's shape, and the decision which of a run's wheels it may serve
(`reusable`); reading and pulling are cache_from's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from builder.errors import UserError
from builder.inspect.wheels import SCHEMA, WheelInspection, WheelRecord, parse_filename
from builder.layers.install_layout import LAYER_FORMAT
from builder.oci.v1 import canonical
from builder.plan.plan import EXTRA_DEPS

FACTS_TYPE = "application/vnd.build-sandbox-image.facts.v1+json"  # the attachment's type
FACTS_LABEL = "org.build-sandbox-image.facts"  # the config label: sha256 of the document
FORMAT = "build-facts/2"  # bump when the document's shape changes


@dataclass(frozen=True)
class Formats:
    """The formats a document's facts were made in: a run reuses only what it would make."""

    inspection: int  # builder.inspect.wheels.SCHEMA
    layer: str  # builder.layers.install_layout.LAYER_FORMAT
    root: str  # where the distribution layers install (builder.plan.plan.EXTRA_DEPS)


FORMATS = Formats(SCHEMA, LAYER_FORMAT, EXTRA_DEPS)  # what this tool makes, so reuses


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


@dataclass(frozen=True)
class BuildFacts:
    """The document: formats, each wheel's inspection record, each distribution layer."""

    formats: Formats
    inspections: Mapping[str, WheelRecord]  # wheel sha256 -> its record
    layers: tuple[LaidOut, ...]

    def document(self) -> bytes:
        """Canonical JSON: the same facts give the same bytes, so the same label."""
        formats = self.formats
        document: dict[str, object] = {
            "format": FORMAT,
            "formats": {
                "inspection": formats.inspection,
                "layer": formats.layer,
                "root": formats.root,
            },
            "wheels": {sha: dict(record) for sha, record in sorted(self.inspections.items())},
            "layers": [one.to_dict() for one in self.layers],
        }
        return canonical(document)


def facts_of(
    formats: Formats, inspections: Sequence[WheelInspection], layers: Sequence[LaidOut]
) -> BuildFacts:
    """A build's facts, each record normalized (as it reads back), each layer once."""
    records = {one.sha256: one.to_dict() for one in inspections}
    return BuildFacts(formats, records, _once(layers))


def _once(layers: Sequence[LaidOut]) -> tuple[LaidOut, ...]:
    """Each layer once (every arch's stack names a pure wheel's)."""
    return tuple({one.diff_id: one for one in layers}.values())


def parse_facts(data: bytes) -> BuildFacts:
    """The document `data` is; ValueError when it is not one of this format.

    REF's pusher wrote it, so every field is checked for its type before anything reads it,
    and no document, however deep or large its numbers, raises anything but ValueError.
    """
    try:
        document = json.loads(data)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        formats = _dict(document["formats"])
        found = Formats(
            _count(formats["inspection"]), _text(formats["layer"]), _text(formats["root"])
        )
        records = {
            _sha(sha): cast(WheelRecord, _dict(record))
            for sha, record in _dict(document["wheels"]).items()
        }
        layers = tuple(_laid(_dict(one)) for one in _list(document["layers"]))
    except (KeyError, TypeError, AttributeError, RecursionError, ArithmeticError) as error:
        raise ValueError(f"malformed build facts ({type(error).__name__})") from None
    return BuildFacts(found, records, layers)


def _laid(one: dict[str, object]) -> LaidOut:
    diff_id = _text(one["diff_id"])
    _sha(diff_id.removeprefix("sha256:"))
    if not diff_id.startswith("sha256:"):
        raise TypeError("a diff ID")
    return LaidOut(
        tuple(_sha(sha) for sha in _list(one["wheels"])),
        tuple(_text(path) for path in _list(one["shadowed"])),
        diff_id,
        _count(one["size"]),
        _count(one["sde"]),
    )


def _dict(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TypeError("not an object")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _count(value: object) -> int:
    """A non-negative integer (a JSON `true`, a float, 1e400 are not)."""
    if type(value) is not int or value < 0:
        raise TypeError("not a count")
    return value


def _sha(value: object) -> str:
    """A sha256 in hex, lower case, as a lock names a wheel."""
    text = _text(value)
    if len(text) != 64 or text.strip("0123456789abcdef"):
        raise TypeError("not a sha256")
    return text


@dataclass(frozen=True)
class Reuse:
    """What a document may serve a run: inspections and layers, and the distributions both
    cover (neither inspected nor laid out again)."""

    inspections: Mapping[str, WheelInspection] = field(default_factory=dict)  # sha256 ->
    layers: tuple[LaidOut, ...] = ()
    distributions: frozenset[str] = frozenset()  # wheel sha256s
    refused: tuple[str, ...] = ()  # wheels whose record is not of their file name: why


def reusable(
    facts: BuildFacts, formats: Formats, lock: Mapping[str, str], diff_ids: Sequence[str]
) -> Reuse:
    """What of `facts` a run may use: `lock` is its wheels (sha256 -> file name), `diff_ids`
    the layers the trusted image's config names.

    An inspection is used only for a wheel of the lock, of the same file name and sha256, in
    this run's schema, that reads as one; a layer only when every wheel it holds is in the lock,
    in this run's layer format and root, and the image holds it. A layer of wheels all in the
    lock that the image does not hold means the document is not the image's: ValueError,
    nothing of it is used. A layer holding a wheel not in the lock is ignored: a multi-arch
    REF's facts name every arch's layers, and only the run's arches' images were read.
    """
    held = set(diff_ids)
    ours = [one for one in facts.layers if one.wheels and all(sha in lock for sha in one.wheels)]
    if stray := [one.diff_id for one in ours if one.diff_id not in held]:
        raise ValueError(f"it names layer {stray[0][:19]} that the image does not hold")
    inspections, refused = {}, []
    if facts.formats.inspection == formats.inspection:
        for sha, record in facts.inspections.items():
            if (
                lock.get(sha) is not None
                and record.get("schema") == formats.inspection
                and record.get("sha256") == sha
                and record.get("filename") == lock[sha]
                and (inspection := _read(record)) is not None
            ):
                named = inspection.name, inspection.version, inspection.tags
                if _named(lock[sha]) != named:
                    refused.append(f"{lock[sha]}: its record is not of its name, version, tags")
                    continue
                inspections[sha] = inspection
    same_layers = (facts.formats.layer, facts.formats.root) == (formats.layer, formats.root)
    layers = tuple(ours) if same_layers else ()
    laid = {sha for one in layers for sha in one.wheels}
    distributions = frozenset(laid & inspections.keys())
    return Reuse(inspections, layers, distributions, tuple(refused))


def _named(filename: str) -> tuple[str, str, tuple[str, ...]] | None:
    """The name, version and tags a wheel's file name gives (as an inspection records them)."""
    try:
        return parse_filename(filename)
    except UserError:
        return None


def _read(record: WheelRecord) -> WheelInspection | None:
    """The inspection a record holds; None when it does not read as one of its schema, with
    each field of its type (what the plan reads of it)."""
    texts = ("filename", "sha256", "name", "version")
    lists = ("tags", "top_level", "requires")
    counts = ("schema", "modules", "size", "installed_size", "newest")
    try:
        for key in texts:
            _text(record[key])  # type: ignore[literal-required]
        for key in lists:
            [_text(one) for one in _list(record[key])]  # type: ignore[literal-required]
        for key in counts:
            _count(record[key])  # type: ignore[literal-required]
        inspection = WheelInspection.from_dict(record)
        if inspection.to_dict() != record:  # normalized as this run writes it, nothing more
            return None
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError, ArithmeticError):
        return None
    return inspection
