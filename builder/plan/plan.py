"""The plan: a plain data object saying exactly what the image will contain, per arch.

Everything here is pure: resolutions, wheel inspections and distro data in, plan out.
Whatever would break in production (no usable wheel, a library Debian does not ship,
a symbol newer than trixie's) is raised here, before any build.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum

from packaging.utils import canonicalize_name, parse_wheel_filename

from builder.contract import DEPS_EXTRA
from builder.errors import UserError
from builder.inspect.wheels import WheelInspection
from builder.oci.name import ImageRef
from builder.plan import browsers, debian
from builder.plan.browsers import BrowserWiring
from builder.plan.gpu import (
    DriverLibrary,
    GpuWeight,
    driver_library,
    gpu_weight,
    weight_warnings,
)
from builder.plan.natives import (
    external_needs,
    link_edges,
    load_needs,
    symbol_problems,
)
from builder.plan.program_needs import ProgramNeed, program_needs
from builder.plan.sizes import size_figures
from builder.resolve.resolution import (
    LockedPackage,
    RemoteFile,
    Resolution,
    Source,
    SourceKind,
    redact,
)
from builder.resolve.target import Arch, BaseFacts, BaseProfile, Target

EXTRA_DEPS = DEPS_EXTRA  # what the extension installs into, appended to PYTHONPATH


class How(StrEnum):
    """How the code reaches a native library (report.json says the value)."""

    LINKED = "linked"  # DT_NEEDED of an ELF file
    LOADED = "loaded at run time"  # ctypes / cffi from Python code


@dataclass(frozen=True)
class PlannedWheel:
    name: str
    version: str
    filename: str
    sha256: str
    tag: str  # the best tag of this wheel that the target accepts
    url: str  # credentials removed
    top_level: tuple[str, ...]
    size: int = 0  # download, bytes
    installed_size: int = 0  # unpacked, bytes
    newest: int = 0  # the newest date inside the wheel (WheelInspection.newest)
    index: str = ""  # the index it came from, credentials removed (builder.resolve.origins)
    source: Source | None = None  # where it came from when not an index: path, URL, VCS...


@dataclass(frozen=True)
class NativeLibrary:
    soname: str
    package: str
    needed_by: tuple[str, ...]
    how: How
    optional: bool = False  # only on-demand plugins or guarded loads need it: on request
    reason: str = ""  # why it is optional when no guard says so: a GPU plugin, an accelerator


@dataclass(frozen=True)
class ArchPlan:
    arch: str
    wheels: tuple[PlannedWheel, ...]
    libraries: tuple[NativeLibrary, ...]
    apt_packages: tuple[str, ...]
    provided_by_base: tuple[str, ...]
    built_from_source: tuple[str, ...]
    optional_packages: tuple[str, ...] = ()  # wanted only by on-demand plugins, not installed
    warnings: tuple[str, ...] = ()
    programs: tuple[ProgramNeed, ...] = ()  # programs the code runs, and their packages
    apt_size: int | None = None  # bytes the apt stage adds (Installed-Size); None: unknown
    gpu_node: tuple[NodeLibrary, ...] = ()  # the NVIDIA driver's: the GPU node provides them
    gpu_weight: GpuWeight | None = None  # GPU-only weight, GPU plugins' needs: one warning
    browsers: BrowserWiring = field(default_factory=BrowserWiring)  # Chromium, for browser drivers

    def installed_programs(self) -> tuple[ProgramNeed, ...]:
        """The programs this arch's image carries (what verification runs), and those left
        out (which it reports as left out)."""
        installed = set(self.apt_packages)
        return tuple(p for p in self.programs if p.package in installed or p.left_out)


@dataclass(frozen=True)
class Plan:
    base: BaseProfile
    base_image: str  # what the final stage starts FROM: tag, and digest when known
    arches: tuple[ArchPlan, ...]
    import_modules: tuple[str, ...]  # top-level modules of the direct requirements
    runtime_checks: tuple[str, ...]  # python snippets proving run-time loaded libraries work
    # the direct requirements the extras install: verification imports every module of each
    requested: tuple[str, ...] = ()
    pythonpath_entry: str = EXTRA_DEPS
    bytecode: str | None = None  # the build of the interpreter that compiled the extras' .pyc

    @property
    def base_reference(self) -> ImageRef:
        """`base_image` as a reference, for every step that asks the registry or the engine
        for it (its text stays what the Dockerfile, the labels and report.json say)."""
        return self.base.pinned

    @property
    def browser_env(self) -> dict[str, str]:
        """The environment that points Playwright and Selenium at Debian's Chromium
        (builder.plan.browsers), the same for every arch as the final stage is."""
        names = {canonicalize_name(wheel.name) for arch in self.arches for wheel in arch.wheels}
        installed = {package for arch in self.arches for package in arch.apt_packages}
        return browsers.browser_env(names, installed, [arch.browsers for arch in self.arches])

    @property
    def warnings(self) -> tuple[str, ...]:
        """Every arch's warnings, once each, for stderr; the GPU weight once for the arches it
        holds for, each arch's bytes named."""
        weights = [arch.gpu_weight for arch in self.arches if arch.gpu_weight]
        own = {line for weight in weights for line in weight_warnings([weight])}
        lines = [line for arch in self.arches for line in arch.warnings if line not in own]
        return tuple(dict.fromkeys([*lines, *weight_warnings(weights)]))

    def to_dict(self) -> dict:
        """The report.json shape; `architectures.<arch>.packages` lists what gets installed."""
        return {
            "base": {**self.base.to_dict(), "source": self.base.source},
            "base_image": self.base_image,
            "pythonpath_entry": self.pythonpath_entry,
            "import_modules": list(self.import_modules),
            "runtime_checks": list(self.runtime_checks),
            "architectures": {
                arch.arch: {
                    "packages": [
                        {"name": w.name, "version": w.version, "size": size_figures([w])}
                        for w in arch.wheels
                    ],
                    "size": size_figures(arch.wheels),
                    "apt_packages": list(arch.apt_packages),
                    "apt_installed_size": arch.apt_size,
                    "optional_apt_packages": list(arch.optional_packages),
                    "wheels": [asdict(w) for w in arch.wheels],
                    "native_libraries": [asdict(lib) for lib in arch.libraries],
                    "programs": [
                        {**asdict(need), "distributions": list(need.distributions)}
                        for need in arch.programs
                    ],
                    "provided_by_base": list(arch.provided_by_base),
                    "provided_by_gpu_node": [asdict(lib) for lib in arch.gpu_node],
                    "built_from_source": list(arch.built_from_source),
                    "browser_links": [asdict(link) for link in arch.browsers.links],
                    "warnings": list(arch.warnings),
                }
                for arch in self.arches
            },
        }


