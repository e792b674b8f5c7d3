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
from enum import Enum, StrEnum
from types import MappingProxyType

from builder.inspect.elf import ElfFile
from builder.inspect.wheels import WheelInspection
from builder.plan.debian import (
    library_stems,
    package_for,
    sonames_for_load,
    split_symbol_version,
)
from builder.plan.gpu import (
    DriverLibrary,
    accelerator_only,
    driver_library,
    gpu_plugin,
    on_demand_plugin,
)
from builder.resolve.target import ARCHES, Arch

ORIGIN_TOKENS = ("${ORIGIN}", "$ORIGIN")
KERNEL_PROVIDED = ("linux-vdso", "linux-gate")  # mapped by the kernel, never a file
_VERSIONED_NAME = re.compile(r".+\.so(\.\d+)+")  # libssl.so.3: one soname, not any version
LOADER_MACHINES = MappingProxyType({arch.loader: arch.machine for arch in ARCHES.values()})

# How a DT_NEEDED entry is satisfied.


class By(StrEnum):
    """What provides a native need."""

    RPATH = "rpath"  # a directory of the file's RPATH/RUNPATH inside the tree
    WHEEL_SET = "wheel set"  # some ELF file of the set has that soname/basename
    BASE = "base"
    LOADER = "loader"
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
    gpu: str = ""  # only GPU plugins need it: why the first of them is one


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
    by: By
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
                resolution = NeedSource(label, soname, By.RPATH, found)
            elif soname in by_name:
                resolution = NeedSource(label, soname, By.WHEEL_SET, by_name[soname])
            elif soname in provided_by_base:
                resolution = NeedSource(label, soname, By.BASE)
            elif soname == loader or soname.startswith(KERNEL_PROVIDED):
                resolution = NeedSource(label, soname, By.LOADER)
            else:
                resolution = NeedSource(label, soname, By.MISSING)
            resolutions.append(resolution)
    return tuple(resolutions)


def _is_extension(path: str) -> bool:
    """Python can import it: `name.cpython-313-….so` or `name.abi3.so` (pyarrow's
    `lib.cpython-313-x86_64-linux-gnu.so` too), or a plain `name.so` not named like a library."""
    name = posixpath.basename(path)
    match = EXTENSION_NAME.fullmatch(name)
    if match is None:
        return False
    return bool(match.group(1)) or not name.startswith("lib")


@dataclass(frozen=True)
class OnDemand:
    """The files of a set nothing loads unless asked, and which of them only GPU plugins reach."""

    optional: frozenset[str]  # labels: "dist==version: path"
    gpu: Mapping[str, str]  # label of each file only GPU plugins reach -> why the plugin is one


def on_demand_files(
    wheels: Sequence[WheelInspection], resolutions: Sequence[NeedSource], machine: str | None
) -> OnDemand:
    """Labels of files nothing loads unless asked, and what only they link.

    Loaded on demand: plugins under a `plugins/` directory that no file links and Python cannot
    import (Qt's platform plugins), and GPU plugins (plan.gpu.gpu_plugin: a library no file
    links and Python cannot import that links an accelerator's runtime neither the set nor the
    base provides, onnxruntime's CUDA execution provider; or one builder/data/gpu.toml's
    `plugins` names, NVSHMEM's transports, bitsandbytes' kernel library per CUDA version).
    Every other file is reachable from an extension module or loaded directly: a library no
    file links may be opened by Python through a computed path (lightgbm's `lib_lightgbm.so`,
    torch's `libtorch_global_deps.so`), so it counts as loaded.
    """
    files = dict(_files(wheels, machine))
    label_of = {elf.path: label for label, elf in files.items()}
    edges: dict[str, set[str]] = {}
    for resolution in resolutions:
        if resolution.provider in label_of:
            edges.setdefault(resolution.path, set()).add(label_of[resolution.provider])
    linked = set().union(*edges.values())
    # Only a runtime the image will not carry says "GPU only": a library whose CUDA runtime the
    # set ships (xgboost's, were it linked) loads on a CPU node too.
    missing = {(r.path, r.soname) for r in resolutions if r.by == By.MISSING}
    gpu_plugins = {
        label: why
        for label, elf in files.items()
        if not _is_extension(elf.path)
        and (label not in linked or on_demand_plugin(elf.path) is not None)
        and (why := gpu_plugin(elf.path, [n for n in elf.needed if (label, n) in missing]))
        is not None
    }
    roots = [
        label
        for label, elf in files.items()
        if _is_extension(elf.path)
        or (label not in linked and not PLUGIN_DIR.search(elf.path) and label not in gpu_plugins)
    ]
    reached = _reach(roots, edges)
    gpu: dict[str, str] = {}
    for plugin, why in sorted(gpu_plugins.items()):
        for label in sorted(_reach([plugin], edges) - reached):
            gpu.setdefault(label, why)
    return OnDemand(frozenset(files) - reached, MappingProxyType(gpu))


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


