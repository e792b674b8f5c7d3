"""The one orchestrating function: requirements in, plan and build context out.

Each step is its own module; this file only sequences them and fans out per architecture.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker

from builder import credentials, multiarch
from builder.analysis.index import start_downloads
from builder.analysis.plan import Plan, choose_wheel, import_modules, plan_arch, runtime_checks
from builder.analysis.requirements import read_requirements
from builder.analysis.resolve import Resolution, resolve
from builder.analysis.target import ARCHES, BaseProfile, Target, arch_named
from builder.analysis.wheels import inspect_as_ready
from builder.base.discover import base_profile
from builder.cache import Cache
from builder.config import PipelineConfig, set_platform_version
from builder.image.assemble import plan_epoch, plan_layers, start_layers
from builder.image.gzipped import ahead as gzip_ahead
from builder.image.labels import created, image_labels
from builder.image.layer import Layer
from builder.image.publish import extras_hash, image_tags
from builder.image.render import Secrets, check_output, lock_text, render, update_report
from builder.image.template import TemplateChange, apply_hint, set_image, warm_pool_warnings
from builder.multiarch import ArchBuild, Finish
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, Written, write
from builder.oci.v1 import Index, Platform
from builder.rebase import AptAhead, rebase
from builder.upgrade import BuildState, changes, load_state, rebase_blocker, save_state, state_of
from builder.verify import VerifyReport

Say = Callable[[str], None]
DOWNLOADS = 8  # wheel downloads at once


@dataclass(frozen=True)
class Request:
    requirement_files: tuple[Path, ...]
    constraint_files: tuple[Path, ...]
    arches: tuple[str, ...]
    base: BaseProfile
    output: Path
    cache: Cache
    secrets: Secrets = field(default_factory=Secrets)
    refresh: bool = False  # resolve again even if an identical resolution is cached
    overrides: tuple[Path, ...] = ()  # uv override files: replace or drop dependencies
    with_optional: bool = False  # also install what only on-demand plugins need
    platform_version: str | None = None  # for labels and tags; default: the base image's tag


def base_reference(base: BaseProfile) -> str:
    """FROM value: the operator's tag (the platform version) pinned by the probed digest."""
    if base.digest and "@" not in base.image:
        return f"{base.image}@{base.digest}"
    return base.image


def prepare(
    request: Request,
    reuse_locks: Mapping[str, str] | None = None,
    planned: Callable[[Plan], None] | None = None,
) -> Plan:
    """Resolve, fetch, inspect and plan for every arch, then render the context.

    Each wheel is inspected as soon as its download ends; each arch's deps-extra layer (it needs
    only the chosen wheels) is written meanwhile. `planned` gets the plan as soon as it exists,
    while the layers may still be written (multiarch.SystemStages starts the apt builds). When
    every arch's lock hash equals `reuse_locks` (the previous build's: a rebase reuses its
    layers) no layer is written.
    """
    requirements = read_requirements(request.requirement_files, request.constraint_files)
    check_output(request.output)  # refuse a directory we may not replace before the slow steps
    target = Target(request.base, tuple(arch_named(a) for a in dict.fromkeys(request.arches)))
    indexes = requirements.indexes()
    with ThreadPoolExecutor(max_workers=len(target.arches)) as pool:
        resolutions: list[Resolution] = list(
            pool.map(
                lambda arch: resolve(
                    requirements, target, arch, request.cache, request.refresh, request.overrides
                ),
                target.arches,
            )
        )
    chosen = {
        resolution.arch.name: {
            package.name: choose_wheel(package, target, resolution.arch)
            for package in resolution.packages
        }
        for resolution in resolutions
    }
    files = [file for per_arch in chosen.values() for file, _ in per_arch.values()]
    requirements.check_hashes(files)  # pip's hash-checking mode, before anything is fetched
    pins = {
        r.arch.name: [
            (p.name, p.version, chosen[r.arch.name][p.name][0].sha256) for p in r.packages
        ]
        for r in resolutions
    }
    with (
        ThreadPoolExecutor(max_workers=DOWNLOADS) as fetch,
        ThreadPoolExecutor(max_workers=1 + len(pins)) as pool,
    ):
        downloads = start_downloads(files, request.cache, indexes, fetch)
        arrived = {future: sha for sha, future in downloads.items()}  # inspected as they come:
        ready = ((future.result(), arrived[future]) for future in as_completed(arrived))
        inspecting = pool.submit(inspect_as_ready, ready, request.cache)
        paths = {sha: future.result() for sha, future in downloads.items()}
        writing = start_layers(pool, pins, paths, request.cache, reuse_locks)
        inspections = inspecting.result()
        arch_plans = tuple(
            plan_arch(
                resolution, chosen[resolution.arch.name], inspections, target,
                request.with_optional,
            )
            for resolution in resolutions
        )  # fmt: skip
        direct = tuple(r.name for r in requirements.requirements)
        plan = Plan(
            base=request.base,
            base_image=base_reference(request.base),
            arches=arch_plans,
            import_modules=import_modules(direct, arch_plans),
            runtime_checks=runtime_checks(arch_plans),
        )
        if planned is not None:
            planned(plan)
        layers = {arch: future.result() for arch, future in writing.items()}
    render(
        plan,
        request.output,
        layers,
        {r.arch.name: r.pylock for r in resolutions},
        request.secrets,
        finish(plan, request, layers).labels,
    )
    return plan


