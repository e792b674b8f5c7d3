"""Deep imports: every module of the requested distributions imported in the hardened image,
each failure classified by its cause.

`import librosa` loads none of librosa's submodules; an agent's first `librosa.load` does, and
one of them may need what the sandbox forbids (numba's cache beside the code). So every module
the image's own installed files list (RECORD) is imported, in worker interpreters inside the
hardened run, within a time budget. A failing module is then imported again in a permissive
run of the same image (as root, writable root filesystem) and the two are compared:

- a native library that cannot be opened fails: the plan missed a need;
- a failure only the hardened run has fails: the sandbox breaks that module;
- a module absent from the image (optional, undeclared, a stdlib part the base leaves out) is
  information, grouped by the missing module;
- anything else failing the same way in both runs is information, listed.

Information is a line of its own that `--strict` turns into a failure.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import docker.errors
import requests.exceptions

from builder.engines.connection import Engine
from builder.verify.client import Sandbox
from builder.verify.container import LABEL
from builder.verify.deep.causes import (
    Cause,
    DeepRun,
    classify,
    failure_checks,
    figures_of,
    information_checks,
    parsed,
)
from builder.verify.deep.script import DEEP, WORKER
from builder.verify.deep.use import UseCheck
from builder.verify.report import Check, ContractViolation, DeepFigures, noted

BUDGET = 120.0  # seconds the hardened run may spend importing (a large set's: ~15 s native)
EMULATED_BUDGET = 480.0  # under qemu Pythons start and import several times slower
WORKERS = 2  # worker interpreters: importing is CPU-bound, and verification shares the machine
MAX_RERUN = 1000  # failing modules imported again permissive (the large set: ~125)
MODULE_TIMEOUT = 60.0  # one import that has not ended by then (waiting on input, a lock) fails
SLACK = 60.0  # how much longer than the budget the command may take (listing, teardown)


@dataclass(frozen=True)
class DeepOptions:
    """How deep imports run: modules skipped (fnmatch patterns, `--skip-module`), the budget
    (None: BUDGET natively, EMULATED_BUDGET emulated), and the use checks that follow them."""

    skip: Sequence[str] = ()
    budget: float | None = None
    uses: Sequence[UseCheck] | None = None  # the use checks to choose from; None: the curated
    module_timeout: float | None = None  # one import's; None: MODULE_TIMEOUT, scaled emulated


def request(budget: float, module_timeout: float, **what: Any) -> str:
    limits = {"budget": budget, "module_timeout": module_timeout, "workers": WORKERS}
    return json.dumps(limits | what)


def budget_of(sandbox: Sandbox, options: DeepOptions) -> float:
    return options.budget or (EMULATED_BUDGET if sandbox.machine.emulated else BUDGET)


def timeout_of(sandbox: Sandbox, options: DeepOptions) -> float:
    """One import's time limit: under qemu every import is as many times slower as the run."""
    scale = EMULATED_BUDGET / BUDGET if sandbox.machine.emulated else 1.0
    return options.module_timeout or MODULE_TIMEOUT * scale


def hardened_run(
    sandbox: Sandbox, distributions: Sequence[str], options: DeepOptions, budget: float
) -> DeepRun:
    """Every module of `distributions` imported through the hardened sandbox's /execute."""
    timeout = timeout_of(sandbox, options)
    asked = request(budget, timeout, distributions=list(distributions), skip=list(options.skip))
    try:
        result = sandbox.execute(
            ["python3", "-c", DEEP, asked, WORKER], timeout_seconds=budget + SLACK
        )
    except (ContractViolation, OSError, http.client.HTTPException):
        return DeepRun()  # no summary: the `deep-imports` line fails
    return parsed(result["stdout"].splitlines())


def permissive_run(
    engine: Engine, image: str, modules: Sequence[str], budget: float, module_timeout: float
) -> DeepRun:
    """`modules` imported again in `image` run as root with a writable root filesystem (no
    network): what fails there too is not the sandbox's doing. An engine that cannot run it
    gives an empty run: each failure is then reported uncompared, as is each past the first
    MAX_RERUN (the list is one argument, which the kernel caps at 128 KiB)."""
    try:
        container = engine.client.containers.run(
            image,
            entrypoint=["python3", "-c", DEEP],
            command=[request(budget, module_timeout, modules=list(modules[:MAX_RERUN])), WORKER],
            user="0:0",
            network_disabled=True,
            detach=True,
            pids_limit=1024,
            labels={LABEL: "1"},
            name=f"bsi-verify-permissive-{uuid.uuid4().hex[:12]}",
        )
    except docker.errors.DockerException:
        return DeepRun()
    try:
        container.wait(timeout=budget + SLACK)
        logs = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        logs = ""  # it did not end in time, or the engine failed: no word on any module
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True, v=True)
    return parsed(logs.splitlines())


# modules, budget, one module's timeout: `permissive_run`
Rerun = Callable[[Sequence[str], float, float], DeepRun]


def deep_checks(
    sandbox: Sandbox, distributions: Sequence[str], options: DeepOptions, rerun: Rerun
) -> tuple[list[Check], list[DeepFigures]]:
    """The deep-import lines (failures, then information), and each distribution's figures."""
    budget = budget_of(sandbox, options)
    run = hardened_run(sandbox, distributions, options, budget)
    failing = [o.module for o in run.outcomes.values() if not o.ok and not o.unreached]
    second = rerun(failing, budget, timeout_of(sandbox, options)).outcomes if failing else {}
    causes = {name: classify(found, second.get(name)) for name, found in run.outcomes.items()}
    figures = [figures_of(name, run, causes) for name in run.listed if name not in run.absent]
    checks = [summary_check(run, causes, options)]
    checks += failure_checks(run, causes, second)
    checks += information_checks(run, causes)
    return checks, figures


def summary_check(run: DeepRun, causes: dict[str, Cause], options: DeepOptions) -> Check:
    """`deep-imports`: how many modules of how many distributions, and what cut or skipped
    them. A budget that cut the run is information (`--strict` fails it)."""
    total = sum(len(modules) for modules in run.listed.values())
    counts = {cause: sum(c is cause for c in causes.values()) for cause in Cause}
    failed = sum(counts[c] for c in Cause if c.failure)
    info = sum(counts[c] for c in Cause if c.information)
    detail = (
        f"{counts[Cause.IMPORTED]} of {total} modules of {len(run.listed)} distributions"
        f" imported, {failed} failed, {info} informational in {run.seconds} s"
    )
    skipped = sum(run.skipped.values())
    if skipped:
        detail += f"; {skipped} skipped by --skip-module {' '.join(options.skip)}"
    if run.absent:
        detail += f"; not installed: {', '.join(run.absent)}"
    if not run.finished:
        return Check("deep-imports", False, f"{detail}; the run ended without its summary")
    unreached = counts[Cause.UNREACHED] + total - len(run.outcomes)
    if unreached:
        cut = f"{detail}; the time budget cut it: {unreached} modules not imported"
        return noted(Check("deep-imports", not failed, cut), "")
    return Check("deep-imports", not failed, detail)
