"""`verify_image`: run an image hardened and check the contract, the SDK, imports and snippets."""

from __future__ import annotations

import http.client
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache, partial

from builder.contract import BYTECODE_LABEL
from builder.engines.connection import Engine, engine_client, local_image
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.verify.checks import contract_checks
from builder.verify.client import Sandbox, run_check
from builder.verify.container import Running, hardened, image_user_check
from builder.verify.deep.imports import DeepOptions, Rerun, deep_checks, permissive_run
from builder.verify.deep.use import UseRequest, use_checks
from builder.verify.discovery import check_snippet, import_checks, modules_of
from builder.verify.programs import ProgramExpectation, program_checks
from builder.verify.report import (
    Check,
    Checked,
    CheckFailed,
    ContractViolation,
    VerifyReport,
)
from builder.verify.sbom_check import sbom_check
from builder.verify.sdk import sdk_checks

WORKERS = 4  # checks at once: most wait on the server or on a command, the imports use a core
LIFETIMES = ("timeout", "timeout-cleanup")  # one after the other, in one thread
# After everything else: detached beside race, then the flood alone, then the starve check alone.
LAST = ("detached", "race", "flood", "starve")

Job = Callable[[], list[Check]]


@dataclass(frozen=True)
class Installed:
    """What an image's requirements ask of it beyond named imports: the distributions (every
    top-level module of each imported) and the programs they run (each run)."""

    distributions: Sequence[str] = ()
    programs: Sequence[ProgramExpectation] = ()
    deep: DeepOptions | None = None  # import every module of the distributions too (`deep`)


@dataclass(frozen=True)
class Beside:
    """What runs beside the contract's checks, reported after the imports: the programs the
    set runs, and a long job (deep imports and use checks) started first. `quiet` is awaited
    before the timed checks (race, flood, starve): work on the same machine outside the
    verification (a delivery's SBOM reading) must end before what they time."""

    programs: Sequence[ProgramExpectation] = ()
    first: Job | None = None
    quiet: Callable[[], object] = lambda: None


def verify_image(
    image: ImageRef | str,
    *,
    modules: Sequence[str] = (),
    checks: Sequence[str] = (),
    installed: Installed = Installed(),
    engine: Engine | None = None,
    startup_timeout: float | None = None,
    sdk: bool | None = None,
    sbom: bytes | Callable[[], bytes] | None = None,
) -> VerifyReport:
    """Run `image` hardened and check the runtime contract, the imports and the snippets.

    `image`: a reference the operator named, run as its registry now names it (pulled when
    the engine lacks it or holds an older one, as the probe does); or the engine's own name for
    an image it holds (what a delivery just loaded or pulled: an image id, repository@digest).

    `installed.distributions`: import every top-level module these installed distributions
    provide; `installed.programs`: programs the distributions run, each found on PATH and run
    as the sandbox user (one `program NAME` line each; one the operator left out is reported
    as such).
    `installed.deep`: import every module of those distributions too, hardened, each failure
    compared with a permissive run of the image (builder.verify.deep.imports); None leaves it out.
    `engine`: the engine that runs it (an arch's own: the sandbox is reached where that engine
    publishes its port); None: the local engine, whose client is closed at the end.
    `startup_timeout`: how long the server may take to answer GET /; None allows
    STARTUP_TIMEOUT natively and EMULATED_STARTUP_TIMEOUT when the image's arch is not the
    engine's, so every caller gets the emulated bound without knowing the arch.
    `sdk`: run the upstream SDK's round trip too; None runs it when the SDK is installed, True
    fails the report when it is not, False leaves it out.
    The `bytecode` line (every module imported from /app/deps-extra loaded from a valid .pyc,
    and the set's import time) follows the image's bytecode label: required when it names an
    interpreter, reported otherwise ("none": built without; absent: another tool's image).
    `sbom`: the image's CycloneDX SBOM; the `sbom` line compares it with what the running image
    holds (every distribution on PYTHONPATH and every dpkg package, both ways). A callable is
    called once, before the timed checks (race, flood, starve, which other work on the machine
    would skew): a delivery reads the SBOM's facts while the rest is checked (its error, raised
    from the call, ends the verification).
    A warning (an import that wrote to stderr or stdout) fails the report once it is made
    `strict` (`verify --strict`).
    """
    own_client = engine is None
    if engine is None:
        engine = _local_engine()
    name = image.as_written if isinstance(image, ImageRef) else image
    report = VerifyReport(name)
    try:
        user, bytecode = _image_facts(image, engine)
        report.checks.append(image_user_check(user))
        required = bytecode_required(bytecode)
        with hardened(engine, name, startup_timeout) as running:
            report.checks.append(Check("health", True, running.health))
            _check_running(report, running, modules, checks, installed, sdk, required, sbom)
    except CheckFailed as failure:
        report.checks.append(Check("health", False, str(failure)))
    finally:
        if own_client:
            engine.client.close()
    return report


