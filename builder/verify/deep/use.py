"""Use checks: a library's basic job done in the hardened sandbox (builder/data/use-checks.toml).

An import proves little for a library that does its real work at first use; each curated check
does that work (export a figure, decode a generated sound, parse a generated document, fit a
tiny model, tokenize a sentence). One runs when its distribution is installed in the image at a
release its range covers, each as its own `use NAME` line. A check that cannot pass hardened is
listed as information with why (`--strict` fails it), never silently dropped.
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from importlib import resources

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.verify.client import Sandbox, python_json
from builder.verify.report import Check, expect, last_line, noted, run_check

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
    )
    complete = bool(found.code) != bool(found.why_not_hardened)  # run, or say why not
    if not found.reason or not complete:
        raise ValueError(
            f"use-checks.toml [{name}]: needs a reason, and code (or hardened = false and why)"
        )
    return found


@cache
def curated() -> tuple[UseCheck, ...]:
    """Every check of builder/data/use-checks.toml, in the file's order."""
    text = resources.files("builder.data").joinpath("use-checks.toml").read_text()
    found: list[UseCheck] = []
    for name, value in tomllib.loads(text).items():
        for entry in value if isinstance(value, list) else [value]:
            found.append(use_check(name, entry))
    return tuple(found)


def chosen(
    checks: Sequence[UseCheck], versions: Mapping[str, str | None]
) -> list[tuple[UseCheck, str]]:
    """The checks whose distribution the image holds at a release they fit, with that release."""
    picked = []
    for check in checks:
        version = versions.get(check.distribution)
        if version is not None and check.fits(version):
            picked.append((check, version))
    return picked


def use_checks(
    sandbox: Sandbox, distributions: Sequence[str], checks: Sequence[UseCheck] | None = None
) -> list[Check]:
    """A `use DIST` line per check that fits a distribution of the set (`checks`: the curated
    file's, unless given): run, or, for one that cannot pass hardened, listed with why."""
    wanted = {canonicalize_name(name) for name in distributions}
    candidates = [c for c in (curated() if checks is None else checks) if c.distribution in wanted]
    if not candidates:
        return []
    names = sorted({check.distribution for check in candidates})
    versions = python_json(sandbox, VERSIONS_SCRIPT, json.dumps(names))
    picked = chosen(candidates, versions)
    names = line_names([check for check, _ in picked])
    lines = [(name, check, version) for name, (check, version) in zip(names, picked, strict=True)]
    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(lambda line: one_check(sandbox, *line), lines))


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


def one_check(sandbox: Sandbox, name: str, check: UseCheck, version: str) -> Check:
    """The line of one check of `version` of its distribution: its run, or why not run."""
    if check.why_not_hardened:
        detail = f"{version}: not run: cannot pass in a hardened sandbox: {check.why_not_hardened}"
        return noted(Check(name, True, detail), "")

    def run() -> str:
        result = sandbox.python(check.code)
        code, error = result["exit_code"], last_line(result["stderr"])
        expect(code == 0, f"{version}: {check.reason}; it failed (exit {code}): {error}")
        return f"{version}: {check.reason}: done"

    return run_check(name, run)