def external_needs(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], loader: str
) -> tuple[NativeNeed, ...]:
    """Sonames that neither the wheel set, the base nor the loader provide, sorted; optional
    when only plugins loaded on demand need them, and said to be the GPU's when only GPU
    plugins do."""
    resolutions = resolve_needs(wheels, provided_by_base, loader)
    on_demand = on_demand_files(wheels, resolutions, LOADER_MACHINES.get(loader))
    needed_by: dict[str, set[str]] = {}
    for resolution in resolutions:
        if resolution.by == By.MISSING:
            needed_by.setdefault(resolution.soname, set()).add(resolution.path)
    needs = []
    for soname, paths in sorted(needed_by.items()):
        ordered_paths = tuple(sorted(paths))
        only_gpu = all(path in on_demand.gpu for path in paths)
        gpu = on_demand.gpu[ordered_paths[0]] if only_gpu else ""
        needs.append(NativeNeed(soname, ordered_paths, paths <= on_demand.optional, gpu))
    return tuple(needs)


@dataclass(frozen=True)
class NodeNeed:
    """A library of the NVIDIA driver's the set's code loads: the GPU node provides it."""

    driver: DriverLibrary
    soname: str
    needed_by: tuple[str, ...]  # "dist==version: path.py:line", sorted


@dataclass(frozen=True)
class Loads:
    """What the set's Python code loads by name: libraries Debian packages provide (or none,
    for another accelerator's runtime), libraries the GPU node provides (the NVIDIA driver's),
    and a warning for each name nothing provides."""

    needs: tuple[LoadNeed, ...]
    node: tuple[NodeNeed, ...]
    warnings: tuple[str, ...]


class LoadKind(Enum):
    """Who answers one load site of the set's Python code."""

    DEBIAN = "a Debian package"
    GPU_NODE = "the GPU node"
    ACCELERATOR = "another accelerator's runtime"
    NOBODY = "nobody"


@dataclass(frozen=True)
class SiteAnswer:
    kind: LoadKind
    soname: str = ""
    package: str = ""  # DEBIAN, or ACCELERATOR when Debian ships that runtime
    reason: str = ""  # ACCELERATOR: why only that accelerator's path loads it
    driver: DriverLibrary | None = None  # GPU_NODE: which of the driver's libraries