def _local_engine() -> Engine:
    client = engine_client()
    if client is None:
        raise UserError("Docker engine not reachable: verify runs the image on it")
    return Engine.local(client)


def _image_facts(image: ImageRef | str, engine: Engine) -> tuple[str, str | None]:
    """The image's user and bytecode label: as its registry names it now, or as the engine
    holds it under its own name."""
    if isinstance(image, ImageRef):
        found = local_image(image, engine.client)
    else:
        found = engine.client.images.get(image)
    config = found.attrs.get("Config", {})
    user: str = config.get("User") or ""
    label: str | None = (config.get("Labels") or {}).get(BYTECODE_LABEL)
    return user, label


def _deep_and_use(
    report: VerifyReport,
    sandbox: Sandbox,
    installed: Installed,
    rerun: Rerun,
) -> list[Check]:
    """Deep imports, then the use checks; each distribution's figures go to `report`."""
    options = installed.deep or DeepOptions()
    checks, report.deep = deep_checks(sandbox, installed.distributions, options, rerun)
    try:
        checks += use_checks(sandbox, use_request(installed, options))
    except (ContractViolation, OSError, http.client.HTTPException) as error:
        checks.append(Check("use", False, f"cannot read the installed versions: {error}"))
    return checks


def use_request(installed: Installed, options: DeepOptions) -> UseRequest:
    """The use checks of the set: a distribution whose program was left out has its checks
    listed, not run; the skip patterns leave out the lines they match."""
    left_out = {
        expected.distribution.partition("==")[0]: expected.program
        for expected in installed.programs
        if expected.left_out
    }
    return UseRequest(installed.distributions, options.uses, left_out, options.skip)


def _check_running(
    report: VerifyReport,
    running: Running,
    modules: Sequence[str],
    checks: Sequence[str],
    installed: Installed,
    sdk: bool | None,
    required: bool,
    sbom: bytes | Callable[[], bytes] | None,
) -> None:
    """Everything checked through the running image's port (deep imports and use checks too,
    with `installed.deep`; a permissive run of the same image compares their failures), then
    its SBOM (a callable awaited before the timed checks), then that it still serves, added to
    `report` in that order."""
    awaited = cache(sbom) if callable(sbom) else (lambda: sbom)
    deep = None
    if installed.deep is not None and installed.distributions:
        rerun = partial(permissive_run, running.engine, running.image)
        deep = partial(_deep_and_use, report, running.sandbox, installed, rerun)
    served = served_checks(
        running.sandbox,
        modules,
        checks,
        installed.distributions,
        sdk,
        bytecode=required,
        beside=Beside(installed.programs, deep, awaited),
    )
    report.checks += served.checks
    report.first_import_reads = served.reads
    if (document := awaited()) is not None:
        report.checks.append(sbom_check(running.sandbox, document))
    report.checks.append(run_check("still-serving", running.still_serving))