def choose_wheel(
    package: LockedPackage, target: Target[BaseFacts], arch: Arch
) -> tuple[RemoteFile, str]:
    """The wheel with the most specific tag the target accepts, and that tag."""
    best: tuple[int, RemoteFile, str] | None = None
    for wheel in package.wheels:
        tags = parse_wheel_filename(wheel.filename)[3]
        rank = target.tag_rank(arch, frozenset(tags))
        if rank is not None and (best is None or rank < best[0]):
            accepted = min(
                (t for t in tags if target.tag_rank(arch, frozenset([t])) == rank), key=str
            )
            best = (rank, wheel, str(accepted))
    if best is None:
        found = ", ".join(w.filename for w in package.wheels) or "none"
        raise UserError(
            f"{package.name}=={package.version}: no wheel for CPython {target.python_version}"
            f" on manylinux {arch.machine} (found: {found})"
        )
    return best[1], best[2]


@dataclass(frozen=True)
class NodeLibrary:
    """A library the GPU node provides, never the image: the NVIDIA driver's own, which the
    container toolkit mounts for the capability named (builder/data/gpu.toml)."""

    soname: str
    needed_by: tuple[str, ...]
    how: How
    capability: str  # NVIDIA_DRIVER_CAPABILITIES that mounts it: compute, utility, …
    reason: str


