"""The plan a runner is handed: PLAN/plan.json, written beside the build context (issue 46).

`build … --no-build --output PLAN` renders the context; this module adds the one document a
later `part` or `merge` (builder.orchestration.runners.parts) reads instead of resolving again: the
plan itself (every field, so that the image a runner builds is the one a one-job run builds),
each arch's extras layers as the context holds them (their tars' facts, checked against the
files before anything is built), the planning run's settings whole (builder.config.Settings:
a part and a merge lay their own flags over them), the provenance's parameters (the runner
lacks the requirement files they hash), and the plan id every later step checks.

The plan and the settings are trees of frozen dataclasses, enums, tuples and paths: written
field by field (`_encode`) and read back from the dataclasses' own type hints (`_decode`), the
base's facts by their own `to_dict`/`from_dict`; JSON, never pickle: a CI artifact must not
run code.
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from builder.attest.provenance import BuildParameters
from builder.cache import Cache
from builder.config import Settings
from builder.context.render import add_to_output
from builder.errors import UserError
from builder.files import sha256_of
from builder.layers.extras import LAYER_FILE, ExtrasLayer, LayerKind, LayerRecord
from builder.layers.layer import Layer
from builder.oci.name import ImageRef
from builder.oci.v1 import digest_of
from builder.orchestration.prepare import build_parameters, finish, unmasked
from builder.plan.plan import Plan
from builder.resolve.resolution import redact
from builder.resolve.target import BaseFacts, BaseProfile

PLAN_FILE = "plan.json"
HERE = Path(".")  # the settings' output, as written: the plan's own directory
FACTS_FILE = "build-facts.json"  # beside it, when the plan has them
DOCUMENT_VERSION = 4  # a document of another version is refused, never guessed at (2: deep
# imports' requested distributions and skip patterns, the apt secrets' ids; 3: each arch's
# browser wiring, which a version-2 plan would silently lack; 4: the run's settings whole)


@dataclass(frozen=True)
class PlanId:
    """What names one plan: the extras hash (every arch's lock and apt set, and the base
    reference) and the base's digest. Every part and the merge carry it."""

    extras_hash: str
    base_digest: str

    def __str__(self) -> str:
        return f"{self.extras_hash}@{self.base_digest}"


@dataclass(frozen=True)
class PlanDocument:
    """What a runner needs of a plan besides the context's files."""

    plan_id: PlanId
    plan: Plan
    layers: Mapping[str, tuple[ExtrasLayer, ...]]  # arch -> its layers, tars in the context
    settings: Settings  # the planning run's: its parts verify, push and label alike
    parameters: BuildParameters
    facts: bytes | None = None  # the build facts a one-job run attaches (publish.build_facts)

    @property
    def apt_secrets(self) -> tuple[str, ...]:
        """The secret ids the plan's apt step mounts (each part is given them): the planning
        run's, when some arch has an apt step."""
        has_apt_step = any(arch.apt_packages for arch in self.plan.arches)
        return tuple(sorted(self.settings.asked.apt_secrets)) if has_apt_step else ()


def write_plan(plan: Plan, settings: Settings, cache: Cache) -> Path:
    """PLAN/plan.json for the context `prepare` just wrote to the run's output: the layers
    are the ones it wrote (found in the cache by the plan, as the build would find them)."""
    finished = finish(plan, settings, cache)
    plan_id = PlanId(settings.extras_hash, plan.base.digest or "")
    parameters = build_parameters(plan, settings)
    document = PlanDocument(plan_id, plan, finished.layers, settings, parameters, finished.facts)
    return write_document(settings.asked.output, document)


def write_document(output: Path, document: PlanDocument) -> Path:
    """PLAN/plan.json, the layers named by their file in the context, and the build facts
    beside it unless a remembered secret is in them (written masked they would not be the
    bytes plan.json names; the parts' images then go without facts)."""
    facts = unmasked(document.facts)
    layers = {
        arch: [_layer_record(one) for one in stack] for arch, stack in document.layers.items()
    }
    body = {
        "version": DOCUMENT_VERSION,
        "plan_id": dataclasses.asdict(document.plan_id),
        "plan": _encode(document.plan),
        "layers": layers,
        "settings": _encode(_portable(document.settings, HERE)),
        "platform_version": document.settings.platform_version,  # for a reader: derived
        "parameters": _encode(document.parameters),
        "facts": digest_of(facts) if facts else None,
    }
    if facts:  # beside it: the parts attach these bytes, which the label names
        add_to_output(output, FACTS_FILE, facts)
    # listed in the context's marker: a next run into the same --output replaces it as its own
    add_to_output(output, PLAN_FILE, (json.dumps(body, indent=1, sort_keys=True) + "\n").encode())
    return output / PLAN_FILE


