"""Debian 13 knowledge shipped as data: soname and program indexes, ctypes and programs
tables, symbol-version maxima.

Each data file in builder/data has a script in scripts/ (or a documented source) that
regenerates it; this module only reads them, once per process.
"""

from __future__ import annotations

import bisect
import gzip
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion

from builder.data import shipped_bytes, shipped_text
from builder.resolve.target import Arch

# Another OS's library names: Windows and macOS suffixes, a backslash, macOS system paths.
_FOREIGN = re.compile(
    r"\.(dll|dylib|framework)$|\\|^/(System|Library)/|\.framework/|^(ucrtbase|vcruntime\d*|msvc[rp]\d*)$",
    re.I,
)
# A file name whose suffix is a word other than `so` (`interface.cpp`, `script.ld`) is no
# library, whatever the code does with it, unless Debian ships one so named (MagickWand-7.Q16).
_NOT_A_LIBRARY = re.compile(r"\.(?!so$)[A-Za-z]\w*$")
# Windows and macOS system libraries code names without a suffix in its other-OS branches.
_FOREIGN_NAMES = frozenset(
    [
        "msvcrt",
        "kernel32",
        "user32",
        "gdi32",
        "ole32",
        "oleaut32",
        "shell32",
        "advapi32",
        "ntdll",
        "ws2_32",
        "comctl32",
        "comdlg32",
        "winmm",
        "psapi",
        "dbghelp",
        "crypt32",
        "bcrypt",
        "secur32",
        "iphlpapi",
        "shlwapi",
        "userenv",
        "libsystem",
        "system",
        "objc",
        "appkit",
        "foundation",
        "corefoundation",
        "security",
        "carbon",
        "cocoa",
    ]
)
_VERSIONED = re.compile(r"(?P<stem>.+\.so)(?P<version>(\.\d+)*)")
_SYMBOL_VERSION = re.compile(r"(?P<prefix>[A-Z][A-Z0-9_]*?)_(?P<version>\d+(?:\.\d+)*)")


@dataclass(frozen=True)
class DynamicLoad:
    """What reading a distribution's code cannot tell: libraries it loads by computed names
    (with the reason they are invisible), and a check proving its loaded library works."""

    distribution: str  # PEP 503 normalized
    sonames: tuple[str, ...]
    packages: tuple[str, ...]  # Debian packages needed directly, not through a soname
    reason: str  # why static reading misses the sonames; "" when there are none
    check: str | None  # one line of Python proving the library works in the image


@cache
def soname_index(arch: Arch) -> Mapping[str, str]:
    """Soname -> the Debian packages shipping it on the default loader path, as the index lists
    them: comma-separated, preferred first.

    Kept unsplit: a run looks up a handful of the 15,000 sonames, and splitting every line
    up front cost more than the rest of reading the index (about 30 ms of 40 per arch). The
    lines are cut in one pass (a line is `soname<TAB>packages`): half the time of a split per
    line, on every run's path.
    """
    return _name_index(f"sonames-{arch.name}.tsv.gz")


@cache
def program_index(arch: Arch) -> Mapping[str, str]:
    """Program name (a file in /usr/bin, /bin, /usr/sbin or /sbin) -> the Debian packages
    shipping it, preferred first, comma-separated (scripts/gen_program_index.py)."""
    return _name_index(f"programs-{arch.name}.tsv.gz")


def _name_index(filename: str) -> Mapping[str, str]:
    """A shipped `name<TAB>packages` index, lines cut in one pass (see `soname_index`)."""
    fields = gzip.decompress(shipped_bytes(filename)).decode().replace("\n", "\t").split("\t")
    if fields[-1] == "":
        fields.pop()  # the last line's newline
    return MappingProxyType(dict(zip(fields[0::2], fields[1::2], strict=True)))


def package_for(soname: str, arch: Arch) -> str | None:
    """The package apt should install for ``soname``, or None if trixie has none."""
    listed = soname_index(arch).get(soname)
    return listed.partition(",")[0] if listed else None


def package_for_program(name: str, arch: Arch) -> str | None:
    """The package apt should install for the program `name`, or None if trixie has none: a
    file of the package by that name (the index), else the package whose alternatives link
    provides it (programs.toml's `alternatives`: `java` -> default-jre-headless)."""
    listed = program_index(arch).get(name)
    if listed:
        return listed.partition(",")[0]
    alternative = program_table().alternatives.get(name)
    return alternative.package if alternative is not None else None


@cache
def _package_table(arch: Arch) -> tuple[Mapping[str, int], tuple[tuple[int, tuple[int, ...]], ...]]:
    """packages-<arch>.tsv.gz (scripts/gen_package_sizes.py): name -> line number, and each
    line's installed kB and dependencies (line numbers)."""
    lines = gzip.decompress(shipped_bytes(f"packages-{arch.name}.tsv.gz")).decode().splitlines()
    numbers: dict[str, int] = {}
    rows = []
    for number, line in enumerate(lines):
        name, size, deps = line.split("\t")
        numbers[name] = number
        rows.append((int(size), tuple(int(d) for d in deps.split(",") if d)))
    return MappingProxyType(numbers), tuple(rows)


