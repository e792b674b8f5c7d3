"""What `build` and `rebuild` do after parsing: the plan, then a producer, then one delivery.

`build_images` makes every arch with BuildKit and the tool's assembly (builder.produce_build);
`rebuild` re-plans against a new platform version and, when something changed, takes the
rebase path (builder.produce_rebase: the same extras on the new base) or the build path. Both
end in builder.delivery.deliver, which verifies, writes, points the template, and records
report.json and the state; `rebuild` then names the new version in the user's config.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import docker

from builder.analysis.plan import Plan
from builder.analysis.target import BaseProfile
from builder.attachments import build_parameters
from builder.base.discover import base_profile
from builder.cache import Cache
from builder.config import PipelineConfig, RunSettings, set_platform_version
from builder.delivery import Delivery, Outcome, Run, StateRecord, Target, deliver
from builder.engines import Engines, connect
from builder.image.gzipped import ahead as gzip_ahead
from builder.image.render import Secrets
from builder.image.tags import image_tag
from builder.oci.name import ImageRef
from builder.pipeline import Request, base_reference, extras_of, finish, platform_version, prepare
from builder.produce_build import BuildProducer, SystemStages, target_arches
from builder.produce_rebase import AptAhead, Previous, RebaseProducer
from builder.reporter import Reporter
from builder.upgrade import BuildState, changes, load_state, rebase_blocker, state_of


def push_target(
    plan: Plan, request: Request, repository: ImageRef | None, soci: bool = True
) -> Target | None:
    """The repository, tag and index annotations of a push (and whether a SOCI index goes with
    each image); None when nothing is pushed."""
    if repository is None:
        return None
    version = platform_version(plan.base_image, request.platform_version)
    labels = finish(plan, request, {}).labels
    return Target(repository, image_tag(version, extras_of(plan)), labels, soci)


def build_delivery(
    plan: Plan,
    request: Request,
    settings: RunSettings,
    config: PipelineConfig | None,
    verify: bool = True,
) -> Delivery:
    """What a `build` run does with its images, from its settings; a config run records what
    it pushed, for `rebuild` to diff against."""
    state = None
    if config is not None:
        version = settings.platform_version or config.platform_version
        state = StateRecord(config.state, version)
    return Delivery(
        verify=verify,
        push=push_target(plan, request, settings.push_repository, settings.soci),
        template=settings.template,
        container=settings.container,
        warm_pools=settings.warm_pools,
        state=state,
        parameters=build_parameters(plan, request),
    )


def build_images(
    plan: Plan,
    request: Request,
    delivery: Delivery,
    stages: SystemStages,
    run: Run,
    tag: str | None = None,
) -> Outcome:
    """After `prepare`: BuildKit and the tool make every arch's image; one delivery.

    The images are tagged locally (`tag`, default `sandbox-extension:x<extras>`): an untagged
    image would vanish if a later step untags it. With a push, each arch's extras layers are
    gzipped in the background while the images build and verify.
    """
    finished = finish(plan, request)
    local_tag = tag or f"sandbox-extension:x{extras_of(plan)}"
    producer = BuildProducer(
        plan, request.output, finished, local_tag, run.engines, stages, run.reporter
    )
    pushing = [
        (one.layer.path, one.layer.diff_id) for stack in finished.layers.values() for one in stack
    ]
    with gzip_ahead(pushing if delivery.push else (), request.cache):
        return deliver(producer, plan, delivery, run)


BaseLookup = Callable[[str, Callable[[], BaseProfile]], BaseProfile]
"""How `rebuild` gets the new base's profile: (reference, the probe) -> profile. Alone it
probes; a fleet (builder.fleet) probes each distinct reference once for all its templates."""


def _probe(image: str, probe: Callable[[], BaseProfile]) -> BaseProfile:
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
    successful delivery records the state (builder.delivery) and then the new version in the
    user's config; a failed one changes neither. The config's [engines] are reached first
    (builder.engines): one that does not answer fails the rebuild before anything is built.
    """
    with ExitStack() as stack:  # the named engines' clients are closed at the end
        named = Engines.local(client) if check_only else connect(config.engines, client)
        engines = stack.enter_context(named)
        image = config.base_image_for(new_version)
        base = bases(image, lambda: base_profile(image, client, cache, reporter))
        previous = load_state(config.state)
        arches = target_arches(config.architectures, base, client)
        rebasing = previous is not None and previous.image is not None and not check_only
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="bsi-check-"))
        early = stack.enter_context(ThreadPoolExecutor(max_workers=len(arches)))
        stages = stack.enter_context(SystemStages(config.apt_secrets, engines))
        request = Request(
            requirement_files=config.requirements,
            constraint_files=config.constraints,
            arches=arches,
            base=base,
            output=Path(scratch) / "context" if check_only else config.output,
            cache=cache,
            secrets=Secrets.of(config.apt_secrets),
            refresh=True,  # an upgrade must see what the index offers now
            platform_version=new_version,
            bytecode=config.bytecode,
            engine=engines.compiling_client(arches),
        )
        ahead = None
        if previous is not None and rebasing:
            wanted = {arch: previous.apt_packages.get(arch, ()) for arch in arches}
            ahead = AptAhead(early, wanted, base_reference(base), engines, config.apt_secrets)
        building = not rebasing and not check_only  # the full path: start the apt builds early
        plan = prepare(
            request,
            previous.locks if previous is not None and rebasing else None,
            stages.start if building else None,
        )
        found = Rebuild(plan, changes(previous, state_of(plan, new_version)))
        if check_only or not found.changes:
            return found
        run = Run(engines, cache, request.output, reporter)
        started = (ahead, stages)
        found.path, found.outcome = _upgrade(
            config, new_version, previous, plan, request, run, started
        )
        if found.outcome.succeeded:
            set_platform_version(config, new_version)
        return found


def _upgrade(
    config: PipelineConfig,
    new_version: str,
    previous: BuildState | None,
    plan: Plan,
    request: Request,
    run: Run,
    started: tuple[AptAhead | None, SystemStages],
) -> tuple[str, Outcome]:
    """The rebase path when the resolution is unchanged and a pushed image is recorded; else
    the build path. Either ends in the one delivery."""
    blocker = rebase_blocker(previous, state_of(plan, new_version))
    path = "build" if blocker or previous is None else "rebase"
    run.reporter.say(f"upgrade path: {path} ({blocker or 'the resolution is unchanged'})")
    delivery = Delivery(
        push=push_target(plan, request, config.repository, config.soci),
        template=config.template,
        container=config.container,
        warm_pools=config.warm_pools,
        state=StateRecord(config.state, new_version, unpushed_too=True),
        parameters=build_parameters(plan, request),
    )
    ahead, stages = started
    if path == "build" or previous is None or previous.image is None:
        return path, build_images(plan, request, delivery, stages, run)
    if delivery.push is None or not previous.base_digest:
        raise AssertionError("rebase_blocker lets a rebase through only with both recorded")
    start = Previous(ImageRef.parse(previous.image, "previous image"), previous.base_digest)
    finished = finish(plan, request, {})
    with RebaseProducer(
        start, plan, finished, delivery.push.repository, run, ahead, config.apt_secrets
    ) as producer:
        return path, deliver(producer, plan, delivery, run)
