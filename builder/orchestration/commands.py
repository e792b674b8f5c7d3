"""What `build` and `rebuild` do after parsing: the plan, then a producer, then one delivery.

`build_images` makes every arch with BuildKit and the tool's assembly
(builder.orchestration.produce_build); `rebuild` re-plans against a new platform version and,
when something changed, takes the rebase path (builder.orchestration.produce_rebase: the same
extras on the new base) or the build path. Both end in builder.orchestration.delivery.deliver,
which verifies, writes, points the template, and records report.json and the state; `rebuild`
then names the new version in the user's config. `deliver_part` is a runner's one arch of a
written plan, pushed by digest (builder.orchestration.runners).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import docker

from builder.attest.provenance import BuildParameters
from builder.base.discover import base_profile
from builder.cache import Cache
from builder.config import (
    PipelineConfig,
    RunSettings,
    Settings,
    check_version_settable,
    set_platform_version,
    settings_of,
)
from builder.engines.per_arch import Engines, connect
from builder.layers.gzipped import ahead as gzip_ahead
from builder.oci.name import ImageRef
from builder.orchestration.delivery import Delivery, Outcome, Run, deliver
from builder.orchestration.prepare import (
    Finish,
    Grounds,
    build_parameters,
    finish,
    prepare,
    settle,
)
from builder.orchestration.produce_build import BuildProducer, SystemStages, target_arches
from builder.orchestration.produce_rebase import AptAhead, Previous, RebaseProducer
from builder.orchestration.runners.document import write_plan
from builder.orchestration.timeline import Timeline
from builder.plan.plan import Plan
from builder.publish.publisher import StateRecord, pointing_of, state_record, target_of
from builder.publish.state import (
    BuildState,
    changes,
    check_state,
    load_state,
    rebase_blocker,
    state_of,
)
from builder.publish.writable import check_replaceable
from builder.reporter import Reporter
from builder.resolve.target import BaseProfile
from builder.retry import Retries

if TYPE_CHECKING:
    from builder.sign.keys import SigningKey


def delivery_for(
    plan: Plan,
    settings: Settings,
    cache: Cache,
    state: StateRecord | None,
    sign: SigningKey | None = None,
    written: tuple[Mapping[str, str], BuildParameters] | None = None,
) -> Delivery:
    """What a run does with its images, from its settings (a `rebuild`'s: its config's); a
    run from a config records what it pushed in `state`, for `rebuild` to diff against.
    `written`: the images' labels and the provenance's parameters when a written plan says
    them (a runner's part, which holds neither the requirement files nor the planning cache)."""
    if written is None:
        pushing = settings.asked.push_repository is not None
        labels = finish(plan, settings, cache, {}).labels if pushing else {}
        written = labels, build_parameters(plan, settings)
    labels, parameters = written
    return Delivery(settings, target_of(settings, labels), state, parameters, sign)


@dataclass(frozen=True)
class OnePart:
    """One arch of a written plan as a runner builds it (builder.orchestration.runners.parts)."""

    plan: Plan  # that arch's alone
    finished: Finish  # the whole plan's labels and `created`, the arch's layers
    parameters: BuildParameters
    settings: Settings  # the planning run's, the part's flags over them (`part` names the arch)
    sign: SigningKey | None = None


def deliver_part(part: OnePart, run: Run) -> Outcome:
    """A runner's part: the delivery a one-job run makes, of one arch, from the plan's
    context (the plan's directory, its settings' output): BuildKit's system stage, the plan's
    layers, verified, pushed by digest."""
    settings = part.settings
    written = (part.finished.labels, part.parameters)
    delivery = delivery_for(part.plan, settings, run.cache, None, part.sign, written)
    pushes = delivery.push is not None
    with SystemStages(settings.asked.apt_secrets, run.engines, run.cache, pushes) as stages:
        producer = BuildProducer(
            part.plan,
            settings.asked.output,
            part.finished,
            settings.local_tag,
            run.engines,
            stages,
            run.reporter,
        )
        return deliver(producer, part.plan, delivery, run)


@dataclass(frozen=True)
class Built:
    """What `build` did: the plan, and without an engine nothing more."""

    plan: Plan
    delivery: Delivery | None = None
    outcome: Outcome | None = None


def signing_key(path: Path | None) -> SigningKey | None:
    """The key at `path` (None without one), read before anything is planned so that a key
    that cannot sign fails first; cryptography and NaCl are imported only for a signed run."""
    if path is None:
        return None
    from builder.sign.keys import load_signing_key

    return load_signing_key(path)


def check_written(settings: RunSettings, records_state: bool) -> None:
    """What a run writes after its push, checked before it builds anything, plan-only runs
    too: the template (and the warm pools whose warnings it adds) and, when the run
    `records_state`, the state. One UserError naming the file and what is wrong."""
    pointing = pointing_of(settings)
    if pointing is not None:
        pointing.check()
    if records_state and settings.state is not None:
        check_state(settings.state)


def check_rebuild_writes(config: PipelineConfig) -> RunSettings:
    """A rebuild's settings (its config's: builder.config.settings_of), once its
    `check_written` and the config it names the new version in once pushed
    (builder.config.set_platform_version) are checked."""
    asked = settings_of(config)
    check_written(asked, records_state=True)
    check_version_settable(config)
    check_replaceable(config.path, "config")
    return asked


def build(
    settings: RunSettings,
    client: docker.DockerClient | None,
    cache: Cache,
    reporter: Reporter,
    planned: Callable[[Plan], None],
) -> Built:
    """The main command after parsing: the base's facts, the plan and its context, then (with
    an engine) every arch's image and the one delivery. `planned` shows the plan as soon as it
    exists, before anything is built. The signing key is read first (a key that cannot sign
    fails before anything is planned), then the named engines are reached; they are closed at
    the end."""
    key = signing_key(settings.sign_key)
    check_written(settings, records_state=settings.push_repository is not None)
    with ExitStack() as stack:
        engines = None
        if client is not None:  # a plan for runners (--no-build --push): the local one compiles
            named = connect(settings.engines, client) if settings.build else Engines.local(client)
            engines = stack.enter_context(named)
        retries = Retries(reporter)  # the run's: every registry request, one budget, one record
        timeline = Timeline()
        with timeline.step("base"):
            base = base_profile(settings.base_image, client, cache, reporter, retries)
            arches = target_arches(settings.arches, base, client, cache, reporter, retries)
        grounds = grounds_for(settings, base, arches, cache, engines, retries, timeline)
        pushes = settings.push_repository is not None
        stages = stack.enter_context(SystemStages(settings.apt_secrets, engines, cache, pushes))
        building = engines is not None and settings.build
        plan = prepare(
            settings,
            grounds,
            planned=stages.start if building else None,
            laid_out=stages.preload if building else None,
        )
        planned(plan)
        resolved = settle(settings, plan)
        if not settings.build:  # the plan a runner is handed (builder.orchestration.runners.parts)
            write_plan(plan, resolved, cache)
        if engines is None or not building:
            return Built(plan)
        state = state_record(resolved)  # a run from a config records what it pushed
        delivery = delivery_for(plan, resolved, cache, state, sign=key)
        run = Run(engines, cache, reporter, retries)
        return Built(plan, delivery, build_images(plan, resolved, delivery, stages, run))


def grounds_for(
    settings: RunSettings,
    base: BaseProfile,
    arches: tuple[str, ...],
    cache: Cache,
    engines: Engines | None,
    retries: Retries,
    timeline: Timeline | None = None,
) -> Grounds:
    """What `prepare` works with besides the settings: the base and the arches it targets,
    the engine that compiles the bytecode (None: no bytecode, not asked or no engine), and the
    run's retries (its index requests try again as its registry requests do, in one budget)."""
    compiler = None
    if engines is not None and settings.bytecode:
        compiler = engines.compiling_client(arches)
    return Grounds(base, arches, cache, compiler, timeline or Timeline(), retries)


def build_images(
    plan: Plan,
    settings: Settings,
    delivery: Delivery,
    stages: SystemStages,
    run: Run,
) -> Outcome:
    """After `prepare`: BuildKit and the tool make every arch's image; one delivery.

    The images are tagged locally (`settings.local_tag`): an untagged image would vanish if a
    later step untags it. With a push, each arch's extras layers are gzipped in the background
    while the images build and verify, and given their ztocs.
    """
    finished = finish(plan, settings, run.cache)
    producer = BuildProducer(
        plan, settings.asked.output, finished, settings.local_tag, run.engines, stages, run.reporter
    )
    pushing = [
        (one.layer.path, one.layer.diff_id) for stack in finished.layers.values() for one in stack
    ]
    ztoc = None
    if delivery.push and delivery.push.soci:
        from builder.layers.soci import layer_ztoc  # flatbuffers: only a push with an index

        ztoc = layer_ztoc
    with gzip_ahead(pushing if delivery.push else (), run.cache, then=ztoc):
        return deliver(producer, plan, delivery, run)


BaseLookup = Callable[[ImageRef, Callable[[], BaseProfile]], BaseProfile]
"""How `rebuild` gets the new base's profile: (reference, the probe) -> profile. Alone it
probes; a fleet (builder.orchestration.fleet) probes each distinct reference once for all its
templates."""


def _probe(image: ImageRef, probe: Callable[[], BaseProfile]) -> BaseProfile:
    return probe()


@dataclass
class Rebuild:
    """What a platform-upgrade rebuild found, and what it did about it."""

    plan: Plan
    changes: list[str]
    outcome: Outcome | None = None  # None: only checked, or nothing changed
    path: str | None = None  # "rebase" (extras reused on the new base) or "build"


def rebuild(
    config: PipelineConfig,
    new_version: str,
    client: docker.DockerClient,
    cache: Cache,
    reporter: Reporter,
    check_only: bool = False,
    bases: BaseLookup = _probe,
) -> Rebuild:
    """Re-plan against the new platform version; deliver it if anything changed.

    With `check_only` the context goes to a scratch directory and nothing is built. A
    successful delivery records the state (builder.orchestration.delivery) and then the new
    version in the user's config; a failed one changes neither. The config's [engines] are
    reached first (builder.engines.per_arch): one that does not answer fails the rebuild before
    anything is built.
    The config's `sign-key` is read first: a key that cannot sign fails before any probe.
    """
    key = None if check_only else signing_key(config.sign_key)
    configured = check_rebuild_writes(config)
    with ExitStack() as stack:  # the named engines' clients are closed at the end
        named = Engines.local(client) if check_only else connect(configured.engines, client)
        engines = stack.enter_context(named)
        image = config.base_image_for(new_version)
        retries = Retries(reporter)  # the run's: every registry request, one budget, one record
        base = bases(image, lambda: base_profile(image, client, cache, reporter, retries))
        previous = load_state(config.state)
        arches = target_arches(configured.arches, base, client, cache, reporter, retries)
        rebasing = previous is not None and previous.image is not None and not check_only
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="bsi-check-"))
        early = stack.enter_context(ThreadPoolExecutor(max_workers=len(arches)))
        pushes = not check_only and configured.push_repository is not None
        stages = stack.enter_context(SystemStages(configured.apt_secrets, engines, push=pushes))
        settings = replace(
            configured,
            output=Path(scratch) / "context" if check_only else configured.output,
            platform_version=new_version,
            refresh=True,  # an upgrade must see what the index offers now
        )
        grounds = grounds_for(settings, base, arches, cache, engines, retries)
        ahead = None
        if previous is not None and rebasing:
            wanted = {arch: previous.apt_packages.get(arch, ()) for arch in arches}
            secrets = settings.apt_secrets
            ahead = AptAhead(early, wanted, base.pinned.as_written, engines, secrets)
        building = not rebasing and not check_only  # the full path: start the apt builds early
        plan = prepare(
            settings,
            grounds,
            previous.locks if previous is not None and rebasing else None,
            stages.start if building else None,
            stages.preload if building else None,
        )
        resolved = settle(settings, plan)
        found = Rebuild(plan, changes(previous, state_of(plan, resolved.platform_version)))
        if check_only or not found.changes:
            return found
        run = Run(engines, cache, reporter, retries)
        started = (ahead, stages)
        found.path, found.outcome = _upgrade(resolved, previous, plan, run, started, key)
        if found.outcome.succeeded:
            set_platform_version(config, new_version)
        return found


