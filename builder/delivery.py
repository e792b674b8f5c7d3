"""One delivery: verify every arch's image, write them and their index, point the template.

Two producers make the per-arch images: builder.produce_build (BuildKit builds each arch's
system stage, the tool assembles the extras layers on it) and builder.produce_rebase (the
previous image's extras layers put on the new base). Each hands over `Produced` values: the
engine's name for the image to verify, the config verified, and how to get the OCI value
written (an `oci.v1.Image` and where its blobs are). `deliver` is the only place that sequences
producers, verification and writes: every arch is started at once (those native on their
engine first, so a native image never waits on emulation) and verified as it arrives, on the
engine that made it (`run.engines.for_arch(arch)`: builder.engines); only when every arch
passed is anything written (builder.oci.remote.write: each image by digest, then the index,
the tags last), so a failure leaves every tag and the template as they were. Then the
template is pointed at the digest (with the warm-pool warnings), and report.json and the
state are written.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from builder import credentials
from builder.analysis.plan import Plan
from builder.attachments import Attestable, attestable, plan_facts
from builder.attest.provenance import BuildParameters
from builder.blob_memory import blob_memory
from builder.cache import Cache
from builder.engines import Engines
from builder.errors import UserError
from builder.image.render import add_to_output, update_report
from builder.image.soci import soci_index, soci_record
from builder.image.template import TemplateChange, apply_hint, set_image, warm_pool_warnings
from builder.node_update import baseline, node_update, previous_images, total
from builder.oci.client import Registry
from builder.oci.name import ImageRef
from builder.oci.referrers import Artifact
from builder.oci.remote import Blobs, Written, write
from builder.oci.v1 import Image, Index, Platform
from builder.reporter import Reporter
from builder.upgrade import save_state, state_of
from builder.verify import VerifyReport, verify_image


@dataclass
class Produced:
    """One arch's image as a producer made it: what to verify, and the value to write."""

    arch: str
    engine_name: str  # what the verification runs: an image id, or repository@digest
    config: bytes  # the config verified: the image written must carry exactly these bytes
    value: Callable[[Registry, Path], tuple[Image, Blobs]]  # the image to write, when pushed
    record: dict[str, Any]  # this arch's report.json fields
    local_tag: str | None = None  # the build path tags each image in the engine
    extras_layers: list[dict[str, Any]] | None = None  # the extras tars' facts, for report.json
    early: Written | None = None  # what the producer wrote itself (a rebase that pulls)
    verification: VerifyReport | None = None
    digest: str | None = None  # its manifest, as written
    holding_layers: Mapping[str, str] = field(default_factory=dict)  # dist -> its layer's diff ID
    attestable: Attestable | None = None  # its SBOM and provenance facts, read before verifying


class Producer(Protocol):
    """Makes one arch's image at a time; `deliver` calls it for every arch at once."""

    @property
    def path(self) -> str:
        """What report.json and the state call this way of making images: build, rebase."""
        ...

    @property
    def label(self) -> str:
        """How a merged verification and an error name the images."""
        ...

    def announce(self, arch: str, emulated: bool) -> str:
        """The line said when `arch` starts."""
        ...

    def produce(self, arch: str) -> Produced: ...


@dataclass(frozen=True)
class Target:
    """Where the images go: the repository, the tag, the index's annotations."""

    repository: ImageRef
    tag: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    soci: bool = True  # attach a SOCI index (builder.image.soci) to each image


@dataclass(frozen=True)
class StateRecord:
    """Where a successful delivery records what it pushed, for a later `rebuild` to diff."""

    path: Path
    platform_version: str
    unpushed_too: bool = False  # a rebuild records its plan even when nothing was pushed


@dataclass(frozen=True)
class Delivery:
    """What happens to the images once made: verified, pushed, the template pointed at them."""

    verify: bool = True
    push: Target | None = None
    template: Path | None = None
    container: str | None = None
    warm_pools: tuple[Path, ...] = ()
    state: StateRecord | None = None
    parameters: BuildParameters = field(default_factory=lambda: BuildParameters(()))  # asked


@dataclass(frozen=True)
class Run:
    """What every step of one run shares: the engines, the cache, the output, the reporter."""

    engines: Engines  # each arch's engine: `run.engines.for_arch(arch)`
    cache: Cache
    output: Path  # the build context directory, where report.json is
    reporter: Reporter