def known_package(name: str, arch: Arch) -> bool:
    """Whether `name` is a package the shipped table knows (every package the program and
    soname indexes name, and their dependencies)."""
    return name in _package_table(arch)[0]


def added_size(packages: Iterable[str], base_packages: Collection[str], arch: Arch) -> int | None:
    """Bytes the apt stage adds: `packages` and everything they depend on (as apt installs
    them without recommends), less the base's packages, by Debian 13's Installed-Size (kB).
    None when a package is not in the shipped table (it was not regenerated with the index
    that named it)."""
    numbers, rows = _package_table(arch)
    base = {numbers[name] for name in base_packages if name in numbers}
    stack = []
    for name in packages:
        if name not in numbers:
            return None
        stack.append(numbers[name])
    seen: set[int] = set()
    while stack:
        number = stack.pop()
        if number not in seen and number not in base:
            seen.add(number)
            stack += rows[number][1]
    return sum(rows[number][0] for number in seen) * 1024


def packages_providing(packages: Iterable[str], arch: Arch) -> frozenset[str]:
    """All sonames the given packages ship: a base's libraries from its package list.

    One pass over the index, testing each line's packages, rather than a reverse map of the
    whole index built for one lookup: most lines name one package, which needs no split.
    """
    wanted = frozenset(packages)
    return frozenset(
        soname
        for soname, listed in soname_index(arch).items()
        if (listed in wanted if "," not in listed else not wanted.isdisjoint(listed.split(",")))
    )


@cache
def dynamic_loads() -> Mapping[str, DynamicLoad]:
    """The curated ctypes/cffi table, keyed by normalized distribution name."""
    table = tomllib.loads(shipped_text("ctypes.toml"))
    loads: dict[str, DynamicLoad] = {}
    for name, entry in table.items():
        distribution = canonicalize_name(name)
        load = DynamicLoad(
            distribution=distribution,
            sonames=tuple(entry.get("sonames", ())),
            packages=tuple(entry.get("packages", ())),
            reason=entry.get("reason", ""),
            check=entry.get("check"),
        )
        if (load.sonames or load.packages) and not load.reason:
            raise ValueError(f"ctypes.toml [{name}]: libraries listed without a reason")
        loads[distribution] = load
    return MappingProxyType(loads)


@dataclass(frozen=True)
class ProgramEntry:
    """What reading a distribution's code cannot tell about the programs it runs."""

    distribution: str  # PEP 503 normalized
    required: tuple[str, ...] | None  # the programs installed by default; None: reading decides
    optional: bool  # every program it runs is optional
    reason: str
    check: str | None  # one line of Python proving its program works in the image
    versions: SpecifierSet = field(
        default_factory=SpecifierSet
    )  # the releases it is true of; empty: all

    def covers(self, version: str) -> bool:
        """Whether the entry is true of `version` (pre-releases included: a plan may pin one)."""
        try:
            return self.versions.contains(version, prereleases=True)
        except InvalidVersion:  # a legacy version string: only an entry for every release
            return not str(self.versions)


@dataclass(frozen=True)
class Alternative:
    """A program Debian installs only as an alternatives link (`/usr/bin/java` ->
    `/etc/alternatives/java` -> `/usr/lib/jvm/.../bin/java`): no package's file under that
    name, so the Contents-made index cannot name it."""

    package: str
    reason: str


@dataclass(frozen=True)
class ProgramTable:
    """builder/data/programs.toml: programs the base has, desktop-only ones, programs only
    alternatives provide, curated entries (per distribution, each for a range of releases)."""

    provided: frozenset[str]
    desktop: frozenset[str]
    entries: Mapping[str, ProgramEntry]  # the first entry of each: its check, for verify
    alternatives: Mapping[str, Alternative]
    ranges: Mapping[str, tuple[ProgramEntry, ...]]

    def entry(self, distribution: str, version: str) -> ProgramEntry | None:
        """The curated entry true of this release, if any: otherwise reading decides."""
        found = self.ranges.get(distribution, ())
        return next((entry for entry in found if entry.covers(version)), None)


def _program_entry(name: str, entry: Mapping[str, object]) -> ProgramEntry:
    """One curated entry; one that decides without a reason, or has a bad range, is refused."""
    required = entry.get("required")
    try:
        versions = SpecifierSet(str(entry.get("versions", "")))
    except InvalidSpecifier:
        raise ValueError(f"programs.toml [{name}]: bad versions {entry['versions']!r}") from None
    check = entry.get("check")
    found = ProgramEntry(
        distribution=canonicalize_name(name),
        required=tuple(map(str, required)) if isinstance(required, list) else None,
        optional=bool(entry.get("optional", False)),
        reason=str(entry.get("reason", "")),
        check=str(check) if check is not None else None,
        versions=versions,
    )
    if (found.required is not None or found.optional) and not found.reason:
        raise ValueError(f"programs.toml [{name}]: decides without a reason")
    return found