def read_document(plan_dir: Path) -> PlanDocument:
    """PLAN/plan.json, each layer's tar found in PLAN; one UserError naming what is wrong."""
    path = plan_dir / PLAN_FILE
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{path}: no plan here (write one with --push REPO --no-build --output PLAN)"
        ) from None
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: unreadable plan ({error})") from None
    if not isinstance(body, dict) or body.get("version") != DOCUMENT_VERSION:
        raise UserError(f"{path}: not a plan of this tool's version {DOCUMENT_VERSION}")
    try:
        plan = _decode(Plan, body["plan"])
        layers = {
            arch: tuple(_layer(plan_dir, arch, n, one) for n, one in enumerate(stack, 1))
            for arch, stack in body["layers"].items()
        }
        settings = _portable(_decode(Settings, body["settings"]), plan_dir)
        parameters = _decode(BuildParameters, body["parameters"])
        facts = _facts(plan_dir, body.get("facts"))
        document = PlanDocument(
            PlanId(**body["plan_id"]), plan, layers, settings, parameters, facts
        )
        derived = body["platform_version"]
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"{path}: malformed plan ({error!r})") from None
    if derived != settings.platform_version:
        raise UserError(f"{path}: its platform version {derived!r} is not its settings'")
    return document


def _portable(settings: Settings, output: Path) -> Settings:
    """`settings` as the document holds them: as of the plan's directory `output`, without
    the planning machine's cache (a runner opens its own, --cache-dir) and the wheelhouses'
    credentials (a runner resolves nothing; a CI artifact carries no token). Written as of
    its own directory (HERE), so that the same plan into another --output, from another
    cache, writes the same bytes; read back as of the directory it is read from."""
    asked = dataclasses.replace(
        settings.asked,
        output=output,
        cache_dir=None,
        find_links=tuple(redact(location) for location in settings.asked.find_links),
    )
    return dataclasses.replace(settings, asked=asked)


def _facts(plan_dir: Path, digest: object) -> bytes | None:
    """The build facts beside plan.json, the ones it names (None: it names none)."""
    if digest is None:
        return None
    path = plan_dir / FACTS_FILE
    try:
        facts = path.read_bytes()
    except OSError as error:
        raise UserError(f"{path}: the plan's build facts are unreadable ({error})") from None
    if digest_of(facts) != digest:
        raise UserError(f"{path}: not the build facts the plan names ({digest})")
    return facts


def check_layers(document: PlanDocument, arch: str) -> None:
    """Each of `arch`'s layer tars is the one planned: its size and sha256 (its diff ID)."""
    for one in document.layers.get(arch, ()):
        layer = one.layer
        if not layer.path.is_file() or layer.path.stat().st_size != layer.size:
            raise UserError(f"{layer.path}: missing or not the planned layer ({layer.size} bytes)")
        if f"sha256:{sha256_of(layer.path)}" != layer.diff_id:
            raise UserError(f"{layer.path}: its content is not the planned {layer.diff_id}")


def _layer_record(one: ExtrasLayer) -> LayerRecord:
    """A layer as the cache records one (builder.layers.extras), its tar named by position."""
    return LayerRecord(
        kind=str(one.kind),
        names=list(one.names),
        label=one.label,
        diff_id=one.layer.diff_id,
        size=one.layer.size,
        sde=one.layer.source_date_epoch,
        wheels=list(one.wheels),
        shadowed=sorted(one.shadowed),
    )


def _layer(plan_dir: Path, arch: str, index: int, record: LayerRecord) -> ExtrasLayer:
    path = plan_dir / LAYER_FILE.format(arch=arch, index=index)
    layer = Layer(path, record["diff_id"], record["size"], record["sde"])
    return ExtrasLayer(
        LayerKind(record["kind"]),
        tuple(record["names"]),
        record["label"],
        layer,
        tuple(record["wheels"]),
        frozenset(record["shadowed"]),
    )


def _encode(value: object) -> Any:
    """A dataclass tree as JSON values; the base profile by its own record."""
    if isinstance(value, BaseProfile):
        reference = _encode(value.reference)  # its fields: parsed once, where it entered
        return {**value.to_dict(), "source": value.source, "reference": reference}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): _encode(item) for key, item in value.items()}
    if isinstance(value, (tuple, list, frozenset, set)):
        items = [_encode(item) for item in value]
        return sorted(items) if isinstance(value, (frozenset, set)) else items
    return value


def _decode(kind: Any, data: Any) -> Any:
    """`data` as a value of the type hint `kind` (what `_encode` wrote)."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is BaseProfile:
        facts = BaseFacts.from_dict(data)
        reference = _decode(ImageRef, data["reference"])
        return BaseProfile.of(facts, reference, data["digest"], data["source"])
    if origin in (Union, types.UnionType):
        if data is None:
            return None
        return _decode(next(a for a in args if a is not type(None)), data)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = get_type_hints(kind)
        names = [f.name for f in dataclasses.fields(kind) if f.init]
        return kind(**{name: _decode(hints[name], data[name]) for name in names if name in data})
    if isinstance(kind, type) and issubclass(kind, (Enum, Path)):
        return kind(data)
    if origin is tuple:
        item = args[0] if args else Any
        return tuple(_decode(item, one) for one in data)
    if origin is frozenset:
        return frozenset(_decode(args[0], one) for one in data)
    if origin in (Mapping, dict):
        return {key: _decode(args[1], one) for key, one in data.items()}
    return data
