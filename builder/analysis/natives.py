"""Which shared libraries a wheel set needs from the system, and which symbol versions are too new.

Pure functions over inspections: every wheel of a set installs into one tree, so a library one
wheel vendors (auditwheel's `<dist>.libs/`) or ships next to its extensions satisfies the others,
like the loader would once it is loaded. What is left must come from the base or from apt.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from builder.analysis.debian import package_for, sonames_for_load, split_symbol_version
from builder.analysis.elf import ElfFile
from builder.analysis.target import ARCHES, Arch
from builder.analysis.wheels import WheelInspection

ORIGIN_TOKENS = ("${ORIGIN}", "$ORIGIN")
KERNEL_PROVIDED = ("linux-vdso", "linux-gate")  # mapped by the kernel, never a file
LOADER_MACHINES = MappingProxyType({arch.loader: arch.machine for arch in ARCHES.values()})

# How a DT_NEEDED entry is satisfied.
BY_RPATH = "rpath"  # found in a directory of the file's RPATH/RUNPATH inside the tree
BY_WHEEL_SET = "wheel set"  # some ELF file of the set has that soname/basename
BY_BASE = "base"
BY_LOADER = "loader"
MISSING = "missing"

# A shared object under such a directory, that no file links and Python cannot import, is a
# plugin loaded on demand (Qt's platform plugins, GDAL drivers): its needs are optional.
PLUGIN_DIR = re.compile(r"(^|/)[^/]*plugins?/")
EXTENSION_NAME = re.compile(r"[A-Za-z_]\w*(\.(cpython-[^/]+|abi3))?\.so")


@dataclass(frozen=True)
class NativeNeed:
    """A soname no wheel and not the base provides: a Debian package must."""

    soname: str
    needed_by: tuple[str, ...]  # "dist==version: path/in/tree.so", sorted
    optional: bool = False  # only plugins loaded on demand need it


@dataclass(frozen=True)
class LoadNeed:
    """A library Python code loads by name at run time, and the package that ships it."""

    soname: str
    package: str
    needed_by: tuple[str, ...]  # "dist==version: path.py:line", sorted
    optional: bool = False  # every site that loads it carries on without it


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


def _is_extension(path: str) -> bool:
    """Python can import it: `name.so`, `name.cpython-313-….so` or `name.abi3.so`."""
    name = posixpath.basename(path)
    return bool(EXTENSION_NAME.fullmatch(name)) and not name.startswith("lib")


def optional_files(
    wheels: Sequence[WheelInspection], resolutions: Sequence[NeedSource], machine: str | None
) -> frozenset[str]:
    """Labels of files nothing loads unless asked: plugins no file links and Python cannot
    import, and what only they link. Everything else is reachable from an extension module
    or a library loaded directly (ctypes)."""
    files = dict(_files(wheels, machine))
    label_of = {elf.path: label for label, elf in files.items()}
    edges: dict[str, set[str]] = {}
    for resolution in resolutions:
        if resolution.provider in label_of:
            edges.setdefault(resolution.path, set()).add(label_of[resolution.provider])
    linked = set().union(*edges.values())
    roots = [
        label
        for label, elf in files.items()
        if _is_extension(elf.path) or (label not in linked and not PLUGIN_DIR.search(elf.path))
    ]
    reached: set[str] = set()
    while roots:
        label = roots.pop()
        if label not in reached:
            reached.add(label)
            roots += edges.get(label, ())
    return frozenset(files) - reached


def external_needs(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], loader: str
) -> tuple[NativeNeed, ...]:
    """Sonames that neither the wheel set, the base nor the loader provide, sorted; optional
    when only plugins loaded on demand need them."""
    resolutions = resolve_needs(wheels, provided_by_base, loader)
    optional = optional_files(wheels, resolutions, LOADER_MACHINES.get(loader))
    needed_by: dict[str, set[str]] = {}
    for resolution in resolutions:
        if resolution.by == MISSING:
            needed_by.setdefault(resolution.soname, set()).add(resolution.path)
    return tuple(
        NativeNeed(soname, tuple(sorted(paths)), optional=paths <= optional)
        for soname, paths in sorted(needed_by.items())
    )


def load_needs(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], arch: Arch
) -> tuple[tuple[LoadNeed, ...], tuple[str, ...]]:
    """Libraries the set's Python code loads by name (ctypes/cffi) that the base and the set
    do not ship, as Debian packages; and a warning for each name Debian has no library for.

    A load site lists candidates tried in turn: the first one the system can satisfy counts;
    names only another OS uses (`.dll`, `.dylib`) are ignored. A library only loaded where
    the code carries on without it is optional.
    """
    shipped = {name for _, elf in _files(wheels, arch.machine) for name in _names(elf)}
    needs: dict[tuple[str, str], dict[str, bool]] = {}  # -> label -> optional
    warnings = []
    for wheel in wheels:
        for site in wheel.loads:
            label = f"{wheel.pin}: {site.where}"
            options = [(name, sonames_for_load(name, arch)) for name in site.names]
            linux = [(name, sonames) for name, sonames in options if sonames is not None]
            if not linux or any(
                posixpath.basename(name) in shipped or set(sonames) & (shipped | provided_by_base)
                for name, sonames in linux
            ):
                continue
            found = next(
                (
                    (sonames[0], package)
                    for _, sonames in linux
                    if sonames
                    if (package := package_for(sonames[0], arch))
                ),
                None,
            )
            if found is None:
                names = " or ".join(name for name, _ in linux)
                warnings.append(
                    f"warning: {label} loads {names} at run time; no Debian 13 package"
                    f" provides it for {arch.name}"
                )
            else:
                needs.setdefault(found, {})[label] = site.optional
    return tuple(
        LoadNeed(soname, package, tuple(sorted(labels)), all(labels.values()))
        for (soname, package), labels in sorted(needs.items())
    ), tuple(warnings)


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