@cache
def program_table() -> ProgramTable:
    """The curated programs table (`[[name]]` for several entries, each with its `versions`)."""
    table = tomllib.loads(shipped_text("programs.toml"))
    provided = frozenset(table.pop("provided", ()))
    desktop = frozenset(table.pop("desktop", ()))
    alternatives = {
        name: Alternative(str(value["package"]), str(value["reason"]))
        for name, value in table.pop("alternatives", {}).items()
    }
    ranges: dict[str, tuple[ProgramEntry, ...]] = {}
    for name, value in table.items():
        listed = value if isinstance(value, list) else [value]
        ranges[canonicalize_name(name)] = tuple(_program_entry(name, one) for one in listed)
    return ProgramTable(
        provided,
        desktop,
        MappingProxyType({name: found[0] for name, found in ranges.items()}),
        MappingProxyType(alternatives),
        MappingProxyType(ranges),
    )


@cache
def _sorted_sonames(arch: Arch) -> tuple[str, ...]:
    """The index's sonames in order, so one library's versions are a contiguous run."""
    return tuple(sorted(soname_index(arch)))


@cache
def _versions_of(stem: str, arch: Arch) -> tuple[str, ...]:
    """`libpq.so` -> versioned sonames of that library, newest first (what ldconfig picks).

    Found by bisecting the sorted sonames for those starting `libpq.so.`, on demand: a run
    asks for a handful of libraries, where ranking every library in the index took 0.2 s.
    """
    names = _sorted_sonames(arch)
    prefix = f"{stem}."
    start = bisect.bisect_left(names, prefix)
    versions = []
    for soname in names[start:]:
        if not soname.startswith(prefix):
            break
        match = _VERSIONED.fullmatch(soname)
        if match and match["version"] and match["stem"] == stem:
            versions.append(soname)
    return tuple(sorted(versions, key=lambda n: _soname_rank(n[len(stem) + 1 :])))


def _soname_rank(version: str) -> tuple[int, int]:
    """Newest major first; of one major the soname (`.so.5`) before the file (`.so.5.17`)."""
    parts = version_tuple(version)
    return -parts[0], len(parts)


def sonames_for_load(name: str, arch: Arch) -> tuple[str, ...] | None:
    """The sonames a run-time load of `name` can open on Debian, best first; None for a name
    only another OS uses. `libX.so.N` is itself; `X`, `libX` and `libX.so` are what
    `ctypes.util.find_library("X")` (and cffi's dlopen of a bare name) would find."""
    if _FOREIGN.search(name):
        return None
    name = name.rsplit("/", 1)[-1]
    if not name or _FOREIGN.search(name) or name.lower() in _FOREIGN_NAMES:
        return None
    match = _VERSIONED.fullmatch(name)
    if match and match["version"]:
        return (name,)
    bare = name.removesuffix(".so")
    stems = [f"{bare}.so", f"lib{bare}.so"]
    if not bare.startswith("lib"):
        stems.reverse()
    found = next((found for stem in stems if (found := _versions_of(stem, arch))), ())
    if not found and _NOT_A_LIBRARY.search(name):
        return None  # `interface.cpp`, `script.ld`: not what MagickWand-7.Q16 is
    return found


def library_stems(name: str) -> frozenset[str]:
    """The unversioned file names (`libX.so`) a load of `name` may open: what matches a library
    the wheel set ships as `libX.so.N` (a load of `cudart` finds the CUDA wheel's libcudart)."""
    name = name.rsplit("/", 1)[-1]
    match = _VERSIONED.fullmatch(name)
    if match:
        return frozenset([match["stem"]])
    bare = name.removeprefix("lib")
    return frozenset([f"lib{bare}.so", f"{name}.so"])


def version_tuple(text: str) -> tuple[int, ...]:
    """``"3.4.33"`` -> ``(3, 4, 33)``, so versions compare numerically, not as strings."""
    return tuple(int(part) for part in text.split("."))


def split_symbol_version(name: str) -> tuple[str, tuple[int, ...]] | None:
    """``"GLIBCXX_3.4.33"`` -> ``("GLIBCXX", (3, 4, 33))``; None for unnumbered names
    such as GLIBC_PRIVATE or GLIBC_ABI_DT_RELR, which carry no comparable version."""
    match = _SYMBOL_VERSION.fullmatch(name)
    if match is None:
        return None
    return match["prefix"], version_tuple(match["version"])


@cache
def symbol_maxima() -> Mapping[str, tuple[int, ...]]:
    """Version-name prefix -> newest version trixie defines (GLIBC -> (2, 41), ...)."""
    table = tomllib.loads(shipped_text("symbol-maxima.toml"))
    return MappingProxyType(
        {prefix: version_tuple(entry["max"]) for prefix, entry in table.items()}
    )
