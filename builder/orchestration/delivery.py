"""One delivery: verify every arch's image, write them and their index, point the template.

Two producers make the per-arch images: builder.orchestration.produce_build (BuildKit builds
each arch's system stage, the tool assembles the extras layers on it) and
builder.orchestration.produce_rebase (the previous image's extras layers put on the new base).
Each hands over `Produced` values: the engine's name for the image to verify, the config
verified, and how to get the OCI value written (an `oci.v1.Image` and where its blobs are).
`deliver` is the only place that sequences producers, verification and writes: every arch is
started at once (those native on their engine first, so a native image never waits on emulation)
and verified as it arrives, on the engine that made it (`run.engines.for_arch(arch)`:
builder.engines.per_arch); only when every arch passed is anything written
(builder.oci.remote.write: each image by digest with its SBOM, provenance and SOCI index
attached, builder.layers.soci, then the index, the tags last; with a signing key the cosign
signatures and attestations go in before the tags, builder.sign), so a failure
leaves every tag and the template as they were. The template's new text (and the warm-pool
warnings) is rendered once the digest is known and before anything is written
(builder.publish.template.Pointing), so after the push it is only written; then report.json
and the state.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from builder import credentials
from builder.attest.provenance import BuildParameters
from builder.cache import Cache
from builder.config import RunSettings
from builder.context.render import add_to_output, update_report
from builder.engines.connection import runs_emulated
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import Artifact, Attachment
from builder.oci.remote import Blobs, Tagged, Written, sign_and_tag, write
from builder.oci.v1 import Image, Index, Platform
from builder.orchestration.node_update import (
    NodeUpdate,
    baseline,
    node_update,
    previous_images,
    total,
)
from builder.orchestration.report import ArchRecord, ArchWritten, ImageRecord
from builder.plan.plan import ArchPlan, Plan
from builder.plan.program_needs import ProgramNeed
from builder.publish.blob_memory import blob_memory
from builder.publish.state import save_state, state_of
from builder.reporter import Reporter
from builder.retry import Retries
from builder.verify.report import VerifyReport

if TYPE_CHECKING:  # imported where used: ruamel and cryptography only when a run needs them,
    # the SBOM reading and the verifier (some 40 modules) only when a run verifies or pushes
    from builder.layers.soci import SociRecord
    from builder.oci.ztoc import SociIndex
    from builder.publish.attachments import Attestable
    from builder.publish.template import Pointing, TemplateChange
    from builder.sign.keys import SigningKey
    from builder.verify.programs import ProgramExpectation
    from builder.verify.run import Installed


@dataclass
class Produced:
    """One arch's image as a producer made it: what to verify, and the value to write."""

    arch: str
    engine_name: str  # what the verification runs: an image id, or repository@digest
    config: bytes  # the config verified: the image written must carry exactly these bytes
    value: Callable[
        [RepositoryClient, Path], tuple[Image, Blobs]
    ]  # the image to write, when pushed
    record: Mapping[str, object]  # the producer's own report.json fields for this arch
    local_tag: str | None = None  # the build path tags each image in the engine
    extras_layers: Sequence[Mapping[str, object]] | None = None  # the tars' facts, for the report
    early: Written | None = None  # what the producer wrote itself (a rebase that pulls)
    verification: VerifyReport | None = None
    holding_layers: Mapping[str, str] = field(default_factory=dict)  # dist -> its layer's diff ID
    attestable: Attestable | None = None  # its SBOM and provenance facts, read before verifying
    # Where this arch's wall time went, phase -> seconds: the producer's own phases (`build`,
    # BuildKit's system stage; `load`, the extras assembled on it and loaded; or `rebase`), then
    # the delivery's (`facts`, the SBOM's reading of the image; `verify`): an operator sees
    # what a CI minute paid for (report.json `seconds`).
    seconds: dict[str, float] = field(default_factory=dict)
    emulated: bool = False  # made and verified on an engine not of its arch (under qemu)


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
    soci: bool = True  # attach a SOCI index (builder.layers.soci) to each image
    base: ImageRef | None = None  # the images' base: its own SOCI index lends its layers' ztocs
    by_digest: bool = False  # a runner's part (builder.orchestration.runners.parts): no tag moves


@dataclass(frozen=True)
class StateRecord:
    """Where a successful delivery records what it pushed, for a later `rebuild` to diff."""

    path: Path
    platform_version: str
    unpushed_too: bool = False  # a rebuild records its plan even when nothing was pushed


@dataclass(frozen=True)
class Delivery:
    """What happens to the images once made: verified, pushed, the template pointed at them."""

    settings: RunSettings  # verify, strict, skip_modules, template, container, warm_pools
    push: Target | None = None
    state: StateRecord | None = None
    parameters: BuildParameters = field(default_factory=lambda: BuildParameters(()))  # asked
    sign: SigningKey | None = None  # cosign signatures and attestations of what is pushed