@dataclass
class Outcome:
    """What a delivery did: each arch's image, the verification, the push, the template."""

    plan: Plan
    path: str = "build"
    produced: list[Produced] = field(default_factory=list)
    label: str | None = None  # how the images are named: a local tag, or the repository
    verification: VerifyReport | None = None  # every arch's checks, each line naming its arch
    pushed: Written | None = None  # with several arches: the index
    template_change: TemplateChange | None = None
    notes: list[str] = field(default_factory=list)
    node_update: dict[str, Any] | None = None  # a node holding the tag's previous image: cost

    @property
    def succeeded(self) -> bool:
        """Made (and pushed, when asked) with every verification passing."""
        return self.verification is None or self.verification.passed


def deliver(producer: Producer, plan: Plan, delivery: Delivery, run: Run) -> Outcome:
    """Produce and verify every arch; if all passed, write, point the template, record.

    A failed production raises (once the other arches end) and a failed verification returns
    before anything is written: no tag moves, the template is untouched, no state is recorded.
    """
    produced = _produce_and_verify(producer, plan, delivery, run)
    outcome = Outcome(plan, producer.path, produced, producer.label)
    outcome.verification = VerifyReport.merged(
        producer.label, [(p.arch, p.verification) for p in produced if p.verification]
    )
    if outcome.succeeded and delivery.push is not None:
        recorded = delivery.state.path if delivery.state else None
        written = _write(producer, produced, delivery.push, run, recorded)
        outcome.pushed, outcome.node_update = written
        if delivery.template:
            _point_template(outcome, delivery)
    _report(outcome, delivery, run.output)
    if delivery.state and outcome.succeeded and (outcome.pushed or delivery.state.unpushed_too):
        image = outcome.pushed.reference if outcome.pushed else None
        state = state_of(plan, delivery.state.platform_version, image, producer.path)
        save_state(delivery.state.path, state)
    return outcome


def _produce_and_verify(
    producer: Producer, plan: Plan, delivery: Delivery, run: Run
) -> list[Produced]:
    """Every arch at once; each read for its SBOM as it arrives, then verified against it,
    on its own engine."""
    started = datetime.now(UTC)
    repository = str(delivery.push.repository) if delivery.push else producer.label
    emulated = {a.arch: a.arch != run.engines.for_arch(a.arch).native for a in plan.arches}
    arches = sorted(emulated, key=lambda arch: emulated[arch])
    found: dict[str, Produced] = {}
    with ThreadPoolExecutor(max_workers=len(arches)) as pool:
        futures = {}
        for arch in arches:
            run.reporter.say(producer.announce(arch, emulated=emulated[arch]))
            futures[pool.submit(producer.produce, arch)] = arch
        for future in as_completed(futures):
            one = future.result()
            engine = run.engines.for_arch(one.arch)
            if delivery.verify or delivery.push:  # its SBOM is verified, or attached
                made = (one.arch, one.engine_name, one.config)
                facts = plan_facts(plan, made, repository, one.holding_layers)
                one.attestable = attestable(engine.client, facts, delivery.parameters, started)
            if delivery.verify:
                on = f" on {engine}" if engine.url else ""
                run.reporter.say(f"verifying {one.arch} image {one.engine_name} hardened{on} ...")
                one.verification = verify_image(
                    one.engine_name,
                    modules=plan.import_modules,
                    checks=plan.runtime_checks,
                    engine=engine,
                    sbom=one.attestable.sbom() if one.attestable else None,
                )
            found[one.arch] = one
    return [found[arch] for arch in arches]


