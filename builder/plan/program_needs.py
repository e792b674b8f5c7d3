"""Which programs a wheel set runs that the image must carry, as Debian packages, per arch.

Pure: inspections (their program sites, inspect.programs), the program index and the
curated table (builder/data/programs.toml) in; needs out. Whether a program is required is
decided as for libraries, by what the code needs to do its main job:

- a program only a desktop uses (a viewer, a clipboard, an editor) or that the base has is
  no need; a run the code carries on without (inside a `try` that swallows the failure, or a
  `which` probe it answers itself) is optional;
- a distribution whose other runs name programs of exactly one Debian package, from at
  least a tenth of its modules, is a wrapper of that program (pdf2image -> poppler-utils,
  graphviz -> graphviz): that package is required;
- any other program is a side feature (matplotlib's LaTeX, pandas' clipboard, imageio's DICOM
  converter): optional, installed with --with-optional;
- a curated entry decides where reading cannot (pypandoc, imageio-ffmpeg), with its reason;
  one true of a range of releases only (kaleido 0.x ships Chromium, 1.x needs it) decides for
  the version the plan resolved, and reading decides a release no entry covers.

A program Debian installs only as an alternatives link (`java`) maps to the package providing
the link through the curated table's `alternatives` (plan.debian.package_for_program).

A site's alternatives (`avconv` or `ffmpeg`) are satisfied by the first one Debian 13 ships,
or by the base when it has any of them. The operator may leave a program out (by its name or
its package): it is then listed as left out, with a warning saying what will not work.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from builder.errors import UserError
from builder.inspect.loads import LoadSite
from builder.inspect.wheels import WheelInspection
from builder.plan.debian import (
    ProgramTable,
    known_package,
    package_for_program,
    program_table,
)
from builder.resolve.target import Arch

WRAPPER_SHARE = 0.1  # of a distribution's modules that must run its one package's programs
# A module for another system (psutil/_psaix.py, _pswindows.py, pkg/_win32.py, util_darwin.py):
# what it runs never runs on Debian, so it cannot make its distribution a wrapper.
OTHER_SYSTEM = re.compile(
    r"(?:^|[/_])(?:ps)?(?:win32|win64|windows|darwin|macos|osx|aix|sunos|solaris|[a-z]*bsd)"
    r"(?:/|\.py$)"
)


@dataclass(frozen=True)
class ProgramNeed:
    """A program the set's code runs, and the package that ships it."""

    program: str
    package: str | None  # None: no Debian 13 package ships it (a curated program)
    needed_by: tuple[str, ...]  # "dist==version: path.py:line", sorted
    optional: bool = False  # installed only with --with-optional
    left_out: bool = False  # the operator said no (without-programs)
    why: str = ""  # what decided required or optional

    @property
    def distributions(self) -> tuple[str, ...]:
        """The `dist==version` pins whose code runs it."""
        return tuple(dict.fromkeys(label.partition(": ")[0] for label in self.needed_by))


@dataclass(frozen=True)
class _Run:
    program: str
    package: str
    site: LoadSite
    incidental: bool  # optional whatever the distribution: guarded, or a probe


def _runs(
    wheel: WheelInspection, table: ProgramTable, base: Collection[str], arch: Arch
) -> list[_Run]:
    """The wheel's sites the image must answer: not by the base, mapped to a package."""
    runs = []
    for site in wheel.programs:
        if table.provided.intersection(site.names) or table.desktop.intersection(site.names):
            continue
        options = [(name, package_for_program(name, arch)) for name in site.names]
        if any(package in base for _, package in options if package):
            continue
        found = next(((name, package) for name, package in options if package), None)
        if found is not None:
            incidental = site.optional or OTHER_SYSTEM.search(site.path) is not None
            runs.append(_Run(found[0], found[1], site, incidental))
    return runs


def _decide(
    wheel: WheelInspection, runs: Sequence[_Run], table: ProgramTable
) -> tuple[set[str], str]:
    """The wheel's required programs, and why; every other run of it is optional."""
    entry = table.entry(wheel.name, wheel.version)  # curated for this release, or none
    if entry is not None and entry.optional:
        return set(), f"curated: {entry.reason}"
    if entry is not None and entry.required is not None:
        return set(entry.required), f"curated: {entry.reason}"
    main = [run for run in runs if not run.incidental]
    packages = {run.package for run in main}
    files = {run.site.path for run in main}
    if len(packages) == 1 and len(files) >= WRAPPER_SHARE * max(wheel.modules, 1):
        package = packages.pop()
        return {run.program for run in main}, (
            f"runs only {package}'s programs, from {len(files)} of its {wheel.modules} modules"
        )
    if len(packages) == 1:
        return set(), (
            f"a side feature: {packages.pop()}'s programs run from {len(files)} of its"
            f" {wheel.modules} modules"
        )
    if packages:
        return set(), f"side features: runs programs of {len(packages)} packages"
    return set(), "only where the code carries on without it"


def program_needs(
    wheels: Sequence[WheelInspection],
    base_packages: Collection[str],
    arch: Arch,
    without: Collection[str] = (),
) -> tuple[tuple[ProgramNeed, ...], tuple[str, ...]]:
    """Every program the set runs that the base does not carry, as packages, sorted; and a
    warning for each required program left out and each name left out that nothing in the set
    runs.

    A required program Debian 13 does not ship (pdfkit's wkhtmltopdf) is a need without a
    package: a plan refuses it (builder.plan.plan) as it refuses a library Debian does not
    ship, and `verify -r` looks for it on the image's PATH. A name left out that is neither a
    program nor a package of Debian 13 (nor such a curated program) is an operator's typo
    (`ffmepg`), refused: leaving nothing out silently would install what they said no to.
    """
    table = program_table()
    curated = {n for found in table.ranges.values() for e in found for n in e.required or ()}
    for name in sorted(without):
        if name in curated or package_for_program(name, arch) or known_package(name, arch):
            continue
        raise UserError(
            f"without-programs: {name!r} is neither a program nor a package Debian 13"
            f" ships for {arch.name}"
        )
    found: dict[tuple[str, str | None], dict[str, tuple[bool, str]]] = {}  # label: optional, why
    warnings: list[str] = []
    for wheel in wheels:
        runs = _runs(wheel, table, base_packages, arch)
        required, why = _decide(wheel, runs, table)
        for run in runs:
            label = f"{wheel.pin}: {run.site.where}"
            optional = run.program not in required
            found.setdefault((run.program, run.package), {})[label] = (optional, why)
        for program in sorted(required - {run.program for run in runs}):
            package = package_for_program(program, arch)  # None: Debian 13 does not ship it
            if package not in base_packages:
                found.setdefault((program, package), {})[f"{wheel.pin}: curated"] = (False, why)
    needs = []
    for (program, package), labels in sorted(found.items()):
        optional = all(flag for flag, _ in labels.values())
        why = next(reason for flag, reason in labels.values() if flag == optional)
        left_out = program in without or package in without
        needs.append(ProgramNeed(program, package, tuple(sorted(labels)), optional, left_out, why))
    for need in needs:
        if need.left_out and not need.optional:
            users = ", ".join(need.distributions)
            package = need.package or f"no Debian 13 package ships it for {arch.name}"
            warnings.append(
                f"warning: {need.program} ({package}) left out by without-programs:"
                f" {users} cannot run it, what needs it will fail in the image"
            )
    named = {need.program for need in needs} | {need.package or "" for need in needs}
    warnings += [
        f"warning: without-programs: nothing in the set runs {name}; leaving it out changes nothing"
        for name in sorted(set(without) - named)
    ]
    return tuple(needs), tuple(warnings)
