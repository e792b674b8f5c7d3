"""Which shared libraries a wheel set needs from the system, and which symbol versions are too new.

Pure functions over inspections: every wheel of a set installs into one tree, so a library one
wheel vendors (auditwheel's `<dist>.libs/`) or ships next to its extensions satisfies the others,
like the loader would once it is loaded. What is left must come from the base or from apt.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from builder.analysis.debian import split_symbol_version
from builder.analysis.elf import ElfFile
from builder.analysis.target import ARCHES
from builder.analysis.wheels import WheelInspection

ORIGIN_TOKENS = ("${ORIGIN}", "$ORIGIN")
KERNEL_PROVIDED = ("linux-vdso", "linux-gate")  # mapped by the kernel, never a file
LOADER_MACHINES = {arch.loader: arch.machine for arch in ARCHES.values()}

# How a DT_NEEDED entry is satisfied.
BY_RPATH = "rpath"  # found in a directory of the file's RPATH/RUNPATH inside the tree
BY_WHEEL_SET = "wheel set"  # some ELF file of the set has that soname/basename
BY_BASE = "base"
BY_LOADER = "loader"
MISSING = "missing"


@dataclass(frozen=True)
class NativeNeed:
    """A soname no wheel and not the base provides: a Debian package must."""

    soname: str
    needed_by: tuple[str, ...]  # "dist==version: path/in/tree.so", sorted


@dataclass(frozen=True)
class SymbolProblem:
    """A versioned symbol the target's system library is too old to define."""

    path: str  # "dist==version: path"
    library: str
    version: str  # e.g. GLIBC_2.42
    maximum: str  # e.g. 2.41


@dataclass(frozen=True)
class NeedSource:
    """How one DT_NEEDED entry of one file is satisfied, for reports and debugging."""

    path: str  # "dist==version: path"
    soname: str
    by: str  # BY_RPATH, BY_WHEEL_SET, BY_BASE, BY_LOADER or MISSING
    provider: str | None = None  # tree path of the satisfying file, when it is in the tree


def _files(wheels: Sequence[WheelInspection], machine: str | None) -> Iterator[tuple[str, ElfFile]]:
    for wheel in wheels:
        for elf in wheel.elf_files:
            if machine is None or elf.machine == machine:
                yield f"{wheel.pin}: {elf.path}", elf


def _names(elf: ElfFile) -> set[str]:
    names = {posixpath.basename(elf.path)}
    if elf.soname:
        names.add(elf.soname)
    return names


def _search_dirs(elf: ElfFile) -> list[str]:
    """RPATH/RUNPATH entries relative to $ORIGIN, as tree directories; others leave the tree."""
    origin = posixpath.dirname(elf.path)
    dirs = []
    for entry in elf.rpaths:
        for token in ORIGIN_TOKENS:
            if entry.startswith(token):
                directory = posixpath.normpath(
                    posixpath.join(origin, entry[len(token) :].lstrip("/"))
                )
                if directory != ".." and not directory.startswith("../"):
                    dirs.append(directory)
                break
    return dirs


def resolve_needs(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], loader: str
) -> tuple[NeedSource, ...]:
    """Every DT_NEEDED of every file the loader's architecture can load, with how it resolves."""
    machine = LOADER_MACHINES.get(loader)
    files = list(_files(wheels, machine))
    by_path = {elf.path: elf for _, elf in files}
    by_name: dict[str, str] = {}
    for _, elf in sorted(files, key=lambda item: item[1].path):
        for name in _names(elf):
            by_name.setdefault(name, elf.path)
    resolutions = []
    for label, elf in files:
        dirs = _search_dirs(elf)
        for soname in elf.needed:
            in_dirs = [posixpath.normpath(posixpath.join(d, soname)) for d in dirs]
            found = next((path for path in in_dirs if path in by_path), None)
            if found is not None:
                resolution = NeedSource(label, soname, BY_RPATH, found)
            elif soname in by_name:
                resolution = NeedSource(label, soname, BY_WHEEL_SET, by_name[soname])
            elif soname in provided_by_base:
                resolution = NeedSource(label, soname, BY_BASE)
            elif soname == loader or soname.startswith(KERNEL_PROVIDED):
                resolution = NeedSource(label, soname, BY_LOADER)
            else:
                resolution = NeedSource(label, soname, MISSING)
            resolutions.append(resolution)
    return tuple(resolutions)


def external_needs(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], loader: str
) -> tuple[NativeNeed, ...]:
    """Sonames that neither the wheel set, the base nor the loader provide, sorted."""
    needed_by: dict[str, set[str]] = {}
    for resolution in resolve_needs(wheels, provided_by_base, loader):
        if resolution.by == MISSING:
            needed_by.setdefault(resolution.soname, set()).add(resolution.path)
    return tuple(
        NativeNeed(soname, tuple(sorted(paths))) for soname, paths in sorted(needed_by.items())
    )


def _newer(wanted: tuple[int, ...], maximum: tuple[int, ...]) -> bool:
    # Pad so that GLIBC_2.41 equals a maximum of (2, 41, 0).
    width = max(len(wanted), len(maximum))
    return wanted + (0,) * (width - len(wanted)) > maximum + (0,) * (width - len(maximum))


def symbol_problems(
    wheels: Sequence[WheelInspection], maxima: Mapping[str, tuple[int, ...]]
) -> tuple[SymbolProblem, ...]:
    """Version needs (GLIBC_2.42, GLIBCXX_3.4.34, …) above the target's maxima, sorted.

    Needs on a library the wheel set ships itself (a vendored libstdc++) are the wheel's own
    business: the system library is not the one that must define them.
    """
    files = list(_files(wheels, None))
    shipped = set().union(*(_names(elf) for _, elf in files))
    problems = set()
    for label, elf in files:
        for library, version in elf.version_needs:
            split = split_symbol_version(version)
            if library in shipped or split is None or split[0] not in maxima:
                continue
            maximum = tuple(maxima[split[0]])
            if _newer(split[1], maximum):
                problems.add(SymbolProblem(label, library, version, ".".join(map(str, maximum))))
    return tuple(sorted(problems, key=lambda p: (p.path, p.library, p.version)))
