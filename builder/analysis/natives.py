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

from builder.analysis.debian import (
    library_stems,
    package_for,
    sonames_for_load,
    split_symbol_version,
)
from builder.analysis.elf import ElfFile
from builder.analysis.gpu import accelerator_only, driver_library
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
    reason: str = ""  # why it is optional when no guard says so (another accelerator's path)


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
    """Labels of files nothing loads unless asked, and what only they link.

    Loaded for sure: extension modules, what they link, and libraries Python code loads
    (ctypes). Loaded on demand: plugins under a `plugins/` directory that no file links, and
    libraries that no file links, no Python load names and that sit beside a library an
    extension module reaches: a native library's own plugins, which it opens by name when
    that transport or backend is chosen (NVSHMEM's `nvshmem_transport_ucx.so`, cuFile's
    `libcufile_rdma.so`). A lone library no file links (lightgbm's `lib_lightgbm.so`, opened
    through a computed path) stays loaded for sure.
    """
    files = dict(_files(wheels, machine))
    label_of = {elf.path: label for label, elf in files.items()}
    edges: dict[str, set[str]] = {}
    for resolution in resolutions:
        if resolution.provider in label_of:
            edges.setdefault(resolution.path, set()).add(label_of[resolution.provider])
    linked = set().union(*edges.values())
    extensions = [label for label, elf in files.items() if _is_extension(elf.path)]
    beside = {posixpath.dirname(files[label].path) for label in _reach(extensions, edges)}
    named = _python_loaded_names(wheels)
    roots = extensions + [
        label
        for label, elf in files.items()
        if label not in linked
        and not PLUGIN_DIR.search(elf.path)
        and (posixpath.dirname(elf.path) not in beside or _names(elf) & named)
    ]
    return frozenset(files) - _reach(roots, edges)


def _reach(roots: Sequence[str], edges: Mapping[str, set[str]]) -> set[str]:
    """Every label `roots` reach through DT_NEEDED, themselves included."""
    reached: set[str] = set()
    pending = list(roots)
    while pending:
        label = pending.pop()
        if label not in reached:
            reached.add(label)
            pending += edges.get(label, ())
    return reached


def _python_loaded_names(wheels: Sequence[WheelInspection]) -> set[str]:
    """File names the set's Python code loads (ctypes/cffi), as written and unversioned."""
    names = {posixpath.basename(n) for w in wheels for site in w.loads for n in site.names}
    return names | {stem for name in names for stem in library_stems(name)}


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


@dataclass(frozen=True)
class Loads:
    """What the set's Python code loads by name: libraries Debian packages provide, libraries
    the GPU node provides (the NVIDIA driver's), and a warning for each name nothing provides."""

    needs: tuple[LoadNeed, ...]
    node: tuple[NativeNeed, ...]
    warnings: tuple[str, ...]


def load_needs(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], arch: Arch
) -> Loads:
    """Libraries the set's Python code loads by name (ctypes/cffi) that the base and the set
    do not ship, as Debian packages or the GPU node's; and a warning for each name Debian has
    no library for.

    A load site lists candidates tried in turn: the first one the system can satisfy counts;
    names only another OS uses (`.dll`, `.dylib`) are ignored, and so is a load the set
    satisfies itself (`cudart` beside the CUDA wheel's libcudart.so.13). A library only loaded
    where the code carries on without it is optional; so is one only another accelerator's
    path loads (AMD's HIP, Intel's Level Zero), with that reason.
    """
    shipped = {name for _, elf in _files(wheels, arch.machine) for name in _names(elf)}
    shipped |= {stem for name in shipped for stem in library_stems(name)}
    needs: dict[tuple[str, str], dict[str, bool]] = {}  # -> label -> optional
    reasons: dict[tuple[str, str], str] = {}
    node: dict[str, set[str]] = {}
    warnings = []
    for wheel in wheels:
        for site in wheel.loads:
            label = f"{wheel.pin}: {site.where}"
            linux = _linux_candidates(site.names, arch)
            if not linux or _satisfied(linux, shipped | provided_by_base):
                continue
            if driver := next((n for n, _ in linux if driver_library(n)), None):
                node.setdefault(posixpath.basename(driver), set()).add(label)
                continue
            found = _debian_library(linux, arch)
            if reason := next((r for n, _ in linux if (r := accelerator_only(n))), None):
                key = found or (posixpath.basename(linux[0][0]), "")
                needs.setdefault(key, {})[label] = True
                reasons[key] = reason
            elif found is None:
                names = " or ".join(name for name, _ in linux)
                warnings.append(
                    f"warning: {label} loads {names} at run time; no Debian 13 package"
                    f" provides it for {arch.name}"
                )
            else:
                needs.setdefault(found, {})[label] = site.optional
    return Loads(
        needs=tuple(
            LoadNeed(soname, package, tuple(sorted(by)), all(by.values()), reasons.get(key, ""))
            for key, by in sorted(needs.items())
            for soname, package in [key]
        ),
        node=tuple(NativeNeed(name, tuple(sorted(by))) for name, by in sorted(node.items())),
        warnings=tuple(warnings),
    )


def _linux_candidates(names: Sequence[str], arch: Arch) -> list[tuple[str, tuple[str, ...]]]:
    """A load site's candidate names Linux can open, each with the Debian sonames it may be."""
    options = [(name, sonames_for_load(name, arch)) for name in names]
    return [(name, sonames) for name, sonames in options if sonames is not None]


def _satisfied(linux: Sequence[tuple[str, tuple[str, ...]]], present: set[str]) -> bool:
    """Some candidate is a file or soname the set or the base already has."""
    return any(
        posixpath.basename(name) in present
        or library_stems(name) & present
        or set(sonames) & present
        for name, sonames in linux
    )


def _debian_library(
    linux: Sequence[tuple[str, tuple[str, ...]]], arch: Arch
) -> tuple[str, str] | None:
    """The first candidate Debian ships: its soname and package."""
    return next(
        (
            (sonames[0], package)
            for _, sonames in linux
            if sonames
            if (package := package_for(sonames[0], arch))
        ),
        None,
    )


def linked_distributions(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], loader: str
) -> frozenset[str]:
    """Names of the distributions whose files another distribution's files link (DT_NEEDED):
    dropping one of them breaks the loader wherever that file is loaded."""
    owner = {
        elf.path: wheel.name
        for wheel in wheels
        for elf in wheel.elf_files
        if elf.machine == LOADER_MACHINES.get(loader)
    }
    return frozenset(
        owner[need.provider]
        for need in resolve_needs(wheels, provided_by_base, loader)
        if need.provider in owner and owner[need.provider] != need.path.partition("==")[0]
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
