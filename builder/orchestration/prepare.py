"""Requirements in, plan and build context out: the steps before any image exists.

Each step is its own module; this file only sequences them and fans out per architecture.
What happens next (each arch's image made, verified, pushed) is builder.orchestration.commands'
to sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import docker

from builder.assemble.assemble import (
    plan_epoch,
    plan_layers,
    reused_layers,
    start_layers,
    start_own_layers,
)
from builder.attest.contents import without_credentials
from builder.attest.provenance import BuildParameters, input_files
from builder.cache import Cache
from builder.context.labels import created, image_labels
from builder.context.render import Secrets, check_output, lock_text, render
from builder.contract import BYTECODE_BY_STEP, BYTECODE_LABEL
from builder.inspect.wheels import inspect_as_ready
from builder.layers.bytecode import COMPILERS, CompileQueue, Compiler, cancelled_on_error
from builder.layers.extras import (
    BytecodeFacts,
    ExtrasLayer,
    group_budget,
    known_interpreter,
    remember_interpreter,
    with_bytecode,
)
from builder.layers.interpreter import base_compiler
from builder.oci.name import ImageRef
from builder.orchestration.timeline import Timeline
from builder.plan.plan import (
    EXTRA_DEPS,
    Plan,
    choose_wheel,
    import_modules,
    plan_arch,
    runtime_checks,
)
from builder.plan.program_needs import ProgramNeed, program_needs
from builder.publish.tags import extras_hash
from builder.resolve.index import start_downloads
from builder.resolve.requirements import RequirementSet, read_requirements
from builder.resolve.resolution import Resolution
from builder.resolve.target import (
    BaseFacts,
    BaseProfile,
    Target,
    arch_named,
    shipped_profile,
)
from builder.resolve.uv import resolve
from builder.retry import Retries

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
    without_programs: frozenset[str] = frozenset()  # programs (or packages) never installed
    torch_backend: str | None = None  # uv's --torch-backend: PyTorch's own build (cpu)
    find_links: tuple[str, ...] = ()  # --find-links given as flags, after the files' own
    no_index: bool = False  # --no-index as a flag (a file may say it too)
    platform_version: str | None = None  # for labels and tags; default: the base image's tag
    bytecode: bool = True  # compile the extras' .pyc (with an engine to run the base's python3)
    engine: docker.DockerClient | None = None  # runs the compile; None: no bytecode
    timeline: Timeline = field(default_factory=Timeline)  # when what happened: report.json's
    retries: Retries = field(default_factory=Retries)  # the run's: its index requests' too

    @property
    def compiles(self) -> bool:
        """Whether the extras get bytecode layers: asked for, and an engine to compile with."""
        return self.bytecode and self.engine is not None


def prepare(
    request: Request,
    reuse_locks: Mapping[str, str] | None = None,
    planned: Callable[[Plan], None] | None = None,
) -> Plan:
    """Resolve, fetch, inspect and plan for every arch, then render the context.

    Each wheel is inspected, and its own layer written, as soon as its download ends; only
    what needs every wheel (grouping a large set, a file one distribution shadows in another)
    waits for the last one. `planned` gets the plan as soon as it exists,
    while the layers may still be written (produce_build.SystemStages starts the apt builds). When
    every arch's lock hash equals `reuse_locks` (the previous build's: a rebase reuses its
    layers) no layer is written, unless the extras get bytecode: the base's interpreter decides
    then whether the previous bytecode layers still fit. The base's python3 (its container
    started while the set resolves) compiles every arch's wheels once, natively, each as soon
    as its download ends (builder.layers.bytecode.CompileQueue): the compile is the longest
    step of a cold build, so it starts as early as it can.
    """
    requirements = _requirements(request)
    check_output(request.output)  # refuse a directory we may not replace before the slow steps
    target = Target(request.base, tuple(arch_named(a) for a in dict.fromkeys(request.arches)))
    indexes = (*requirements.indexes(), *requirements.find_links)  # where credentials go
    timeline = request.timeline
    with (  # exits in reverse: downloads, jobs, compiles; the compiler's container goes last
        ExitStack() as stack,
        ThreadPoolExecutor(max_workers=COMPILERS) as compiling,
        cancelled_on_error(compiling) as compile_pool,  # a failure waits for no queued compile
        ThreadPoolExecutor(max_workers=4 + len(target.arches)) as pool,
        ThreadPoolExecutor(max_workers=DOWNLOADS) as fetch,
    ):
        queue = None
        if request.engine is not None and request.compiles:  # starts while resolving
            starting = pool.submit(_start_compiler, request, target, stack)
            queue = CompileQueue(starting.result, compile_pool, timeline.marker("compiled"))
        with timeline.step("resolve"):
            resolutions: list[Resolution] = list(
                pool.map(
                    lambda arch: resolve(
                        requirements,
                        target,
                        arch,
                        request.cache,
                        request.refresh,
                        request.overrides,
                        request.retries,
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
        timeline.name({file.sha256: file.filename for file in files})
        fetching = timeline.now()
        downloads = start_downloads(files, request.cache, indexes, fetch, request.retries)
        arrived = timeline.marker("arrived")
        for sha, future in downloads.items():
            future.add_done_callback(_marking(arrived, sha))
        inspected = timeline.marker("inspected")
        inspecting = pool.submit(
            inspect_as_ready, _as_ready(downloads), request.cache, done=inspected
        )
        if queue is not None:  # each wheel compiled as soon as it is here (every arch's once)
            feeding = pool.submit(queue.add_as_ready, _as_ready(downloads))
        budget = group_budget(request.compiles)
        # a rebase onto the same interpreter reuses every layer; bytecode decides that later
        reused = not request.compiles and reused_layers(pins, reuse_locks)
        own = None
        if not reused:
            laid_out = timeline.marker("laid_out")
            own = start_own_layers(
                pool, pins, _as_ready(downloads), request.cache, budget, laid_out
            )
        paths = {sha: future.result() for sha, future in downloads.items()}
        timeline.record("downloads", fetching)
        writing = {} if reused else start_layers(pool, pins, paths, request.cache, budget, own)
        inspections = inspecting.result()
        timeline.record("inspections", fetching)
        arch_plans = tuple(
            plan_arch(
                resolution,
                chosen[resolution.arch.name],
                inspections,
                target,
                request.with_optional,
                request.without_programs,
            )
            for resolution in resolutions
        )
        direct = tuple(r.name for r in requirements.requirements)
        plan = Plan(
            base=request.base,
            base_image=request.base.pinned.as_written,
            arches=arch_plans,
            import_modules=import_modules(direct, arch_plans),
            runtime_checks=runtime_checks(arch_plans),
        )
        timeline.record("plan", fetching)
        if planned is not None:
            planned(plan)
        layers = {arch: future.result() for arch, future in writing.items()}
        timeline.record("layers", fetching)
        facts: dict[str, BytecodeFacts] = {}
        if queue is not None:
            feeding.result()  # every wheel queued
            parts = queue.results()
            interpreter = starting.result().interpreter
            assert interpreter is not None, "the Compiler identifies its interpreter on entry"
            layers, facts = with_bytecode(layers, parts, interpreter, EXTRA_DEPS, request.cache)
            remember_interpreter(request.cache, plan.base_image, interpreter)
            plan = replace(plan, bytecode=interpreter.build)
            timeline.record("bytecode", fetching)
    labels = dict(finish(plan, request, layers).labels)
    if request.bytecode and not request.compiles:  # no engine compiled it: the Dockerfile will
        labels[BYTECODE_LABEL] = BYTECODE_BY_STEP
    render(
        plan,
        request.output,
        layers,
        {r.arch.name: r.pylock for r in resolutions},
        request.secrets,
        labels,
        {arch: one.to_dict() for arch, one in facts.items()},
        timeline.to_dict(),
    )
    return plan


def programs_needed(
    requirement: Path, image: ImageRef, arch_name: str, without: frozenset[str], cache: Cache
) -> tuple[ProgramNeed, ...]:
    """The programs a requirements file's set runs and needs (not optional), for verifying an
    image the tool did not plan (`verify IMAGE -r FILE`): resolved, fetched and inspected as
    a build would (all cached), for the image's own arch (`arch_name`, Docker's name), against
    the shipped profile as `image`'s base facts; `without` (program or package names) are
    marked left out."""
    requirements = read_requirements((requirement,), ())
    base = shipped_profile(image)
    target = Target(base, (arch_named(arch_name),))
    arch = target.arches[0]
    resolution = resolve(requirements, target, arch, cache)
    chosen = [choose_wheel(p, target, arch)[0] for p in resolution.packages]
    with ThreadPoolExecutor(max_workers=DOWNLOADS) as fetch:
        downloads = start_downloads(chosen, cache, requirements.indexes(), fetch)
        inspections = inspect_as_ready(_as_ready(downloads), cache)
    needs, _ = program_needs(
        [inspections[file.sha256] for file in chosen],
        base.packages.get(arch.name, frozenset()),
        arch,
        without,
    )
    return tuple(need for need in needs if not need.optional)


def _as_ready(downloads: Mapping[str, Future[Path]]) -> Iterator[tuple[Path, str]]:
    """(path, sha256) of each download as it ends: what is worked on before the last one."""
    arrived = {future: sha for sha, future in downloads.items()}
    for future in as_completed(arrived):
        yield future.result(), arrived[future]


def _marking(mark: Callable[[str], None], sha256: str) -> Callable[[Future[Path]], None]:
    """A download's callback: `sha256` arrived (the timeline's mark)."""
    return lambda _: mark(sha256)


def _start_compiler(request: Request, target: Target[BaseFacts], stack: ExitStack) -> Compiler:
    """The base's interpreter, started (pulled first if need be) while the set resolves."""
    assert request.engine is not None
    arches = tuple(a.name for a in target.arches)
    compiler = base_compiler(request.engine, request.base.pinned, arches, request.cache, EXTRA_DEPS)
    return stack.enter_context(compiler)