@dataclass(frozen=True)
class Run:
    """What every step of one run shares: the engines, the cache, the output, the reporter, and
    the retries of its registry requests (one budget; report.json records them)."""

    engines: Engines  # each arch's engine: `run.engines.for_arch(arch)`
    cache: Cache
    output: Path  # the build context directory, where report.json is
    reporter: Reporter
    retries: Retries = field(default_factory=Retries)


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
    node_update: NodeUpdate | None = None  # a node holding the tag's previous image: cost
    written: Mapping[str, ArchWritten] = field(default_factory=dict)  # arch -> what writing it did
    push_seconds: float | None = None  # the write, attachments and signatures included

    @property
    def succeeded(self) -> bool:
        """Made (and pushed, when asked) with every verification passing."""
        return self.verification is None or self.verification.passed


def deliver(producer: Producer, plan: Plan, delivery: Delivery, run: Run) -> Outcome:
    """Produce and verify every arch; if all passed, write, point the template, record.

    A failed production raises (once the other arches end) and a failed verification returns
    before anything is written: no tag moves, the template is untouched, no state is recorded.
    A failed push raises too, report.json recording the registry retries that led to it.
    """
    produced = _produce_and_verify(producer, plan, delivery, run)
    outcome = Outcome(plan, producer.path, produced, producer.label)
    outcome.verification = VerifyReport.merged(
        producer.label, [(p.arch, p.verification) for p in produced if p.verification]
    )
    if outcome.succeeded and delivery.push is not None:
        recorded = delivery.state.path if delivery.state else None
        pointing = pointing_of(delivery.settings)
        started = time.monotonic()
        try:
            outcome.pushed, outcome.node_update, outcome.written = _write(
                producer, produced, delivery.push, run, (recorded, pointing), delivery.sign
            )
        except UserError:  # a registry down midway: its retries are what the operator needs
            update_report(run.output, {"registry_retries": run.retries.to_list()})
            raise
        outcome.push_seconds = time.monotonic() - started
        if pointing is not None:  # rendered before the push: only the write is left
            outcome.template_change = pointing.write(outcome.pushed.reference)
            outcome.notes += pointing.notes
    _report(outcome, delivery, run)
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
    emulated = {
        a.arch: runs_emulated(run.engines.for_arch(a.arch).native, a.arch) for a in plan.arches
    }
    arches = sorted(emulated, key=lambda arch: emulated[arch])
    found: dict[str, Produced] = {}
    with ThreadPoolExecutor(max_workers=len(arches)) as pool:
        futures = {}
        for arch in arches:
            run.reporter.say(producer.announce(arch, emulated=emulated[arch]))
            futures[pool.submit(producer.produce, arch)] = arch
        for future in as_completed(futures):
            one = future.result()
            one.emulated = emulated[one.arch]
            engine = run.engines.for_arch(one.arch)
            if delivery.settings.verify or delivery.push:  # its SBOM is verified, or attached
                from builder.publish.attachments import attestable, plan_facts

                began = time.monotonic()
                made = (one.arch, one.engine_name, one.config)
                facts = plan_facts(
                    plan, made, repository, one.holding_layers, run.reporter, run.retries
                )
                one.attestable = attestable(engine.client, facts, delivery.parameters, started)
                one.seconds["facts"] = time.monotonic() - began
            if delivery.settings.verify:
                from builder.verify.run import verify_image

                on = f" on {engine}" if engine.url else ""
                run.reporter.say(f"verifying {one.arch} image {one.engine_name} hardened{on} ...")
                arch_plan = next(a for a in plan.arches if a.arch == one.arch)
                began = time.monotonic()
                one.verification = verify_image(
                    one.engine_name,
                    modules=plan.import_modules,
                    checks=plan.runtime_checks,
                    engine=engine,
                    sbom=one.attestable.sbom() if one.attestable else None,
                    installed=installed_on(
                        arch_plan, plan.requested, delivery.settings.skip_modules
                    ),
                )
                one.verification.strict = delivery.settings.strict
                one.seconds["verify"] = time.monotonic() - began
            found[one.arch] = one
    return [found[arch] for arch in arches]


def installed_on(
    arch_plan: ArchPlan, requested: Sequence[str], skip_modules: Sequence[str]
) -> Installed:
    """What verification asks of one arch's image beyond the named imports: every module of
    each requested distribution that arch installs (but those `skip_modules` match), its use
    checks, and the programs the plan installs."""
    from builder.verify.deep.imports import DeepOptions
    from builder.verify.run import Installed

    here = {wheel.name for wheel in arch_plan.wheels}
    return Installed(
        [name for name in requested if name in here],
        program_expectations(arch_plan.installed_programs()),
        deep=DeepOptions(skip=tuple(skip_modules)),
    )