def plan_arch(
    resolution: Resolution,
    chosen: Mapping[str, tuple[RemoteFile, str]],
    inspections: Mapping[str, WheelInspection],
    target: Target[BaseFacts],
    with_optional: bool = False,
    without_programs: frozenset[str] = frozenset(),
    browser_lists: Mapping[str, bytes] | None = None,
) -> ArchPlan:
    """Native needs and programs run → Debian packages for one arch; raises on anything
    unusable.

    Needs only plugins loaded on demand have (and programs only side features run) are listed
    but installed only `with_optional`; `without_programs` (program or package names) are
    never installed. The NVIDIA driver's libraries are the GPU node's, never installed.
    `browser_lists` (sha256 -> the Playwright wheel's browsers.json, as the caller read it) give
    the Chromium wiring (builder.plan.browsers); without them Playwright gets no registry.
    """
    arch = resolution.arch
    wheels = _planned_wheels(resolution, chosen, inspections)
    inspected = [inspections[w.sha256] for w in wheels]
    _refuse_too_new_symbols(inspected, arch)
    base_sonames = target.base.sonames.get(arch.name, frozenset())
    libraries, node, warnings = _native_libraries(inspected, base_sonames, arch)
    libraries += _tabled_libraries(wheels, base_sonames, arch)
    requires = {inspection.name: inspection.requires for inspection in inspected}
    links = link_edges(inspected, base_sonames, arch.loader)
    weight = gpu_weight(arch.name, wheels, requires, links, _unshipped_gpu_libraries(libraries))
    gpu = weight_warnings([weight]) if weight else []
    base_packages = target.base.packages.get(arch.name, frozenset())
    programs, program_warnings = program_needs(inspected, base_packages, arch, without_programs)
    kept = [need for need in programs if not need.left_out]
    _refuse_unshipped_programs(kept, arch)
    required = {lib.package for lib in libraries if not lib.optional} - base_packages
    required |= {run.package for run in kept if run.package and not run.optional}
    optional = {lib.package for lib in libraries if lib.optional and lib.package}
    optional -= base_packages | required
    optional |= {run.package for run in kept if run.package and run.optional} - required
    installed = tuple(sorted(required | optional if with_optional else required))
    wiring, browser_warnings = _browsers(wheels, installed, arch, browser_lists or {})
    return ArchPlan(
        arch=arch.name,
        wheels=tuple(wheels),
        libraries=tuple(sorted(libraries, key=lambda lib: (lib.package, lib.soname))),
        apt_packages=installed,
        provided_by_base=resolution.provided_by_base,
        built_from_source=resolution.built_from_source,
        optional_packages=tuple(sorted(optional)),
        warnings=tuple(
            dict.fromkeys(
                [*resolution.warnings, *warnings, *gpu, *program_warnings, *browser_warnings]
            )
        ),
        programs=programs,
        apt_size=debian.added_size(installed, base_packages, arch),
        gpu_node=node,
        gpu_weight=weight,
        browsers=wiring,
    )


def _browsers(
    wheels: Sequence[PlannedWheel],
    installed: Sequence[str],
    arch: Arch,
    browser_lists: Mapping[str, bytes],
) -> tuple[BrowserWiring, list[str]]:
    """The arch's Chromium wiring (builder.plan.browsers), and the warning that Playwright's
    other engines are not in the image."""
    names = {canonicalize_name(wheel.name) for wheel in wheels}
    directories: dict[str, str] = {}
    for wheel in wheels:
        if canonicalize_name(wheel.name) == browsers.PLAYWRIGHT and wheel.sha256 in browser_lists:
            listing = browser_lists[wheel.sha256]
            directories = browsers.playwright_directories(listing, arch.name, wheel.filename)
    warnings = [browsers.OTHER_ENGINES_WARNING] if browsers.PLAYWRIGHT in names else []
    return browsers.wiring(arch.name, names, installed, directories), warnings