def load_needs(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], arch: Arch
) -> Loads:
    """Libraries the set's Python code loads by name (ctypes/cffi) that the base and the set
    do not ship, as Debian packages or the GPU node's; and a warning for each name Debian has
    no library for.

    A load site lists candidates tried in turn: a site any candidate of which the set or the
    base satisfies needs nothing (an unversioned `cudart` beside the CUDA wheel's
    libcudart.so.13 too); else the first candidate that Debian, the GPU node or another
    accelerator answers decides. Names only another OS uses are ignored. A library only loaded
    where the code carries on without it is optional; so is one only another accelerator's
    path loads (AMD's HIP, Intel's Level Zero), with that reason.
    """
    shipped = {name for _, elf in _files(wheels, arch.machine) for name in _names(elf)}
    present = shipped | provided_by_base
    present_stems = {stem for name in present for stem in library_stems(name)}
    needs: dict[tuple[str, str], dict[str, bool]] = {}  # -> label -> optional
    reasons: dict[tuple[str, str], str] = {}
    node: dict[str, tuple[DriverLibrary, set[str]]] = {}
    warnings = []
    for wheel in wheels:
        for site in wheel.loads:
            label = f"{wheel.pin}: {site.where}"
            linux = _linux_candidates(site.names, arch)
            if not linux or _satisfied(linux, present, present_stems):
                continue
            answer = _answer(linux, arch)
            key = (answer.soname, answer.package)
            if answer.kind is LoadKind.GPU_NODE and answer.driver:
                node.setdefault(answer.soname, (answer.driver, set()))[1].add(label)
            elif answer.kind is LoadKind.ACCELERATOR:
                needs.setdefault(key, {})[label] = True
                reasons[key] = answer.reason
            elif answer.kind is LoadKind.DEBIAN:
                needs.setdefault(key, {})[label] = site.optional
            else:
                names = " or ".join(name for name, _ in linux)
                warnings.append(
                    f"warning: {label} loads {names} at run time; no Debian 13 package"
                    f" provides it for {arch.name}"
                )
    return Loads(
        needs=tuple(_load_need(key, by, reasons) for key, by in sorted(needs.items())),
        node=tuple(
            NodeNeed(driver, name, tuple(sorted(by))) for name, (driver, by) in sorted(node.items())
        ),
        warnings=tuple(warnings),
    )


def _load_need(
    key: tuple[str, str], by: Mapping[str, bool], reasons: Mapping[tuple[str, str], str]
) -> LoadNeed:
    """One library's load sites as a need: optional when every site is, with the reason only
    then (a site that needs it for sure makes another site's accelerator reason moot)."""
    optional = all(by.values())
    soname, package = key
    reason = reasons.get(key, "") if optional else ""
    return LoadNeed(soname, package, tuple(sorted(by)), optional, reason)


def _linux_candidates(names: Sequence[str], arch: Arch) -> list[tuple[str, tuple[str, ...]]]:
    """A load site's candidate names Linux can open, each with the Debian sonames it may be."""
    options = [(name, sonames_for_load(name, arch)) for name in names]
    return [(name, sonames) for name, sonames in options if sonames is not None]


def _satisfied(
    linux: Sequence[tuple[str, tuple[str, ...]]], present: set[str], stems: set[str]
) -> bool:
    """Some candidate is a file or soname the set or the base already has. A versioned name
    (`libssl.so.3`) wants that very soname; an unversioned one (`cudart`, `libcudart.so`) any
    version, as the package's own path logic or the loader would find it."""
    return any(
        posixpath.basename(name) in present
        or set(sonames) & present
        or (not _VERSIONED_NAME.fullmatch(posixpath.basename(name)) and library_stems(name) & stems)
        for name, sonames in linux
    )


def _answer(linux: Sequence[tuple[str, tuple[str, ...]]], arch: Arch) -> SiteAnswer:
    """Who answers a load site the set does not satisfy: its candidates in order, the first
    that Debian ships, the GPU node provides or another accelerator's path alone loads."""
    for name, sonames in linux:
        base = posixpath.basename(name)
        if driver := driver_library(base):
            return SiteAnswer(LoadKind.GPU_NODE, base, driver=driver)
        reason = accelerator_only(base)
        if found := _debian_library([(name, sonames)], arch):
            kind = LoadKind.ACCELERATOR if reason else LoadKind.DEBIAN
            return SiteAnswer(kind, found[0], found[1], reason or "")
        if reason:
            return SiteAnswer(LoadKind.ACCELERATOR, base, "", reason)
    return SiteAnswer(LoadKind.NOBODY)


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


def link_edges(
    wheels: Sequence[WheelInspection], provided_by_base: frozenset[str], loader: str
) -> frozenset[tuple[str, str]]:
    """(linker, provider) distribution names where a file of one links (DT_NEEDED) a file of
    another: dropping the provider breaks the loader wherever the linker's file is loaded."""
    owner = {
        elf.path: wheel.name
        for wheel in wheels
        for elf in wheel.elf_files
        if elf.machine == LOADER_MACHINES.get(loader)
    }
    return frozenset(
        (linker, owner[need.provider])
        for need in resolve_needs(wheels, provided_by_base, loader)
        if need.provider in owner
        and (linker := need.path.partition("==")[0]) != owner[need.provider]
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