def program_expectations(needs: Sequence[ProgramNeed]) -> tuple[ProgramExpectation, ...]:
    """What verification asks of the image for the programs a plan found: per distribution
    that runs one, the program and its package (left out, when the operator said so)."""
    from builder.verify.programs import ProgramExpectation

    return tuple(
        ProgramExpectation(pin, need.program, need.package, need.left_out)
        for need in needs
        for pin in need.distributions
    )


def _write(
    producer: Producer,
    produced: list[Produced],
    target: Target,
    run: Run,
    after: tuple[Path | None, Pointing | None],
    key: SigningKey | None = None,
) -> tuple[Written, NodeUpdate, dict[str, ArchWritten]]:
    """Every arch's image by digest, then the tag names it (one arch) or an index of them;
    what a node holding the previous image (the state's, `after[0]`, else the tag's) fetches
    and unpacks, in all; and what writing each arch recorded. The template (`after[1]`) is
    rendered for the digest before anything is written, so a template that cannot take it
    stops the push.

    The bytes written are checked to carry the config verified, byte for byte. Blobs other
    repositories of the registry hold are mounted from them (builder.publish.blob_memory).
    With a signing key, each image and the index are signed (and each image's SBOM and
    provenance attested) after the manifests and before the tag moves (builder.sign).
    """
    registry = credentials.registry(target.repository, str(target.repository), run.retries)
    state, pointing = after
    previous, before = previous_images(
        *baseline(state, registry, target.tag), [one.arch for one in produced], run.reporter
    )
    named = " by digest" if target.by_digest else f":{target.tag}"
    run.reporter.say(f"pushing {target.repository}{named} ...")
    with tempfile.TemporaryDirectory(prefix="bsi-push-") as scratch:
        images, blobs = _images(producer, produced, registry, Path(scratch))
        index = None
        if len(images) > 1:
            platforms = [Platform.linux(one.arch) for one in produced]
            index = Index.build(zip(platforms, images, strict=True), target.annotations)
        if pointing is not None:
            pointing.render(f"{registry.label}@{(images[0] if index is None else index).digest}")
        attached = {
            image.digest: one.attestable.attachments(str(target.repository), image.digest)
            for one, image in zip(produced, images, strict=True)
            if one.attestable is not None
        }
        soci = _soci_indexes(produced, images, target.base, run) if target.soci else {}
        written = write(
            registry,
            images,
            blobs,
            index=index,
            tags=[] if key or target.by_digest else [target.tag],  # signed: after the signatures
            attachments=_with_soci(attached, soci),  # in before the tags move, like the SBOM
            memory=blob_memory(run.cache),
            written=_early_blobs(produced, images),
        )
        if key is not None:  # every manifest is in: sign them, then move the tag
            signed = _signatures(registry, key, target, (images, index), attached, run.reporter)
            tags = [] if target.by_digest else [target.tag]
            written = sign_and_tag(registry, written, index or images[0], signed, tags)
    recorded = _recorded(produced, images, before, soci, run.output)
    for one in produced:
        if one.early is not None:
            written = written.after(one.early)
    return written, total(previous, [r.node_update for r in recorded.values()]), recorded


def publish_index(
    registry: RepositoryClient,
    images: Sequence[tuple[str, Image]],
    target: Target,
    key: SigningKey | None,
    reporter: Reporter,
    pointing: Pointing | None = None,
) -> Written:
    """What `_write` does once the images are in, for arch images other jobs pushed by digest
    (builder.orchestration.runners.parts): their index (one arch: the image itself) written,
    signed with `key` (each part signed its own image), then the tag moved. The template
    (`pointing`) is rendered for the digest before anything is written."""
    index = None
    if len(images) > 1:
        platforms = [Platform.linux(arch) for arch, _ in images]
        index = Index.build(zip(platforms, [i for _, i in images], strict=True), target.annotations)
    if pointing is not None:
        pointing.render(f"{registry.label}@{(images[0][1] if index is None else index).digest}")
    alone = [image for _, image in images] if index is None else []
    reporter.say(f"pushing {target.repository}:{target.tag} ...")
    written = write(registry, alone, Blobs(), index=index, tags=[] if key else [target.tag])
    if key is not None:
        signed = _signatures(registry, key, target, (alone, index), {}, reporter)
        written = sign_and_tag(registry, written, index or alone[0], signed, [target.tag])
    return written


def _images(
    producer: Producer, produced: Sequence[Produced], registry: RepositoryClient, scratch: Path
) -> tuple[list[Image], Blobs]:
    """Each arch's image to write, and where its blobs are; each must carry the config
    verified, byte for byte."""
    images, blobs = [], Blobs()
    for one in produced:
        image, sources = one.value(registry, scratch)
        if image.config_bytes != one.config:
            raise UserError(
                f"{producer.path} of {producer.label}: the pushed config is not the one verified"
            )
        images.append(image)
        blobs |= sources
    return images, blobs