def _planned_wheels(
    resolution: Resolution,
    chosen: Mapping[str, tuple[RemoteFile, str]],
    inspections: Mapping[str, WheelInspection],
) -> list[PlannedWheel]:
    """Each locked distribution's chosen wheel, with what its inspection found."""
    wheels = []
    for package in resolution.packages:
        file, tag = chosen[package.name]
        inspection = inspections[file.sha256]
        wheels.append(
            PlannedWheel(
                name=package.name,
                version=package.version,
                filename=file.filename,
                sha256=file.sha256,
                tag=tag,
                url=_shown_url(file, package),
                top_level=inspection.top_level,
                size=inspection.size,
                installed_size=inspection.installed_size,
                newest=inspection.newest,
                index=package.index,
                source=package.source,
            )
        )
    return wheels


def _shown_url(file: RemoteFile, package: LockedPackage) -> str:
    """What the records say a wheel was fetched from: its URL (no credentials), where a direct
    requirement came from, or that it was built here from an index's source release."""
    if package.source is not None and package.source.kind is not SourceKind.FIND_LINKS:
        return package.source.url()
    if not file.url.startswith("file:") or package.source is not None:
        return redact(file.url)
    return "built from source"


def _refuse_too_new_symbols(inspected: Sequence[WheelInspection], arch: Arch) -> None:
    """A symbol version newer than trixie's libraries define fails at load: refuse it now."""
    problems = symbol_problems(inspected, debian.symbol_maxima())
    if problems:
        first = problems[0]
        raise UserError(
            f"{first.path} needs {first.version} from {first.library}, newer than Debian 13"
            f" provides ({first.maximum}) on {arch.name}"
        )


def _native_libraries(
    inspected: Sequence[WheelInspection], base_sonames: frozenset[str], arch: Arch
) -> tuple[list[NativeLibrary], tuple[NodeLibrary, ...], list[str]]:
    """Linked and run-time loaded libraries → Debian packages; the GPU node's libraries apart;
    warnings for optional and loaded names Debian lacks. Raises on a required library Debian
    does not ship."""
    libraries, node, warnings = [], [], []
    for need in external_needs(inspected, base_sonames, arch.loader):
        if driver := driver_library(need.soname):
            node.append(_node_library(need.soname, need.needed_by, How.LINKED, driver))
            if not need.optional:
                warnings.append(
                    f"warning: {need.needed_by[0]} links {need.soname}, the NVIDIA driver's:"
                    " what loads it works only on a GPU node (on a CPU node, verification"
                    " fails there)"
                )
            continue
        if need.gpu:  # never a refusal: the GPU warning names what no package provides
            package = debian.package_for(need.soname, arch) or ""
            libraries.append(
                NativeLibrary(need.soname, package, need.needed_by, How.LINKED, True, need.gpu)
            )
            continue
        found = debian.package_for(need.soname, arch) if need.optional else None
        if need.optional and found is None:
            warnings.append(
                f"warning: {need.soname} (wanted only by the plugin {need.needed_by[0]}):"
                f" no Debian 13 package provides it for {arch.name}"
            )
            continue
        apt = found or _package(need.soname, need.needed_by[0], arch)
        libraries.append(
            NativeLibrary(need.soname, apt, need.needed_by, How.LINKED, optional=need.optional)
        )
    loads = load_needs(inspected, base_sonames, arch)
    warnings += loads.warnings
    libraries += [
        NativeLibrary(
            need.soname,
            need.package,
            need.needed_by,
            How.LOADED,
            need.optional,
            need.reason,
        )
        for need in loads.needs
    ]
    node += [_node_library(n.soname, n.needed_by, How.LOADED, n.driver) for n in loads.node]
    return libraries, _merged(node), warnings


def _unshipped_gpu_libraries(libraries: Sequence[NativeLibrary]) -> tuple[str, ...]:
    """The sonames only GPU plugins link that no Debian 13 package provides (a linked library
    carries a reason only when GPU plugins alone need it): what a GPU image must bring."""
    return tuple(
        sorted(
            {lib.soname for lib in libraries if lib.how is How.LINKED and lib.reason}
            - {lib.soname for lib in libraries if lib.package}
        )
    )