@dataclass(frozen=True)
class Finish:
    """What the tool puts on top of each arch's system stage: its layers, labels, created."""

    layers: Mapping[str, tuple[ExtrasLayer, ...]]  # arch -> the extras layers, bottom to top
    labels: Mapping[str, str]
    created: str
    cache: Cache


def extras_hash_of(plan: Plan) -> str:
    """The extras hash: what the tag and the `.version` label name besides the platform."""
    digest_input = [lock_text(plan, a.arch) + " ".join(a.apt_packages) for a in plan.arches]
    return extras_hash([plan.base_image, *digest_input])


def finish(
    plan: Plan, request: Request, layers: Mapping[str, tuple[ExtrasLayer, ...]] | None = None
) -> Finish:
    """The layers, labels and `created` each arch's image gets (the same in the Dockerfile).

    `layers` None: each arch's layers are written (or found in the cache, with the bytecode
    `prepare` compiled); empty: none is needed (a rebase), and only the date the locks fix is
    read from the wheels.
    """
    interpreter = known_interpreter(request.cache, plan.base_image) if plan.bytecode else None
    if layers is None:
        layers = plan_layers(plan, request.cache, interpreter, group_budget(bool(plan.bytecode)))
    epoch = plan_epoch(plan)
    version = platform_version(plan.base_reference, request.platform_version)
    bytecode = interpreter.build if interpreter else "none"
    labels = image_labels(
        plan.base.image, plan.base.digest, epoch, version, extras_hash_of(plan), bytecode
    )
    return Finish(layers, labels, created(epoch), request.cache)