def extras_of(plan: Plan) -> str:
    """The extras hash: what the tag and the `.version` label name besides the platform."""
    digest_input = [lock_text(plan, a.arch) + " ".join(a.apt_packages) for a in plan.arches]
    return extras_hash([plan.base_image, *digest_input])


def finish(plan: Plan, request: Request, layers: Mapping[str, Layer] | None = None) -> Finish:
    """The layers, labels and `created` each arch's image gets (the same in the Dockerfile).

    `layers` None: each arch's layer is written (or found in the cache); empty: none is
    needed (a rebase), and only the date the locks fix is read from the wheels.
    """
    layers = plan_layers(plan, request.cache) if layers is None else layers
    epoch = plan_epoch(plan, request.cache)
    version = platform_version(plan.base_image, request.platform_version)
    labels = image_labels(plan.base.image, plan.base.digest, epoch, version, extras_of(plan))
    return Finish(layers, labels, created(epoch), request.cache)


@dataclass(frozen=True)
class Delivery:
    """What happens after the context is written: build, verify, push, point the template."""

    build: bool = True
    tag: str | None = None
    verify: bool = True
    secret_files: Mapping[str, Path] = field(default_factory=dict)  # BuildKit secret id -> file
    push_repository: str | None = None
    platform_version: str | None = None
    template: Path | None = None
    container: str | None = None
    warm_pools: tuple[Path, ...] = ()


@dataclass
class Outcome:
    plan: Plan
    image_id: str | None = None  # single-arch builds; every arch is in `builds`
    built_arch: str | None = None
    tag: str | None = None
    verification: VerifyReport | None = None  # every arch's checks, each line naming its arch
    pushed: Written | None = None  # with several arches: the index
    template_change: TemplateChange | None = None
    notes: list[str] = field(default_factory=list)
    builds: list[ArchBuild] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        """Built (and pushed, when asked) with every verification passing."""
        return self.verification is None or self.verification.passed


def platform_version(base_image: str, explicit: str | None) -> str:
    """The platform version an image is built for: given, or the base image's tag."""
    if explicit:
        return explicit
    return ImageRef.parse(base_image, "base image").tag or "latest"


