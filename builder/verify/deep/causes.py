"""Why a deep import failed: a run's lines read into outcomes, and each failing module
classified by its cause from the hardened and the permissive runs (what builder.verify.deep.imports
runs and reports). Pure: the runs' lines are handed in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from builder.verify.report import Check, DeepFigures, noted, short

# what a loader says when a shared library it needs is not in the image, or not this version
NATIVE = re.compile(
    r"cannot open shared object file|cannot load library|undefined symbol"
    r"|version `[^']+' not found|wrong ELF class"
)
# ctypes asking the interpreter's own process for a symbol it lacks (find_library() found no
# library, so CDLL(None) opened the process): code for another OS (IPython's macOS input hook
# asks for objc_getClass), not a library the image lacks. A library that did load and lacks a
# newer symbol is still the plan's miss.
OWN_PROCESS_LOOKUP = re.compile(r"^AttributeError: \S*python[0-9.]*: undefined symbol")
TIMED_OUT = "the import did not end within"  # the in-image script's words (script.py)


class Cause(Enum):
    """What became of one module."""

    IMPORTED = "imported"
    NATIVE_LIBRARY = "native library"  # failure: the plan missed a need
    SANDBOX_ONLY = "sandbox only"  # failure: imports permissive, not hardened
    UNCOMPARED = "uncompared"  # failure: the permissive run gave no word on it
    ABSENT_MODULE = "absent module"  # information: needs a module the image does not hold
    SAME_BOTH = "same both"  # information: fails the same way hardened and permissive
    SLOW = "slow"  # information: given up hardened, not permissive (a loaded machine's doing)
    UNREACHED = "unreached"  # the budget ran out first

    @property
    def failure(self) -> bool:
        return self in (Cause.NATIVE_LIBRARY, Cause.SANDBOX_ONLY, Cause.UNCOMPARED)

    @property
    def information(self) -> bool:
        return self in (Cause.ABSENT_MODULE, Cause.SAME_BOTH, Cause.SLOW)


@dataclass(frozen=True)
class Outcome:
    """One module's import in one run: the error's last line and the missing module, if any."""

    module: str
    ok: bool
    error: str = ""
    missing: str | None = None
    seconds: float = 0.0
    unreached: bool = False


@dataclass
class DeepRun:
    """What one deep-import run said: each distribution's modules, each module's outcome."""

    listed: dict[str, list[str]] = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)  # distributions not installed
    skipped: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    seconds: float = 0.0
    finished: bool = False


def classify(hardened: Outcome, permissive: Outcome | None) -> Cause:
    """The cause of `hardened`'s outcome, `permissive` being the same module's in a permissive
    run of the same image (None: that run did not report on it)."""
    if hardened.unreached:
        return Cause.UNREACHED
    if hardened.ok:
        return Cause.IMPORTED
    if NATIVE.search(hardened.error) and not OWN_PROCESS_LOOKUP.match(hardened.error):
        return Cause.NATIVE_LIBRARY
    if permissive is None or permissive.unreached:
        return Cause.UNCOMPARED
    if hardened.error.startswith(TIMED_OUT) and permissive.error != hardened.error:
        return Cause.SLOW
    if permissive.ok or permissive.error != hardened.error:
        return Cause.SANDBOX_ONLY
    return Cause.ABSENT_MODULE if hardened.missing else Cause.SAME_BOTH


def parsed(lines: Iterable[str]) -> DeepRun:
    """DEEP's JSON lines as a run; a line cut short (the command killed) ends it."""
    run = DeepRun()
    for text in lines:
        try:
            line = json.loads(text)
        except ValueError:
            break
        if not isinstance(line, dict):
            continue
        if "distribution" in line:
            name = str(line["distribution"])
            run.listed[name] = [str(m) for m in line.get("modules") or []]
            run.skipped[name] = int(line.get("skipped") or 0)
            if line.get("absent"):
                run.absent.append(name)
        elif "module" in line:
            run.outcomes[str(line["module"])] = outcome(line)
        elif isinstance(line.get("done"), dict):
            run.seconds, run.finished = float(line["done"].get("seconds") or 0), True
    return run


def outcome(line: dict[str, Any]) -> Outcome:
    return Outcome(
        module=str(line["module"]),
        ok=line.get("ok") is True,
        error=str(line.get("error") or ""),
        missing=str(line["missing"]) if line.get("missing") else None,
        seconds=float(line.get("seconds") or 0),
        unreached=line.get("unreached") is True,
    )


def figures_of(distribution: str, run: DeepRun, causes: dict[str, Cause]) -> DeepFigures:
    mine = [m for m in run.listed[distribution] if m in causes]
    return DeepFigures(
        distribution=distribution,
        imported=sum(causes[m] is Cause.IMPORTED for m in mine),
        failed=sum(causes[m].failure for m in mine),
        informational=sum(causes[m].information for m in mine),
        unreached=sum(causes[m] is Cause.UNREACHED for m in mine)
        + len(run.listed[distribution])
        - len(mine),
        skipped=run.skipped.get(distribution, 0),
        seconds=round(sum(run.outcomes[m].seconds for m in mine), 2),
    )


def failure_checks(
    run: DeepRun, causes: dict[str, Cause], second: dict[str, Outcome]
) -> list[Check]:
    """One failed line per module whose failure is the image's or the sandbox's."""
    checks = []
    for name, cause in causes.items():
        error = short(run.outcomes[name].error, 200)
        if cause is Cause.NATIVE_LIBRARY:
            why = f"a native library cannot be opened (the plan missed a need): {error}"
        elif cause is Cause.SANDBOX_ONLY:
            there = second[name]
            permissive = "imports" if there.ok else f"fails otherwise ({short(there.error, 120)})"
            why = f"fails only in the hardened sandbox: {error}; as root, writable, it {permissive}"
        elif cause is Cause.UNCOMPARED:
            why = f"{error}; the permissive run gave no word on it"
        else:
            continue
        checks.append(Check(f"deep-import {name}", False, why))
    return checks


def information_checks(run: DeepRun, causes: dict[str, Cause]) -> list[Check]:
    """Information lines: one per module missing from the image (naming the modules that need
    it), then one per module failing the same way in both runs."""
    needs: dict[str, list[str]] = {}
    for name, cause in causes.items():
        if cause is Cause.ABSENT_MODULE:
            needs.setdefault(str(run.outcomes[name].missing), []).append(name)
    checks = [
        noted(
            Check(f"absent {missing}", True, f"not in the image; needed by {len(names)}:"),
            short(", ".join(names), 200),
        )
        for missing, names in sorted(needs.items())
    ]
    for name, cause in causes.items():
        error = short(run.outcomes[name].error, 200)
        if cause is Cause.SAME_BOTH:
            detail = f"fails the same way hardened and permissive: {error}"
        elif cause is Cause.SLOW:
            detail = f"{error} hardened, and ended permissive: a slow import, not a failure"
        else:
            continue
        checks.append(noted(Check(f"deep-import {name}", True, detail), ""))
    return checks
