"""One delivery: produce every arch's image, verify it, publish what passed, report.

Two producers make the per-arch images: builder.orchestration.produce_build (BuildKit builds
each arch's system stage, the tool assembles the extras layers on it) and
builder.orchestration.produce_rebase (the previous image's extras layers put on the new base).
Each hands over `Produced` values: the engine's name for the image to verify, the config
verified, and how to get the OCI value written (an `oci.v1.Image` and where its blobs are).
`deliver` reads produce -> verify -> publish -> report: every arch is started at once (those
native on their engine first, so a native image never waits on emulation) and verified as it
arrives, on the engine that made it (`run.engines.for_arch(arch)`: builder.engines.per_arch);
only when every arch passed does the publisher (builder.publish.publisher: the push, the index,
the signatures, the attachments, the SOCI indexes, the template) write anything, so a failure
leaves every tag and the template as they were; then report.json and the state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from builder.attest.provenance import BuildParameters
from builder.cache import Cache
from builder.config import Settings
from builder.context.render import update_report
from builder.engines.connection import Engine, runs_emulated
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.oci.client import RepositoryClient
from builder.oci.remote import Blobs, Written
from builder.oci.v1 import Image
from builder.orchestration.report import ArchRecord, ImageRecord
from builder.plan.plan import ArchPlan, Plan
from builder.plan.program_needs import ProgramNeed
from builder.publish.node_update import NodeUpdate
from builder.publish.publisher import (
    ArchWritten,
    Made,
    Publishing,
    StateRecord,
    Target,
    pointing_of,
    publisher,
    record_state,
)
from builder.reporter import Reporter
from builder.retry import Retries
from builder.verify.report import VerifyReport

if TYPE_CHECKING:  # imported where used: ruamel and cryptography only when a run needs them,
    # the SBOM reading and the verifier (some 40 modules) only when a run verifies or pushes
    from builder.publish.attachments import Attestable
    from builder.publish.template import TemplateChange
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
    attestable: Attestable | None = None  # its SBOM and provenance facts, read beside verifying
    # Where this arch's wall time went, phase -> seconds: the producer's own phases (`build`,
    # BuildKit's system stage; `load`, the extras assembled on it and loaded; or `rebase`), then
    # the delivery's (`facts`, the SBOM's reading of the image; `verify`): an operator sees
    # what a CI minute paid for (report.json `seconds`).
    seconds: dict[str, float] = field(default_factory=dict)
    emulated: bool = False  # made and verified on an engine not of its arch (under qemu)
    facts: bytes | None = None  # the build facts attached with it (builder.publish.build_facts)

    def made(self) -> Made:
        """What the publisher takes of this arch, once verified."""
        reads = self.verification.first_import_reads if self.verification else ()
        extras = len(self.extras_layers) if self.extras_layers else 0
        return Made(
            self.arch,
            self.value,
            self.config,
            self.attestable,
            self.early,
            extras,
            reads,
            self.facts,
        )


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
class Delivery:
    """What happens to the images once made: verified, pushed, the template pointed at them."""

    settings: Settings  # the run's, whole: verify, strict, skip_modules, template, ...
    push: Target | None = None
    state: StateRecord | None = None
    parameters: BuildParameters = field(default_factory=lambda: BuildParameters(()))  # asked
    sign: SigningKey | None = None  # cosign signatures and attestations of what is pushed


@dataclass(frozen=True)
class Run:
    """What every step of one run shares: the engines, the cache, the reporter, and the retries
    of its registry requests (one budget; report.json records them). Where it writes is its
    settings' (`Delivery.settings`: the build context's directory, where report.json is)."""

    engines: Engines  # each arch's engine: `run.engines.for_arch(arch)`
    cache: Cache
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
    """Produce -> verify -> publish -> report: every arch made and verified; if all passed,
    the publisher (builder.publish.publisher) writes them and points the template; then
    report.json and the state.

    A failed production raises (once the other arches end) and a failed verification returns
    before anything is written: no tag moves, the template is untouched, no state is recorded.
    A failed push raises too, report.json recording the registry retries that led to it.
    """
    produced = _produce_and_verify(producer, plan, delivery, run)
    outcome = Outcome(plan, producer.path, produced, producer.label)
    outcome.verification = VerifyReport.merged(
        producer.label, [(p.arch, p.verification) for p in produced if p.verification]
    )
    output = delivery.settings.asked.output  # the build context's directory: report.json's
    if outcome.succeeded and delivery.push is not None:
        started = time.monotonic()
        try:
            published = publisher(_publishing(delivery, run), run.cache, output).publish(
                [one.made() for one in produced], f"{producer.path} of {producer.label}"
            )
        except UserError:  # a registry down midway: its retries are what the operator needs
            update_report(output, {"registry_retries": run.retries.to_list()})
            raise
        outcome.push_seconds = time.monotonic() - started
        outcome.pushed, outcome.node_update = published.written, published.node_update
        outcome.written, outcome.template_change = published.arches, published.template_change
        outcome.notes += published.notes
    _report(outcome, delivery, run)
    if delivery.state and outcome.succeeded and (outcome.pushed or delivery.state.unpushed_too):
        image = outcome.pushed.reference if outcome.pushed else None
        record_state(delivery.state, plan, image, producer.path)
    return outcome


def _publishing(delivery: Delivery, run: Run) -> Publishing:
    """What the run's publisher is given: the target, the run's reporter and retries, the key,
    the template and the state naming the image a node holds."""
    assert delivery.push is not None
    return Publishing(
        delivery.push,
        run.reporter,
        run.retries,
        delivery.sign,
        None if delivery.push.by_digest else pointing_of(delivery.settings.asked),
        delivery.state.path if delivery.state else None,
    )


def _produce_and_verify(
    producer: Producer, plan: Plan, delivery: Delivery, run: Run
) -> list[Produced]:
    """Every arch at once; each read for its SBOM as it arrives and verified beside that
    reading, on its own engine.

    The reading (a container of the image created to copy out dpkg's status and every
    METADATA: seconds on a large set) and the verification are independent until the `sbom`
    line: so the reading runs on a thread of its own, and the verification awaits it before
    its timed checks (race, flood, starve), which the reading would skew.
    A reading that fails raises here
    whether or not the verification got that far; a verification that raises first leaves the
    reading to finish (both pools wait for their threads) and raises its own error.
    """
    started = datetime.now(UTC)
    repository = str(delivery.push.repository) if delivery.push else producer.label
    emulated = {
        a.arch: runs_emulated(run.engines.for_arch(a.arch).native, a.arch) for a in plan.arches
    }
    arches = sorted(emulated, key=lambda arch: emulated[arch])
    found: dict[str, Produced] = {}
    reads = delivery.settings.asked.verify or delivery.push is not None  # verified, or attached
    with (
        ThreadPoolExecutor(max_workers=len(arches)) as pool,
        ThreadPoolExecutor(max_workers=len(arches)) as readers,
    ):
        futures = {}
        for arch in arches:
            run.reporter.say(producer.announce(arch, emulated=emulated[arch]))
            futures[pool.submit(producer.produce, arch)] = arch
        for future in as_completed(futures):
            one = future.result()
            one.emulated = emulated[one.arch]
            engine = run.engines.for_arch(one.arch)
            facts = None
            if reads:
                read = partial(_read_facts, plan, one, repository, delivery.parameters, started)
                facts = readers.submit(read, engine, run)
            verified = None
            if delivery.settings.asked.verify:
                assert facts is not None
                verified = _verified(one, plan, delivery, engine, facts, run.reporter)
            if facts is not None:
                one.attestable, one.seconds["facts"] = facts.result()
            if verified is not None:
                one.verification, one.seconds["verify"] = verified
            found[one.arch] = one
    return [found[arch] for arch in arches]


def _read_facts(
    plan: Plan,
    one: Produced,
    repository: str,
    parameters: BuildParameters,
    started: datetime,
    engine: Engine,
    run: Run,
) -> tuple[Attestable, float]:
    """One arch image's SBOM and provenance facts, and how long reading them took."""
    from builder.publish.attachments import attestable, plan_facts

    began = time.monotonic()
    made = (one.arch, one.engine_name, one.config)
    facts = plan_facts(plan, made, repository, one.holding_layers, run.reporter, run.retries)
    return attestable(engine.client, facts, parameters, started), time.monotonic() - began


def _verified(
    one: Produced,
    plan: Plan,
    delivery: Delivery,
    engine: Engine,
    facts: Future[tuple[Attestable, float]],
    reporter: Reporter,
) -> tuple[VerifyReport, float]:
    """One arch image verified hardened on `engine`, its SBOM awaited from `facts` only before
    the timed checks; and how long verifying took."""
    from builder.verify.run import verify_image

    on = f" on {engine}" if engine.url else ""
    reporter.say(f"verifying {one.arch} image {one.engine_name} hardened{on} ...")
    arch_plan = next(a for a in plan.arches if a.arch == one.arch)
    began = time.monotonic()
    verification = verify_image(
        one.engine_name,
        modules=plan.import_modules,
        checks=plan.runtime_checks,
        engine=engine,
        sbom=lambda: facts.result()[0].sbom(),
        installed=installed_on(arch_plan, plan.requested, delivery.settings.asked.skip_modules),
    )
    verification.strict = delivery.settings.asked.strict
    return verification, time.monotonic() - began


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
        delivery.settings.asked.template,
        outcome.push_seconds,
    )
    additions = {"image": record.to_dict(), "registry_retries": run.retries.to_list()}
    update_report(delivery.settings.asked.output, additions, record.pushed_layers())