def _signatures(
    registry: RepositoryClient,
    key: SigningKey,
    target: Target,
    written: tuple[Sequence[Image], Index | None],
    attached: Mapping[str, Sequence[Attachment]],
    reporter: Reporter,
) -> list[Tagged]:
    """The cosign signatures of every image written and of their index (if any), and the
    attestations of each image's SBOM and provenance (builder.sign)."""
    from builder.sign.cosign import signed_push

    reporter.say(f"signing with {key.source} (cosign format, no transparency log)")
    images, index = written
    digests = [image.digest for image in images]
    top = index.digest if index is not None else None
    return signed_push(registry, key, str(target.repository), digests, top, attached)


def _recorded(
    produced: Sequence[Produced],
    images: Sequence[Image],
    before: Mapping[str, Image],
    soci: Mapping[str, tuple[SociIndex | None, SociRecord]],
    output: Path,
) -> dict[str, ArchWritten]:
    """What writing each arch did, for report.json: its digest and size, what a node holding
    its previous image (`before`) fetches, its extras layers, its attachments (written beside
    report.json) and its SOCI index."""
    return {
        one.arch: ArchWritten(
            image.digest,
            image.size,
            node_update(image, before.get(one.arch)),
            tuple(image.layers[-len(one.extras_layers) :]) if one.extras_layers else (),
            _write_attachments(one, output),
            soci[image.digest][1] if image.digest in soci else None,
        )
        for one, image in zip(produced, images, strict=True)
    }


def _soci_indexes(
    produced: Sequence[Produced], images: Sequence[Image], base: ImageRef | None, run: Run
) -> dict[str, tuple[SociIndex | None, SociRecord]]:
    """Each image's SOCI index (None: no layer of it is indexed) and its report record (with
    what its verification's import of the set read, when it was verified)."""
    from builder.layers.soci import base_ztocs, soci_index, soci_record  # flatbuffers: a push's

    found = {}
    for one, image in zip(produced, images, strict=True):
        index = soci_index(image, run.cache, base_ztocs(base, image, run.cache, run.retries))
        reads = one.verification.first_import_reads if one.verification else ()
        found[image.digest] = (index, soci_record(image, index, reads))
    return found


def _with_soci(
    attached: Mapping[str, Sequence[Artifact]],
    soci: Mapping[str, tuple[SociIndex | None, SociRecord]],
) -> dict[str, tuple[Artifact, ...]]:
    """The attestations, and each image's SOCI index beside them (not attested: cosign attests
    documents about the image; `verify` checks the ztocs against the layers themselves)."""
    found = {digest: tuple(artifacts) for digest, artifacts in attached.items()}
    for digest, (index, _) in soci.items():
        if index is not None:
            found[digest] = (*found.get(digest, ()), index)
    return found


def _early_blobs(produced: list[Produced], images: list[Image]) -> set[str]:
    """The blobs of the images a producer already wrote to the target (to pull them)."""
    return {
        descriptor.digest
        for one, image in zip(produced, images, strict=True)
        if one.early is not None
        for descriptor in (*image.layers, image.config_descriptor)
    }


def _write_attachments(one: Produced, output: Path) -> tuple[str, ...] | None:
    """The documents attached to `one`, written beside report.json; their names."""
    if one.attestable is None:
        return None
    for name, document in one.attestable.documents.items():
        add_to_output(output, name, document)
    return tuple(sorted(one.attestable.documents))


def pointing_of(settings: RunSettings) -> Pointing | None:
    """The run's template and warm pools (None: no template to point)."""
    return template_pointing(settings.template, settings.container, settings.warm_pools)


def template_pointing(
    template: Path | None, container: str | None, warm_pools: tuple[Path, ...] = ()
) -> Pointing | None:
    """`template` to point at what is pushed (None: none given)."""
    if template is None:
        return None
    from builder.publish.template import Pointing  # ruamel: only a run with a template

    return Pointing(template, container, warm_pools)


def _report(outcome: Outcome, delivery: Delivery, run: Run) -> None:
    """report.json's `image` (builder.orchestration.report), merged into the context's, and
    `registry_retries`: each registry request of the run tried again (builder.retry)."""
    arches = tuple(
        ArchRecord(
            one.arch,
            one.record,
            one.extras_layers,
            one.verification,
            outcome.written.get(one.arch),
            one.seconds,
        )
        for one in outcome.produced
    )
    record = ImageRecord(
        outcome.path,
        outcome.label,
        arches,
        outcome.verification,
        outcome.pushed,
        outcome.node_update,
        delivery.settings.template,
        outcome.push_seconds,
    )
    additions = {"image": record.to_dict(), "registry_retries": run.retries.to_list()}
    update_report(run.output, additions, record.pushed_layers())