def _write(
    producer: Producer, produced: list[Produced], target: Target, run: Run, state: Path | None
) -> tuple[Written, dict[str, Any]]:
    """Every arch's image by digest, then the tag names it (one arch) or an index of them;
    and what a node holding the previous image (the `state`'s, else the tag's) fetches and
    unpacks.

    The bytes written are checked to carry the config verified, byte for byte. Blobs other
    repositories of the registry hold are mounted from them (builder.blob_memory); what a node
    holding the tag's previous image must fetch and unpack goes in each arch's record.
    """
    registry = credentials.registry(target.repository, str(target.repository))
    previous, before = previous_images(
        *baseline(state, registry, target.tag), [one.arch for one in produced]
    )
    run.reporter.say(f"pushing {target.repository}:{target.tag} ...")
    with tempfile.TemporaryDirectory(prefix="bsi-push-") as scratch:
        images, blobs = [], Blobs()
        for one in produced:
            image, sources = one.value(registry, Path(scratch))
            if image.config_bytes != one.config:
                raise UserError(
                    f"{producer.path} of {producer.label}: the pushed config is not the one"
                    " verified"
                )
            images.append(image)
            blobs |= sources
        index = None
        if len(images) > 1:
            platforms = [Platform.linux(one.arch) for one in produced]
            index = Index.build(zip(platforms, images, strict=True), target.annotations)
        attached: dict[str, tuple[Artifact, ...]] = {
            image.digest: one.attestable.attachments(str(target.repository), image.digest)
            for one, image in zip(produced, images, strict=True)
            if one.attestable is not None
        }
        for one, image in zip(produced, images, strict=True) if target.soci else ():
            soci = soci_index(image, run.cache)  # attached with the SBOM: before the tags move
            one.record["soci"] = soci_record(image, soci)
            if soci is not None:
                attached[image.digest] = (*attached.get(image.digest, ()), soci)
        memory = blob_memory(run.cache)
        written = write(
            registry,
            images,
            blobs,
            index=index,
            tags=[target.tag],
            attachments=attached,
            memory=memory,
            written=_early_blobs(produced, images),
        )
    updates = []
    for one, image in zip(produced, images, strict=True):
        _record_attachments(one, run.output)
        one.digest = image.digest
        one.record["digest"] = image.digest
        if one.extras_layers:  # the tars' facts, and now their blobs' digests and sizes
            pushed = image.layers[-len(one.extras_layers) :]
            for fields, blob in zip(one.extras_layers, pushed, strict=True):
                fields |= {"digest": blob.digest, "size": blob.size}
        one.record["image_size"] = image.size
        updates.append(node_update(image, before.get(one.arch)))
        one.record["node_update"] = updates[-1].to_dict()
    for one in produced:
        if one.early is not None:
            written = written.after(one.early)
    return written, total(previous, updates)


def _early_blobs(produced: list[Produced], images: list[Image]) -> set[str]:
    """The blobs of the images a producer already wrote to the target (to pull them)."""
    return {
        descriptor.digest
        for one, image in zip(produced, images, strict=True)
        if one.early is not None
        for descriptor in (*image.layers, image.config_descriptor)
    }


def _record_attachments(one: Produced, output: Path) -> None:
    """The documents attached to `one`, written beside report.json and named in its record."""
    if one.attestable is None:
        return
    for name, document in one.attestable.documents.items():
        add_to_output(output, name, document)
    one.record["attachments"] = sorted(one.attestable.documents)


def _point_template(outcome: Outcome, delivery: Delivery) -> None:
    """Name the pushed digest in the template; warn of warm pools that keep old pods."""
    assert outcome.pushed is not None and delivery.template is not None
    change = set_image(delivery.template, outcome.pushed.reference, delivery.container)
    outcome.template_change = change
    outcome.notes.append(apply_hint(delivery.template))
    if change.template_name:  # a template without metadata.name is one no warm pool can refer to
        outcome.notes += warm_pool_warnings(
            (delivery.template, *delivery.warm_pools), change.template_name
        )


def _report(outcome: Outcome, delivery: Delivery, output: Path) -> None:
    """report.json's `image`: the path, each arch, the merged verification, what was pushed.

    With one arch its fields are also at the top, as a single image's report has them.
    """
    record: dict[str, Any] = {"path": outcome.path, "tag": outcome.label}
    produced = outcome.produced
    for one in produced:
        if one.verification is not None:
            one.record["verification"] = one.verification.to_dict()
        if one.extras_layers is not None:
            one.record["extras_layers"] = one.extras_layers
    if len(produced) == 1:
        record |= produced[0].record | {"arch": produced[0].arch}
    if outcome.verification is not None:
        record["verification"] = outcome.verification.to_dict()
    if pushed := outcome.pushed:
        record |= {"pushed": pushed.reference, "tags": list(pushed.tags)}
        record["bytes_pushed"] = pushed.bytes_uploaded
        record["bytes_mounted"] = pushed.bytes_mounted
        record["bytes_present"] = pushed.bytes_present
        record["node_update"] = outcome.node_update
        record["image_size"] = sum(one.record.get("image_size", 0) for one in produced)
        if len(produced) > 1:
            record["index"] = pushed.digest
        if delivery.template:
            record["template"] = str(delivery.template)
    record["arches"] = {one.arch: one.record for one in produced}
    layers = {one.arch: one.extras_layers for one in produced if one.extras_layers and one.digest}
    update_report(output, {"image": record}, layers)