def _upgrade(
    settings: Settings,
    previous: BuildState | None,
    plan: Plan,
    run: Run,
    started: tuple[AptAhead | None, SystemStages],
    key: SigningKey | None,
) -> tuple[str, Outcome]:
    """The rebase path when the resolution is unchanged and a pushed image is recorded; else
    the build path. Either ends in the one delivery."""
    new_version = settings.platform_version
    blocker = rebase_blocker(previous, state_of(plan, new_version))
    path = "build" if blocker or previous is None else "rebase"
    run.reporter.say(f"upgrade path: {path} ({blocker or 'the resolution is unchanged'})")
    state = state_record(settings, unpushed_too=True)  # its plan, even when nothing was pushed
    delivery = delivery_for(plan, settings, run.cache, state, sign=key)
    ahead, stages = started
    if path == "build" or previous is None or previous.image_reference is None:
        return path, build_images(plan, settings, delivery, stages, run)
    if delivery.push is None or not previous.base_digest:
        raise AssertionError("rebase_blocker lets a rebase through only with both recorded")
    start = Previous(previous.image_reference, previous.base_digest)
    finished = finish(plan, settings, run.cache, {})
    with RebaseProducer(
        start, plan, finished, delivery.push.repository, run, ahead, settings.asked.apt_secrets
    ) as producer:
        return path, deliver(producer, plan, delivery, run)