def deliver(
    plan: Plan,
    request: Request,
    delivery: Delivery,
    client: docker.DockerClient | None,
    say: Say,
    stages: multiarch.SystemStages | None = None,
) -> Outcome:
    """After `prepare`: build and verify every arch, push, point the template at the digest.

    All or nothing: a failed build raises and a failed verification returns before anything
    is pushed, so no tag moves and the template is untouched. With several arches each image
    is pushed by digest and the tags name one index of them. With a push, each arch's deps-extra
    layer is gzipped in the background while the images build and verify.
    """
    outcome = Outcome(plan)
    if not delivery.build or client is None:
        return outcome
    extras = extras_of(plan)
    finished = finish(plan, request)
    # Always tag locally: an untagged image would vanish if a later push step untags it.
    outcome.tag = delivery.tag or f"sandbox-extension:x{extras}"
    pushing = [(layer.path, layer.diff_id) for layer in finished.layers.values()]
    with gzip_ahead(pushing if delivery.push_repository else (), request.cache):
        outcome.builds = multiarch.build_and_verify(
            plan, request.output, client, outcome.tag, finished, verify=delivery.verify,
            secret_files=delivery.secret_files, say=say, stages=stages,
        )  # fmt: skip
        outcome.verification = multiarch.combined(outcome.tag, outcome.builds)
        if outcome.succeeded and delivery.push_repository:
            version = platform_version(plan.base_image, delivery.platform_version)
            outcome.pushed = multiarch.push(
                outcome.builds, client, delivery.push_repository,
                image_tags(delivery.push_repository, version, extras), plan.base_image,
                finished.labels, request.cache, say,
            )  # fmt: skip
    image_record: dict[str, Any] = {"tag": outcome.tag}
    if len(outcome.builds) == 1:
        outcome.image_id, outcome.built_arch = outcome.builds[0].image_id, outcome.builds[0].arch
        image_record |= {"id": outcome.image_id, "arch": outcome.built_arch}
        if outcome.verification is not None:
            image_record["verification"] = outcome.verification.to_dict()
    if pushed := outcome.pushed:
        image_record |= {"pushed": pushed.reference, "tags": list(pushed.tags)}
        if len(outcome.builds) > 1:
            image_record["index"] = pushed.digest
        if delivery.template:
            outcome.template_change = set_image(
                delivery.template, pushed.reference, delivery.container
            )
            image_record["template"] = str(delivery.template)
            outcome.notes.append(apply_hint(delivery.template))
            template_name = outcome.template_change.template_name
            if template_name:  # a template without metadata.name is one no warm pool can refer to
                outcome.notes += warm_pool_warnings(
                    (delivery.template, *delivery.warm_pools), template_name
                )
    image_record["arches"] = {b.arch: b.to_dict() for b in outcome.builds}
    pushed_layers = {b.arch: b.deps_extra_layer() for b in outcome.builds if b.pushed_layer}
    update_report(request.output, {"image": image_record}, pushed_layers)
    return outcome


def record_pushed(
    config: PipelineConfig | None, version: str | None, plan: Plan, outcome: Outcome
) -> Path | None:
    """Save a config run's pushed image as the state a later `rebuild` diffs against.

    Returns the state file written; None when there is no config or nothing was pushed.
    """
    if config is None or not outcome.pushed:
        return None
    image = outcome.pushed.reference
    save_state(config.state, state_of(plan, version or config.platform_version, image))
    return config.state


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
    say: Say,
    check_only: bool = False,
) -> Rebuild:
    """Re-plan against the new platform version; deliver and record it if anything changed.

    With `check_only` the context goes to a scratch directory and nothing is built. A
    delivery that ends without a pushed image (a failed verification) records nothing.
    """
    base = base_profile(config.base_image_for(new_version), client, cache, say)
    previous = load_state(config.state)
    arches = multiarch.target_arches(config.architectures, base, client)
    with (
        tempfile.TemporaryDirectory(prefix="bsi-check-") as scratch,
        ThreadPoolExecutor(max_workers=len(arches)) as early,
        multiarch.SystemStages(config.apt_secrets) as stages,
    ):
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
        )
        rebasing = previous is not None and previous.image and not check_only
        ahead = (
            AptAhead(early, {a: previous.apt_packages.get(a, ()) for a in arches},
                     base_reference(base), client, config.apt_secrets)
            if previous is not None and rebasing else None
        )  # fmt: skip
        building = not rebasing and not check_only  # the full path: start the apt builds early
        plan = prepare(
            request,
            previous.locks if previous is not None and rebasing else None,
            stages.start if building else None,
        )
        return _delivered(config, new_version, previous, plan, request, client, say, check_only,
                          ahead, stages)  # fmt: skip


