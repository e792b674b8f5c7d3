"""Use checks: a library's basic job done in the hardened sandbox (builder/data/use-checks.toml).

An import proves little for a library that does its real work at first use; each curated check
does that work (export a figure, decode a generated sound, parse a generated document, fit a
tiny model, tokenize a sentence). One runs when its distribution is installed in the image at a
release its range covers (and the distributions it `needs` are installed too), each as its own
`use NAME` line. A check that cannot pass hardened, or whose distribution's program the operator
left out, is listed as information with why (`--strict` fails it), never silently dropped; a
`--skip-module` pattern matching its line's name leaves it out, as the operator asked.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache, partial

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.data import shipped_text
from builder.verify.client import Sandbox, python_json, run_check
from builder.verify.report import Check, expect, last_line, noted

WORKERS = 2  # checks at once: each starts a Python that loads a heavy library
VERSIONS_SCRIPT = """
import json, sys
from importlib import metadata
found = {}
for name in json.loads(sys.argv[1]):
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = None
print(json.dumps(found))
"""


@dataclass(frozen=True)
class UseCheck:
    """One curated check: its distribution, the releases it fits, why it is there, its code,
    and, for one that cannot pass hardened, why not."""

    distribution: str
    versions: SpecifierSet
    reason: str
    code: str = ""
    why_not_hardened: str = ""
    needs: tuple[str, ...] = ()  # other distributions it uses (kaleido's check, plotly)

    def fits(self, version: str) -> bool:
        try:
            return self.versions.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False


def use_check(name: str, entry: Mapping[str, object]) -> UseCheck:
    """One entry of the data file; an entry without its reason, code or why is refused."""
    try:
        versions = SpecifierSet(str(entry.get("versions", "")))
    except InvalidSpecifier:
        raise ValueError(f"use-checks.toml [{name}]: bad versions {entry['versions']!r}") from None
    found = UseCheck(
        distribution=canonicalize_name(name),
        versions=versions,
        reason=str(entry.get("reason", "")),
        code=str(entry.get("code", "")).strip(),
        why_not_hardened="" if entry.get("hardened", True) else str(entry.get("why", "")),
        needs=tuple(canonicalize_name(str(n)) for n in _listed(entry.get("needs", []), name)),
    )
    complete = bool(found.code) != bool(found.why_not_hardened)  # run, or say why not
    if not found.reason or not complete:
        raise ValueError(
            f"use-checks.toml [{name}]: needs a reason, and code (or hardened = false and why)"
        )
    return found


def _listed(value: object, name: str) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"use-checks.toml [{name}]: needs must be a list of distributions")
    return value


@cache
def curated() -> tuple[UseCheck, ...]:
    """Every check of builder/data/use-checks.toml, in the file's order."""
    text = shipped_text("use-checks.toml")
    found: list[UseCheck] = []
    for name, value in tomllib.loads(text).items():
        for entry in value if isinstance(value, list) else [value]:
            found.append(use_check(name, entry))
    return tuple(found)


def chosen(
    checks: Sequence[UseCheck], versions: Mapping[str, str | None]
) -> list[tuple[UseCheck, str]]:
    """The checks whose distribution the image holds at a release they fit, and what they need
    too, with that release."""
    picked = []
    for check in checks:
        version = versions.get(check.distribution)
        needed = all(versions.get(other) is not None for other in check.needs)
        if version is not None and check.fits(version) and needed:
            picked.append((check, version))
    return picked


@dataclass(frozen=True)
class UseRequest:
    """Which use checks a verification runs: the set's distributions, the checks to choose
    from (None: the curated file's), the programs left out (distribution -> program) and the
    skip patterns (`--skip-module`, matched against each `use NAME` line's name)."""

    distributions: Sequence[str]
    checks: Sequence[UseCheck] | None = None
    left_out: Mapping[str, str] = field(default_factory=dict)
    skip: Sequence[str] = ()


def use_checks(sandbox: Sandbox, request: UseRequest) -> list[Check]:
    """A `use DIST` line per check that fits a distribution of the set: run, or, for one that
    cannot pass hardened or whose program was left out, listed with why."""
    wanted = {canonicalize_name(name) for name in request.distributions}
    offered = curated() if request.checks is None else request.checks
    candidates = [check for check in offered if check.distribution in wanted]
    if not candidates:
        return []
    names = sorted({n for check in candidates for n in (check.distribution, *check.needs)})
    versions = python_json(sandbox, VERSIONS_SCRIPT, json.dumps(names))
    picked = chosen(candidates, versions)
    named = zip(line_names([check for check, _ in picked]), picked, strict=True)
    lines = [
        (name, check, version)
        for name, (check, version) in named
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in request.skip)
    ]
    left_out: dict[str, str] = {
        canonicalize_name(name): program for name, program in request.left_out.items()
    }
    with ThreadPoolExecutor(WORKERS) as pool:
        runs = [partial(one_check, sandbox, *line, left_out=left_out) for line in lines]
        return list(pool.map(lambda run: run(), runs))


def line_names(checks: Sequence[UseCheck]) -> list[str]:
    """`use DIST`, numbered `use DIST #2`... where a distribution has several checks."""
    counts = Counter(check.distribution for check in checks)
    seen: Counter[str] = Counter()
    names = []
    for check in checks:
        seen[check.distribution] += 1
        number = f" #{seen[check.distribution]}" if counts[check.distribution] > 1 else ""
        names.append(f"use {check.distribution}{number}")
    return names


def one_check(
    sandbox: Sandbox, name: str, check: UseCheck, version: str, left_out: Mapping[str, str]
) -> Check:
    """The line of one check of `version` of its distribution: its run, or why not run."""
    if check.why_not_hardened:
        detail = f"{version}: not run: cannot pass in a hardened sandbox: {check.why_not_hardened}"
        return noted(Check(name, True, detail), "")
    if check.distribution in left_out:
        program = left_out[check.distribution]
        detail = f"{version}: not run: it needs {program}, left out (--without-program)"
        return noted(Check(name, True, detail), "")

    def run() -> str:
        result = sandbox.python(check.code)
        code, error = result["exit_code"], last_line(result["stderr"])
        expect(code == 0, f"{version}: {check.reason}; it failed (exit {code}): {error}")
        return f"{version}: {check.reason}: done"

    return run_check(name, run)
