"""Requirements in, plan and build context out: the steps before any image exists.

Each step is its own module; this file only sequences them and fans out per architecture.
What happens next (each arch's image made, verified, pushed) is builder.orchestration.commands'
to sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
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
from builder.config import RunSettings, Settings
from builder.context.labels import created, image_labels
from builder.context.render import Secrets, check_output, lock_text, render, update_report
from builder.contract import BYTECODE_BY_STEP, BYTECODE_LABEL
from builder.errors import UserError
from builder.files import named_contents
from builder.inspect.members import UNPACKED_MAX
from builder.inspect.wheel_reader import (
    cached_inspection,
    check_housed,
    check_wheel,
    inspect_as_ready,
    member_bytes,
)
from builder.inspect.wheels import WheelInspection
from builder.layers.bytecode import (
    COMPILERS,
    CompileQueue,
    Compiler,
    cancelled_on_error,
)
from builder.layers.extras import (
    BytecodeFacts,
    ExtrasLayer,
    LayerKind,
    group_budget,
    known_interpreter,
    remember_interpreter,
    with_bytecode,
)
from builder.layers.interpreter import base_compiler
from builder.oci.name import ImageRef
from builder.oci.v1 import digest_of
from builder.orchestration.timeline import Timeline
from builder.plan import browsers
from builder.plan.plan import (
    EXTRA_DEPS,
    Plan,
    choose_wheel,
    import_modules,
    plan_arch,
    requested_distributions,
    runtime_checks,
)
from builder.plan.program_needs import ProgramNeed, program_needs
from builder.publish.build_facts import (
    FACTS_LABEL,
    FORMATS,
    LaidOut,
    facts_of,
)
from builder.publish.cache_from import Seeded, Seeding, open_source, seed
from builder.publish.state import load_state
from builder.publish.tags import extras_hash
from builder.reporter import mask
from builder.resolve.direct.fetch import fetch_all
from builder.resolve.index import start_downloads
from builder.resolve.requirements import RequirementSet, read_requirements
from builder.resolve.resolution import RemoteFile, Resolution, same_pins
from builder.resolve.target import (
    Arch,
    BaseFacts,
    BaseProfile,
    Target,
    arch_named,
    shipped_profile,
)
from builder.resolve.unresolvable import NotOnIndex
from builder.resolve.uv import resolve
from builder.retry import Retries

DOWNLOADS = 8  # wheel downloads at once
PULLS = 4  # layers pulled at once from --cache-from images, beside the downloads


@dataclass(frozen=True)
class Grounds:
    """What a run works with besides its settings (builder.config.RunSettings): what it found
    (the base's facts, the arches the base offers that the settings target) and what it runs
    on (the cache, the engine that compiles the bytecode, the timeline, the retries)."""

    base: BaseProfile
    arches: tuple[str, ...]
    cache: Cache
    compiler: docker.DockerClient | None = None  # compiles the bytecode; None: no bytecode
    timeline: Timeline = field(default_factory=Timeline)  # when what happened: report.json's
    retries: Retries = field(default_factory=Retries)  # the run's: its index requests' too


Chosen = Mapping[str, Mapping[str, tuple[RemoteFile, str]]]
"""arch -> distribution -> the wheel chosen for it (and why that one)."""
Pins = Mapping[str, list[tuple[str, str, str]]]
"""arch -> each distribution's (name, version, wheel sha256): what the layers are made of."""


@dataclass(frozen=True)
class _Compiling:
    """The bytecode compile under way: the base's interpreter starting, the wheels' queue."""

    starting: Future[Compiler]
    queue: CompileQueue


def prepare(
    settings: RunSettings,
    grounds: Grounds,
    reuse_locks: Mapping[str, str] | None = None,
    planned: Callable[[Plan], None] | None = None,
    laid_out: Callable[[Mapping[str, tuple[ExtrasLayer, ...]]], None] | None = None,
) -> Plan:
    """Resolve, fetch, inspect and plan for every arch, then render the context.

    Each wheel is inspected, and its own layer written, as soon as its download ends; only
    what needs every wheel (grouping a large set, a file one distribution shadows in another)
    waits for the last one. `planned` gets the plan as soon as it exists, while the layers may
    still be written (produce_build.SystemStages starts the apt builds); `laid_out` gets each
    arch's distribution layers once written, while the bytecode may still compile (the stages
    load them into the engine meanwhile). When every arch's lock
    hash equals `reuse_locks` (the previous build's: a rebase reuses its layers) no layer is
    written, unless the extras get bytecode: the base's interpreter decides then whether the
    previous bytecode layers still fit. The base's python3 (its container started while the
    set resolves) compiles every arch's wheels once, natively, each as soon as its download
    ends (builder.layers.bytecode.CompileQueue): the longest step of a cold build starts early.
    Images named by --cache-from (else the state's last push) are read while the set resolves,
    then seed the cache with what their builds learned of this lock's wheels: inspections at
    once, layers and bytecode pulled beside the downloads (builder.publish.cache_from); a wheel
    is laid out or compiled only once its pull has ended without giving it.

    The downloads start from the set as uv first pins it, while the resolution's check for
    newer releases goes on (builder.resolve.uv.resolve's `pinned`). The plan waits for that
    check; in the rare case that it changed the pins (it built a fresher pure-Python source),
    the run starts again from the checked resolution, keeping in the cache what it fetched.
    """
    try:
        return _prepare(settings, grounds, reuse_locks, planned, laid_out)
    except _Repinned as repinned:
        grounds.timeline.repinned(AFTER_RESOLVE)
        return _prepare(settings, grounds, reuse_locks, planned, laid_out, repinned.resolutions)


# The steps a run started again from the checked pins records anew (`Timeline.repinned`).
AFTER_RESOLVE = ("downloads", "inspections", "plan", "layers", "bytecode")


class _Repinned(Exception):
    """The check for newer releases changed what the set installs: what the run fetched for
    the first pins may not be the set's (`_checked`)."""

    def __init__(self, resolutions: Sequence[Resolution]) -> None:
        super().__init__("the check for newer releases changed the pins")
        self.resolutions = tuple(resolutions)


def _prepare(
    settings: RunSettings,
    grounds: Grounds,
    reuse_locks: Mapping[str, str] | None,
    planned: Callable[[Plan], None] | None,
    laid_out: Callable[[Mapping[str, tuple[ExtrasLayer, ...]]], None] | None,
    resolved: Sequence[Resolution] | None = None,
) -> Plan:
    """`prepare`, from the checked `resolved` when given (no resolution, no speculation)."""
    requirements = _requirements(settings)
    check_output(settings.output)  # refuse a directory we may not replace before the slow steps
    target = Target(grounds.base, tuple(arch_named(a) for a in dict.fromkeys(grounds.arches)))
    timeline = grounds.timeline
    with (  # exits in reverse: downloads, jobs, compiles; the compiler's container goes last
        ExitStack() as stack,
        ThreadPoolExecutor(max_workers=COMPILERS) as compiling,
        cancelled_on_error(compiling) as compile_pool,  # a failure waits for no queued compile
        ThreadPoolExecutor(max_workers=4 + 2 * len(target.arches)) as pool,  # + checks
        ThreadPoolExecutor(max_workers=DOWNLOADS) as fetch,
        ThreadPoolExecutor(max_workers=PULLS) as pulling,
    ):
        compile_ = _start_compiling(grounds, target, stack, pool, compile_pool)  # while resolving
        asked = cache_sources(settings)
        opening = [  # on the pulls' pool: the resolution's jobs never wait behind them
            pulling.submit(open_source, ref, grounds.arches, grounds.retries, grounds.cache.warn)
            for ref in asked
        ]
        # a rerun from checked pins resolves nothing: the first resolution keeps its step
        with timeline.step("resolve") if resolved is None else nullcontext():
            limit = UNPACKED_MAX if settings.wheel_max is None else settings.wheel_max
            _check_local_wheels(requirements, grounds.cache, grounds.retries, limit)
            resolutions, checking = _resolve_all(
                requirements, target, settings, grounds, pool, resolved
            )
        with _failing_as_checked(resolutions, checking):
            chosen = _choose(resolutions, target)
            files = [file for per_arch in chosen.values() for file, _ in per_arch.values()]
            requirements.check_hashes(files)  # pip's hash-checking mode, before any fetch
            pins = _pins(resolutions, chosen)
            lock = {file.sha256: file.filename for file in files}
            sources = [one.result() for one in opening]  # read while the set resolved
            fetching = timeline.now()
            downloads = _start_downloads(files, requirements, grounds, fetch, limit)
            warn = grounds.cache.warn
            seeding = Seeding(grounds.cache, pulling, warn, downloads)
            seeded = seed(asked, sources, lock, seeding)
            inspecting, feeding = _start_reading(downloads, grounds, pool, compile_, seeded)
            writing = _start_layers(pins, downloads, reuse_locks, grounds, pool, seeded)
            timeline.record("downloads", fetching)
            inspections = inspecting.result()
            timeline.record("inspections", fetching)
            files_at = {sha: future.result() for sha, future in downloads.items()}  # all here
            resolutions = _checked(resolutions, checking)  # raises _Repinned
        plan = _plan(requirements, resolutions, chosen, inspections, target, settings, files_at)
        timeline.record("plan", fetching)
        if planned is not None:
            planned(plan)
        layers = {arch: future.result() for arch, future in writing.items()}
        timeline.record("layers", fetching)
        if laid_out is not None:
            laid_out(layers)
        facts: dict[str, BytecodeFacts] = {}
        if compile_ is not None and feeding is not None:
            feeding.result()  # every wheel queued
            plan, layers, facts = _with_bytecode(plan, layers, compile_, grounds.cache)
            timeline.record("bytecode", fetching)
    _render(plan, settings, grounds, layers, resolutions, facts)
    if seeded.sources:
        stacks = [_laid_out(one) for stack in layers.values() for one in stack]
        update_report(settings.output, {"cache_from": seeded.record(len(lock), stacks)})
    return plan


def cache_sources(settings: RunSettings) -> tuple[ImageRef, ...]:
    """The images the run's cache is seeded from (builder.publish.cache_from): --cache-from,
    else the config's; else the image its state last pushed (by digest), when there is one."""
    if settings.cache_from:
        return settings.cache_from
    if settings.state is None:
        return ()
    try:
        previous = load_state(settings.state)
    except UserError:
        return ()  # the run reads it again where it matters, and says so there
    last = previous.image_reference if previous is not None else None
    return (last,) if last is not None else ()


def _start_compiling(
    grounds: Grounds,
    target: Target[BaseFacts],
    stack: ExitStack,
    jobs: ThreadPoolExecutor,
    compiles: ThreadPoolExecutor,
) -> _Compiling | None:
    """The base's interpreter started on `jobs` (pulled first if need be, its container entered
    on `stack`) while the set resolves, and the queue the wheels join as they arrive, compiled
    on `compiles`; None when the extras get no bytecode."""
    if grounds.compiler is None:
        return None
    starting = jobs.submit(_start_compiler, grounds, target, stack)
    queue = CompileQueue(starting.result, compiles, grounds.timeline.marker("compiled"))
    return _Compiling(starting, queue)


def _check_local_wheels(
    requirements: RequirementSet, cache: Cache, retries: Retries | None, limit: int
) -> None:
    """The local wheels uv is given, checked before it runs: `uv pip compile` unpacks a wheel
    it reads from a path (a direct requirement's, fetched into the cache, or one in a local
    wheelhouse) into its own cache to read its metadata. An index's it reads without unpacking
    it (the index's metadata file, or the wheel streamed up to its METADATA).
    `limit`: the most a wheel may unpack to (builder.inspect.members)."""
    for fetched in fetch_all(requirements, cache, retries):
        try:
            check_wheel(fetched.wheel, limit)
        except UserError as error:  # named by the line that asked for it too
            raise UserError(f"{fetched.requirement.origin}: {error}") from None
    for location in requirements.find_links:
        if Path(location).is_dir():
            for wheel in sorted(Path(location).glob("*.whl")):
                check_housed(wheel, limit)


def _resolve_all(
    requirements: RequirementSet,
    target: Target[BaseProfile],
    settings: RunSettings,
    grounds: Grounds,
    pool: ThreadPoolExecutor,
    resolved: Sequence[Resolution] | None = None,
) -> tuple[list[Resolution], list[Future[Resolution]]]:
    """Every arch's resolution, at once, as soon as uv has pinned it; and each arch's checked
    one to come (the check for newer releases goes on meanwhile: `_checked` awaits it). The
    timeline's `checked` step ends when the last check does. `resolved`: checked already."""
    if resolved is not None:
        return list(resolved), []
    began = grounds.timeline.now()
    firsts: dict[str, Future[Resolution]] = {arch.name: Future() for arch in target.arches}

    def one(arch: Arch) -> Resolution:
        return resolve(
            requirements,
            target,
            arch,
            grounds.cache,
            settings.refresh,
            settings.overrides,
            grounds.retries,
            pinned=firsts[arch.name].set_result,
        )

    whole = [pool.submit(one, arch) for arch in target.arches]
    for future in whole:
        future.add_done_callback(lambda _: grounds.timeline.record("checked", began))
    pinned = [_first(firsts[a.name], w) for a, w in zip(target.arches, whole, strict=True)]
    return pinned, whole


def _first(pinned: Future[Resolution], whole: Future[Resolution]) -> Resolution:
    """The resolution as first pinned; the whole one when it came first (a reused one, which
    nothing checks again) or failed before pinning (raised here)."""
    wait([pinned, whole], return_when=FIRST_COMPLETED)
    return pinned.result() if pinned.done() else whole.result()


@contextmanager
def _failing_as_checked(
    first: list[Resolution], whole: Sequence[Future[Resolution]]
) -> Iterator[None]:
    """A failure of the work on the first pins (a wheel refused, a download gone) counts only
    when the check keeps those pins: when it changed them, the run starts again from its pins
    (`_Repinned`), which may not install that wheel at all. The check's own failure then is
    not the one reported: the work's is."""
    try:
        yield
    except _Repinned:
        raise
    except Exception as error:
        if whole and (repinned := _repinned(first, whole)) is not None:
            raise repinned from error
        raise


def _repinned(first: list[Resolution], whole: Sequence[Future[Resolution]]) -> _Repinned | None:
    """The check's new pins, once it ends, when it changed them; None when it kept them or
    failed (a failure the caller's own error outranks)."""
    try:
        _checked(first, whole)
    except _Repinned as repinned:
        return repinned
    except Exception:
        return None
    return None


def _checked(first: list[Resolution], whole: Sequence[Future[Resolution]]) -> list[Resolution]:
    """Each arch's checked resolution (with the check's notes), once the checks end; raises
    `_Repinned` when one installs something else than it did as first pinned."""
    if not whole:
        return first
    checked = [future.result() for future in whole]
    if all(same_pins(a, b) for a, b in zip(first, checked, strict=True)):
        return checked
    raise _Repinned(checked)


def _choose(resolutions: Sequence[Resolution], target: Target[BaseFacts]) -> Chosen:
    """The wheel each arch installs of each distribution it resolved."""
    return {
        resolution.arch.name: {
            package.name: choose_wheel(package, target, resolution.arch)
            for package in resolution.packages
        }
        for resolution in resolutions
    }


def _pins(resolutions: Sequence[Resolution], chosen: Chosen) -> Pins:
    return {
        r.arch.name: [
            (p.name, p.version, chosen[r.arch.name][p.name][0].sha256) for p in r.packages
        ]
        for r in resolutions
    }


def _start_downloads(
    files: Sequence[RemoteFile],
    requirements: RequirementSet,
    grounds: Grounds,
    fetch: ThreadPoolExecutor,
    limit: int,
) -> dict[str, Future[Path]]:
    """Every chosen wheel's download started (sha256 -> its path, once here and checked by
    builder.inspect.members, unpacking to `limit` at most), each marked on the timeline as it
    arrives."""
    grounds.timeline.name({file.sha256: file.filename for file in files})
    where = (*requirements.indexes(), *requirements.find_links)  # whose credentials go where
    checked = partial(check_wheel, limit=limit)
    downloads = start_downloads(files, grounds.cache, where, fetch, grounds.retries, checked)
    arrived = grounds.timeline.marker("arrived")
    for sha, future in downloads.items():
        future.add_done_callback(_marking(arrived, sha))
    return downloads


def _start_reading(
    downloads: Mapping[str, Future[Path]],
    grounds: Grounds,
    pool: ThreadPoolExecutor,
    compile_: _Compiling | None,
    seeded: Seeded,
) -> tuple[Future[dict[str, WheelInspection]], Future[None] | None]:
    """Each wheel inspected (once the check of its record from a --cache-from image, if any,
    ended), and queued for its compile (every arch's once), as soon as it is here; the
    compile's feed is None without bytecode."""
    inspected = grounds.timeline.marker("inspected")
    ready = _pulled_first(_as_ready(downloads), seeded.inspections)  # its record checked
    inspecting = pool.submit(inspect_as_ready, ready, grounds.cache, done=inspected)
    if compile_ is None:
        return inspecting, None
    return inspecting, pool.submit(compile_.queue.add_as_ready, _as_ready(downloads))


def _start_layers(
    pins: Pins,
    downloads: Mapping[str, Future[Path]],
    reuse_locks: Mapping[str, str] | None,
    grounds: Grounds,
    pool: ThreadPoolExecutor,
    seeded: Seeded,
) -> Mapping[str, Future[tuple[ExtrasLayer, ...]]]:
    """Each arch's extras layers started: each wheel's own layer as its download ends (and its
    pull from a --cache-from image, when it has one, ended), the rest once every wheel is here
    and every pull ended (this waits for both); none when a rebase reuses the previous layers
    (with bytecode, the base's interpreter decides that later)."""
    compiles = grounds.compiler is not None
    budget = group_budget(compiles)
    reused = not compiles and reused_layers(pins, reuse_locks)
    own = None
    if not reused:
        laid_out = grounds.timeline.marker("laid_out")
        ready = _pulled_first(_as_ready(downloads), seeded.pulls)
        own = start_own_layers(pool, pins, ready, grounds.cache, budget, laid_out)
    paths = {sha: future.result() for sha, future in downloads.items()}
    seeded.wait()
    if reused:
        return {}
    return start_layers(pool, pins, paths, grounds.cache, budget, own)


def _plan(
    requirements: RequirementSet,
    resolutions: Sequence[Resolution],
    chosen: Chosen,
    inspections: Mapping[str, WheelInspection],
    target: Target[BaseProfile],
    settings: RunSettings,
    wheel_files: Mapping[str, Path],
) -> Plan:
    """Every arch's plan from its resolution and the wheels' inspections (pure; Playwright's
    browsers.json is read from its wheel here, and handed to the plan)."""
    browser_lists = {
        sha256: listing
        for sha256, inspection in inspections.items()
        if inspection.name == browsers.PLAYWRIGHT and sha256 in wheel_files
        if (listing := member_bytes(wheel_files[sha256], browsers.BROWSERS_JSON)) is not None
    }
    arch_plans = tuple(
        plan_arch(
            resolution,
            chosen[resolution.arch.name],
            inspections,
            target,
            settings.with_optional,
            frozenset(settings.without_programs),
            browser_lists,
        )
        for resolution in resolutions
    )
    direct = tuple(r.name for r in requirements.requirements)
    return Plan(
        base=target.base,
        base_image=target.base.pinned.as_written,
        arches=arch_plans,
        import_modules=import_modules(direct, arch_plans),
        runtime_checks=runtime_checks(arch_plans),
        requested=requested_distributions(direct, arch_plans),
    )


def _with_bytecode(
    plan: Plan,
    layers: Mapping[str, tuple[ExtrasLayer, ...]],
    compile_: _Compiling,
    cache: Cache,
) -> tuple[Plan, dict[str, tuple[ExtrasLayer, ...]], dict[str, BytecodeFacts]]:
    """The layers with the compiled wheels' bytecode layers; the plan names the interpreter."""
    parts = compile_.queue.results()
    interpreter = compile_.starting.result().interpreter
    assert interpreter is not None, "the Compiler identifies its interpreter on entry"
    stacks, facts = with_bytecode(layers, parts, interpreter, EXTRA_DEPS, cache)
    remember_interpreter(cache, plan.base_image, interpreter)
    return replace(plan, bytecode=interpreter.build), stacks, facts


def _render(
    plan: Plan,
    settings: RunSettings,
    grounds: Grounds,
    layers: Mapping[str, tuple[ExtrasLayer, ...]],
    resolutions: Sequence[Resolution],
    facts: Mapping[str, BytecodeFacts],
) -> None:
    """The build context: the Dockerfile, the locks, the layers, report.json."""
    labels = dict(finish(plan, settle(settings, plan), grounds.cache, layers).labels)
    if settings.bytecode and grounds.compiler is None:  # no engine compiled it: the Dockerfile will
        labels[BYTECODE_LABEL] = BYTECODE_BY_STEP
    render(
        plan,
        settings.output,
        layers,
        {r.arch.name: r.pylock for r in resolutions},
        Secrets.of(settings.apt_secrets),
        labels,
        {arch: one.to_dict() for arch, one in facts.items()},
        grounds.timeline.to_dict(),
    )


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
    _check_local_wheels(requirements, cache, None, UNPACKED_MAX)
    resolution = _resolve_public(requirements, target, cache)
    if resolution is None:
        return ()
    chosen = [choose_wheel(p, target, arch)[0] for p in resolution.packages]
    with ThreadPoolExecutor(max_workers=DOWNLOADS) as fetch:
        downloads = start_downloads(chosen, cache, requirements.indexes(), fetch, check=check_wheel)
        inspections = inspect_as_ready(_as_ready(downloads), cache)
    needs, _ = program_needs(
        [inspections[file.sha256] for file in chosen],
        base.packages.get(arch.name, frozenset()),
        arch,
        without,
    )
    return tuple(need for need in needs if not need.optional)


def _resolve_public(
    requirements: RequirementSet, target: Target[BaseProfile], cache: Cache
) -> Resolution | None:
    """The resolution of what the index holds of the set: a requested distribution no index
    lists (a private or vendored one the image holds) is left out, so verification reads it
    from the image's own metadata alone (None when nothing is left)."""
    while requirements.requirements:
        try:
            return resolve(requirements, target, target.arches[0], cache)
        except NotOnIndex as missing:
            kept = tuple(r for r in requirements.requirements if r.name != missing.name)
            if len(kept) == len(requirements.requirements):
                raise  # a dependency, not a requested distribution: the set is incomplete
            requirements = replace(requirements, requirements=kept)
    return None


def _as_ready(downloads: Mapping[str, Future[Path]]) -> Iterator[tuple[Path, str]]:
    """(path, sha256) of each download as it ends: what is worked on before the last one."""
    arrived = {future: sha for sha, future in downloads.items()}
    for future in as_completed(arrived):
        yield future.result(), arrived[future]


def _pulled_first(
    ready: Iterator[tuple[Path, str]], pulls: Mapping[str, Future[bool]]
) -> Iterator[tuple[Path, str]]:
    """`ready`'s wheels, each once its pull (if any: its layer, its bytecode) ended, so what was
    pulled is found, not made again beside its pull: a wheel with no pull under way as it
    comes, the others after, each as its pull ends, so none to make waits behind a pull."""
    waiting: dict[Future[bool], list[tuple[Path, str]]] = {}
    for path, sha256 in ready:
        pull = pulls.get(sha256)
        if pull is None or pull.done():
            yield path, sha256
        else:
            waiting.setdefault(pull, []).append((path, sha256))
    for pull in as_completed(waiting):
        yield from waiting[pull]


def _marking(mark: Callable[[str], None], sha256: str) -> Callable[[Future[Path]], None]:
    """A download's callback: `sha256` arrived (the timeline's mark)."""
    return lambda _: mark(sha256)


def _start_compiler(grounds: Grounds, target: Target[BaseFacts], stack: ExitStack) -> Compiler:
    """The base's interpreter, started (pulled first if need be) while the set resolves."""
    assert grounds.compiler is not None
    arches = tuple(a.name for a in target.arches)
    base = grounds.base.pinned
    return stack.enter_context(
        base_compiler(grounds.compiler, base, arches, grounds.cache, EXTRA_DEPS)
    )


@dataclass(frozen=True)
class Finish:
    """What the tool puts on top of each arch's system stage: its layers, labels, created."""

    layers: Mapping[str, tuple[ExtrasLayer, ...]]  # arch -> the extras layers, bottom to top
    labels: Mapping[str, str]
    created: str
    cache: Cache
    facts: bytes | None = None  # the build facts attached to each image (FACTS_LABEL names it)


def extras_hash_of(plan: Plan) -> str:
    """The extras hash: what the tag and the `.version` label name besides the platform."""
    digest_input = [lock_text(plan, a.arch) + " ".join(a.apt_packages) for a in plan.arches]
    return extras_hash([plan.base_image, *digest_input])


def settle(asked: RunSettings, plan: Plan) -> Settings:
    """The run's settings resolved against its plan: the one place the record is made (a
    runner's part and merge read the planning run's back from the plan document)."""
    return Settings(asked, plan.base_reference, extras_hash_of(plan))


def finish(
    plan: Plan,
    settings: Settings,
    cache: Cache,
    layers: Mapping[str, tuple[ExtrasLayer, ...]] | None = None,
) -> Finish:
    """The layers, labels and `created` each arch's image gets (the same in the Dockerfile).

    `layers` None: each arch's layers are written (or found in the cache, with the bytecode
    `prepare` compiled); empty: none is needed (a rebase), and only the date the locks fix is
    read from the wheels.
    """
    interpreter = known_interpreter(cache, plan.base_image) if plan.bytecode else None
    if layers is None:
        layers = plan_layers(plan, cache, interpreter, group_budget(bool(plan.bytecode)))
    labels = labels_of(plan, settings, interpreter.build if interpreter else "none")
    facts = build_facts(plan, layers, cache) if layers else None
    facts = unmasked(facts)
    if facts is not None:
        labels = dict(sorted({**labels, FACTS_LABEL: digest_of(facts)}.items()))
    return Finish(layers, labels, created(plan_epoch(plan)), cache, facts)


def labels_of(plan: Plan, settings: Settings, bytecode: str) -> dict[str, str]:
    """The labels each arch's image and the index carry (the same in the Dockerfile): the
    base, the date the locks fix, the platform version and extras hash, and the interpreter
    build that compiled the bytecode (`bytecode`; "none")."""
    return image_labels(
        plan.base.image,
        plan.base.digest,
        plan_epoch(plan),
        settings.platform_version,
        settings.extras_hash,
        bytecode,
    )


def unmasked(facts: bytes | None) -> bytes | None:
    """The build facts as they are when no remembered secret is in them, else None: masked
    they would not be the bytes their label names, and they are never pushed unmasked, so the
    image goes without facts (builder.reporter.mask)."""
    if facts is None or mask(facts.decode(), urls=False) != facts.decode():
        return None
    return facts


def build_facts(
    plan: Plan, layers: Mapping[str, tuple[ExtrasLayer, ...]], cache: Cache
) -> bytes | None:
    """The build facts document of `plan` (builder.publish.build_facts): every wheel's
    inspection, as the cache holds it, and every distribution layer; None when a wheel's
    inspection is not in the cache (a plan made elsewhere: no facts rather than partial ones)."""
    wheels = {w.sha256: w.filename for arch in plan.arches for w in arch.wheels}
    inspections = [cached_inspection(cache, name, sha) for sha, name in sorted(wheels.items())]
    known = [one for one in inspections if one is not None]
    if len(known) != len(inspections):
        return None
    stacks = [one for stack in layers.values() for one in stack if one.wheels]
    laid = [_laid_out(one) for one in stacks if one.kind == LayerKind.DISTRIBUTION]
    return facts_of(FORMATS, known, laid).document()


def _laid_out(one: ExtrasLayer) -> LaidOut:
    layer = one.layer
    shadowed = tuple(sorted(one.shadowed))
    return LaidOut(one.wheels, shadowed, layer.diff_id, layer.size, layer.source_date_epoch)


def _requirements(settings: RunSettings) -> RequirementSet:
    """The requirement files' set with the run's own resolver flags added (--find-links after
    the files' own, --no-index when either says it)."""
    read = read_requirements(settings.requirements, settings.constraints)
    return replace(
        read,
        torch_backend=settings.torch_backend,
        find_links=tuple(dict.fromkeys(read.find_links + settings.find_links)),
        no_index=read.no_index or settings.no_index,
    )


def build_parameters(plan: Plan, resolved: Settings) -> BuildParameters:
    """What the operator asked for, as the provenance names it: files by hash, the package
    indexes without their credentials, apt secrets by the id BuildKit mounts them under (never
    their contents)."""
    settings = resolved.asked
    secrets = Secrets.of(settings.apt_secrets)
    requirements = _requirements(settings)
    indexes = () if requirements.no_index else requirements.indexes()
    return BuildParameters(
        requirements=input_files(named_contents(settings.requirements)),
        constraints=input_files(named_contents(settings.constraints)),
        overrides=input_files(named_contents(settings.overrides)),
        arches=tuple(a.arch for a in plan.arches),
        platform_version=resolved.platform_version,
        base_image=plan.base_image,
        flags={
            "with_optional": settings.with_optional,
            "without_programs": " ".join(sorted(set(settings.without_programs))),
            "torch_backend": settings.torch_backend or "",
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