def _delivered(
    config: PipelineConfig,
    new_version: str,
    previous: BuildState | None,
    plan: Plan,
    request: Request,
    client: docker.DockerClient,
    say: Say,
    check_only: bool,
    ahead: AptAhead | None,
    stages: multiarch.SystemStages,
) -> Rebuild:
    """`rebuild` once planned: which path, then that path, then the state recorded."""
    current = state_of(plan, new_version)
    found = Rebuild(plan, changes(previous, current))
    if check_only or not found.changes:
        return found
    delivery = Delivery(
        push_repository=config.repository,
        platform_version=new_version,
        template=config.template,
        container=config.container,
        warm_pools=config.warm_pools,
        secret_files=config.apt_secrets,
    )
    blocker = rebase_blocker(previous, current)
    found.path = "build" if blocker or previous is None else "rebase"
    say(f"upgrade path: {found.path} ({blocker or 'the resolution is unchanged'})")
    if previous is not None and found.path == "rebase":
        found.outcome = _rebase(previous, plan, request, delivery, client, say, ahead)
    else:
        found.outcome = deliver(plan, request, delivery, client, say, stages)
    if found.outcome.succeeded:
        image = found.outcome.pushed.reference if found.outcome.pushed else None
        save_state(config.state, state_of(plan, new_version, image, found.path))
        set_platform_version(config, new_version)
    return found


def _rebase(
    previous: BuildState,
    plan: Plan,
    request: Request,
    delivery: Delivery,
    client: docker.DockerClient,
    say: Say,
    ahead: AptAhead | None,
) -> Outcome:
    """The rebase path (builder.rebase) in a delivery's terms: pushed, verified, template.

    Per arch, native first; with several arches each is pushed by digest and verified, and
    only when all passed is the index written under the tags (all or nothing).
    """
    assert previous.image and previous.base_digest and delivery.push_repository
    version = delivery.platform_version or platform_version(plan.base_image, None)
    finished, multi = finish(plan, request, {}), len(plan.arches) > 1
    machine = client.info().get("Architecture")
    arches = sorted((a.arch for a in plan.arches), key=lambda arch: ARCHES[arch].machine != machine)
    done = [
        rebase(
            previous.image, previous.base_digest, plan, arch, delivery.push_repository, version,
            extras_of(plan), client, request.cache, say, labels=finished.labels,
            created=finished.created, tag=not multi, ahead=ahead,
            apt_secrets=delivery.secret_files,
        )
        for arch in arches
    ]  # fmt: skip
    outcome = Outcome(plan, built_arch=done[0].arch, tag=done[0].reference)
    reports = [r.verification for r in done if r.verification is not None]
    outcome.verification = (
        VerifyReport(
            f"{delivery.push_repository} ({', '.join(arches)})",
            [replace(c, name=f"[{r.arch}] {c.name}") for r in done if r.verification
             for c in r.verification.checks],
        )
        if multi else (reports[0] if reports else None)
    )  # fmt: skip
    record: dict[str, Any] = {"path": "rebase", **done[0].record()}
    if multi:
        record = {"path": "rebase", "arches": {r.arch: r.record() for r in done}}
        record["bytes_pushed"] = sum(r.bytes_pushed for r in done)
        record["image_size"] = sum(r.image_size for r in done)
    if multi and outcome.succeeded:
        target = credentials.registry(
            ImageRef.parse_repository(delivery.push_repository, "push target"),
            delivery.push_repository,
        )
        images = [r.image for r in done if r.image is not None]
        index = Index.build(
            [(Platform.linux(r.arch), r.image) for r in done if r.image is not None],
            finished.labels,
        )
        tags = image_tags(delivery.push_repository, version, extras_of(plan))
        pushed = write(target, images, Blobs(), index=index, tags=tags)
        outcome.pushed = pushed
        record |= {"pushed": outcome.pushed.reference, "tags": list(pushed.tags)}
        record["index"] = pushed.digest
    elif done[0].tags:
        outcome.pushed = Written(
            done[0].repository, done[0].digest, done[0].tags, done[0].bytes_pushed
        )
    if outcome.pushed and delivery.template:
        outcome.template_change = set_image(
            delivery.template, outcome.pushed.reference, delivery.container
        )
        outcome.notes.append(apply_hint(delivery.template))
    update_report(request.output, {"image": record})
    return outcome