def served_checks(
    sandbox: Sandbox,
    modules: Sequence[str],
    snippets: Sequence[str],
    distributions: Sequence[str],
    sdk: bool | None,
    process_mode: bool = False,
    bytecode: bool | None = None,
    beside: Beside = Beside(),
) -> Checked:
    """Everything checked through a serving image's port, in report order, and what importing
    the set read.

    Most checks run side by side on a few threads (each is a handful of requests, or commands
    that wait); the timeout and its cleanup run one after the other in one of those threads.
    Then the race runs beside only the detached check (its sleeps barely load the server), then
    the flood alone, then the starve check alone: what they measure (attempts in a fixed time,
    GET / latency, the server's peak RSS, how slowly a Python starts) heavier work would skew,
    and the cleanup's process scan counts any zombie, such as a raced command's not yet reaped.
    The starve check comes last: its few hundred connections load the accept path and hold the
    sandbox's own share of connections for seconds, which would skew the flood's timings and
    refuse any check that talks to the server from inside meanwhile.
    `beside`: the programs to run, and a long job (deep imports) started before the others
    beside them and done before the race, its lines after the programs'.
    """
    contract = contract_checks(process_mode)
    jobs: dict[str, Job] = {
        "first": beside.first or list,
        "lifetimes": partial(contract_run, sandbox, [c for c in contract if c[0] in LIFETIMES]),
        "sdk": partial(sdk_checks, sandbox, required=bool(sdk)) if sdk is not False else list,
        "programs": partial(program_checks, sandbox, beside.programs),
    }
    for name, check in contract:
        if name not in LIFETIMES + LAST:
            jobs[name] = partial(contract_run, sandbox, [(name, check)])
    for number, snippet in enumerate(snippets, start=1):
        jobs[f"check {number}"] = partial(snippet_run, sandbox, number, snippet)
    with ThreadPoolExecutor(WORKERS) as pool:
        importing = pool.submit(wanted_imports, sandbox, modules, distributions, bytecode)
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        imports = importing.result()
        found = {name: future.result() for name, future in futures.items()}
        beside.quiet()
        last = {name: check for name, check in contract if name in LAST}
        detached = pool.submit(contract_run, sandbox, [("detached", last.pop("detached"))])
        found["race"] = contract_run(sandbox, [("race", last.pop("race"))])
        found["detached"] = detached.result()  # before the flood times how slowly Python starts
        found |= {name: contract_run(sandbox, [(name, check)]) for name, check in last.items()}
    by_name = {c.name: c for c in found.pop("lifetimes")}
    order = [[by_name[name]] if name in by_name else found[name] for name, _ in contract]
    order += [found["sdk"], imports.checks, found["programs"], found["first"]]
    order += [found[f"check {number}"] for number in range(1, len(snippets) + 1)]
    return Checked([check for part in order for check in part], imports.reads)


def contract_run(
    sandbox: Sandbox, group: list[tuple[str, Callable[[Sandbox], str]]]
) -> list[Check]:
    return [run_check(name, partial(check, sandbox)) for name, check in group]


def snippet_run(sandbox: Sandbox, number: int, snippet: str) -> list[Check]:
    return [run_check(f"check {number}", partial(check_snippet, sandbox, snippet))]


def bytecode_required(label: str | None) -> bool:
    """Whether the `bytecode` line fails an import from source. Always there: an image built
    without bytecode still shows what the set's import costs every command."""
    return label is not None and label != "none"


def wanted_imports(
    sandbox: Sandbox,
    modules: Sequence[str],
    distributions: Sequence[str],
    bytecode: bool | None = None,
) -> Checked:
    """The distributions' mapping problems, then one import check per module (and the
    `bytecode` line: see `import_checks`), and what importing the set read."""
    wanted = list(dict.fromkeys(modules))
    problems: list[Check] = []
    if distributions:
        try:
            derived, problems = modules_of(sandbox, distributions)
        except (ContractViolation, OSError, http.client.HTTPException) as error:
            derived, problems = [], [Check("requirements", False, f"cannot map: {error}")]
        wanted += [module for module in derived if module not in wanted]
    found = import_checks(sandbox, wanted, bytecode)
    return Checked(problems + found.checks, found.reads)