def _node_library(
    soname: str, needed_by: tuple[str, ...], how: How, driver: DriverLibrary
) -> NodeLibrary:
    """The plan's record of one driver library, with the capability that mounts it."""
    return NodeLibrary(soname, needed_by, how, driver.capability, driver.reason)


def _merged(node: Sequence[NodeLibrary]) -> tuple[NodeLibrary, ...]:
    """One record a soname: linked wins over loaded, the files that need it together."""
    by_soname: dict[str, NodeLibrary] = {}
    for library in sorted(node, key=lambda lib: (lib.soname, lib.how is not How.LINKED)):
        if (kept := by_soname.get(library.soname)) is None:
            by_soname[library.soname] = library
        else:
            needed_by = tuple(sorted({*kept.needed_by, *library.needed_by}))
            by_soname[library.soname] = replace(kept, needed_by=needed_by)
    return tuple(by_soname.values())


def _tabled_libraries(
    wheels: Sequence[PlannedWheel], base_sonames: frozenset[str], arch: Arch
) -> list[NativeLibrary]:
    """What the curated run-time loading table (builder/data/ctypes.toml) says a distribution
    loads by names its code computes."""
    tabled = debian.dynamic_loads()
    libraries = []
    for wheel in wheels:
        entry = tabled.get(wheel.name)
        if entry is None:
            continue
        by = (f"{wheel.name}=={wheel.version} (loads at run time: {entry.reason})",)
        for soname in entry.sonames:
            if soname not in base_sonames:
                libraries.append(
                    NativeLibrary(soname, _package(soname, by[0], arch), by, How.LOADED)
                )
        libraries += [NativeLibrary("", package, by, How.LOADED) for package in entry.packages]
    return libraries


def _refuse_unshipped_programs(kept: Sequence[ProgramNeed], arch: Arch) -> None:
    """A required program Debian 13 does not ship: what runs it would fail in the image (it
    imports, and fails when called)."""
    if unshipped := [run for run in kept if run.package is None]:
        program = unshipped[0]
        raise UserError(
            f"{', '.join(program.distributions)} runs {program.program}, which no Debian 13"
            f" package ships for {arch.name}: what runs it would fail in the image (to build"
            f" without it: --without-program {program.program})"
        )


def _package(soname: str, needed_by: str, arch: Arch) -> str:
    package = debian.package_for(soname, arch)
    if package is None:
        raise UserError(
            f"{soname}: no Debian 13 package provides this library for {arch.name}"
            f" (needed by {needed_by})"
        )
    return package


def import_modules(direct: Sequence[str], plans: Sequence[ArchPlan]) -> tuple[str, ...]:
    """Top-level modules of the directly requested distributions, the ones verify imports."""
    modules: dict[str, None] = {}
    for plan in plans:
        for wheel in plan.wheels:
            if wheel.name in direct:
                modules.update(dict.fromkeys(wheel.top_level))
    return tuple(modules)


def requested_distributions(direct: Sequence[str], plans: Sequence[ArchPlan]) -> tuple[str, ...]:
    """The directly requested distributions the extras install on some arch: the ones whose
    every module verification imports (one the base provides is the platform's to prove)."""
    installed = {wheel.name for plan in plans for wheel in plan.wheels}
    return tuple(name for name in dict.fromkeys(direct) if name in installed)


def runtime_checks(plans: Sequence[ArchPlan]) -> tuple[str, ...]:
    """Snippets from the run-time loading table for every installed distribution it lists,
    and from the programs table for every distribution whose program the image carries."""
    loads = debian.dynamic_loads()
    names = {wheel.name for plan in plans for wheel in plan.wheels}
    checks = [loads[name].check for name in sorted(names) if name in loads]
    entries = debian.program_table().entries
    installed = {
        pin.partition("==")[0]
        for plan in plans
        for need in plan.installed_programs()
        if not need.left_out
        for pin in need.distributions
    }
    checks += [entries[name].check for name in sorted(installed) if name in entries]
    return tuple(check for check in checks if check)