def platform_version(base: ImageRef, explicit: str | None) -> str:
    """The platform version an image is built for: given, or the base image's tag."""
    if explicit:
        return explicit
    return base.tag or "latest"


def _requirements(request: Request) -> RequirementSet:
    """The requirement files' set with the run's own resolver flags added."""
    read = read_requirements(request.requirement_files, request.constraint_files)
    return replace(
        read,
        torch_backend=request.torch_backend,
        find_links=tuple(dict.fromkeys(read.find_links + request.find_links)),
        no_index=read.no_index or request.no_index,
    )


def build_parameters(plan: Plan, request: Request) -> BuildParameters:
    """What the operator asked for, as the provenance names it: files by hash, the package
    indexes without their credentials, apt secrets by the id BuildKit mounts them under (never
    their contents)."""
    secrets = request.secrets
    requirements = _requirements(request)
    indexes = () if requirements.no_index else requirements.indexes()
    return BuildParameters(
        requirements=input_files(request.requirement_files),
        constraints=input_files(request.constraint_files),
        overrides=input_files(request.overrides),
        arches=tuple(a.arch for a in plan.arches),
        platform_version=platform_version(plan.base_reference, request.platform_version),
        base_image=plan.base_image,
        flags={
            "with_optional": request.with_optional,
            "without_programs": " ".join(sorted(request.without_programs)),
            "torch_backend": request.torch_backend or "",
            "find_links": " ".join(without_credentials(f) for f in requirements.find_links),
            "no_index": requirements.no_index,
            "indexes": " ".join(without_credentials(url) for url in indexes),
            "apt_secrets": ",".join(
                name
                for name, used in (("apt-ca", secrets.apt_ca), ("apt-auth", secrets.apt_auth))
                if used
            ),
        },
    )
