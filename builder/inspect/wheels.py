"""One wheel's facts as planning reads them (`WheelInspection`, tags, top-level names, ELF
files), and the decisions made on a wheel's member list: where a member installs, which names are
importable, its newest date. Pure: `wheel_reader` opens the zip and feeds these.
"""

from __future__ import annotations

import calendar
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from builder.errors import UserError
from builder.inspect.elf import ElfFile, ElfRecord
from builder.inspect.loads import LoadRecord, LoadSite

RECORD_KIND = "inspect"
SCHEMA = 11  # bump whenever WheelInspection or the way it is derived changes
LIBRARY_SCHEMES = ("purelib", "platlib")  # .data schemes that pip --target puts at the root
MODULE_SUFFIXES = (".py", ".pyc", ".so")


class WheelRecord(TypedDict):
    """A `WheelInspection` as the inspection cache holds it (JSON), keyed by the wheel's sha256."""

    schema: int
    filename: str
    sha256: str
    name: str
    version: str
    tags: list[str]
    top_level: list[str]
    elf_files: list[ElfRecord]
    loads: list[LoadRecord]
    programs: list[LoadRecord]
    modules: int
    size: int
    installed_size: int
    newest: int
    requires: list[str]


@dataclass(frozen=True)
class WheelInspection:
    """What a wheel installs and what its ELF files need."""

    filename: str
    sha256: str
    name: str  # PEP 503 normalized
    version: str
    tags: tuple[str, ...]  # expanded from the compressed tag set, sorted
    top_level: tuple[str, ...]  # importable top-level names, public names first
    elf_files: tuple[ElfFile, ...]  # sorted by install path
    loads: tuple[LoadSite, ...] = ()  # run-time library loads in its Python code, by path
    programs: tuple[LoadSite, ...] = ()  # programs its Python code runs (inspect.programs)
    modules: int = 0  # Python modules the sandbox may run (not tests): what `programs` are of
    size: int = 0  # the wheel file, bytes
    installed_size: int = 0  # every member unpacked, bytes
    newest: int = 0  # the newest member date, UTC seconds (newest_date): SOURCE_DATE_EPOCH's
    # Names its METADATA requires (Requires-Dist), markers and extras aside: who may import whom,
    # as much as the metadata says (what --override may drop without orphaning a linked library)
    requires: tuple[str, ...] = ()

    @property
    def is_pure(self) -> bool:
        return not self.elf_files

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    def to_dict(self) -> WheelRecord:
        return {
            "schema": SCHEMA,
            "filename": self.filename,
            "sha256": self.sha256,
            "name": self.name,
            "version": self.version,
            "tags": list(self.tags),
            "top_level": list(self.top_level),
            "elf_files": [elf.to_dict() for elf in self.elf_files],
            "loads": [site.to_dict() for site in self.loads],
            "programs": [site.to_dict() for site in self.programs],
            "modules": self.modules,
            "size": self.size,
            "installed_size": self.installed_size,
            "newest": self.newest,
            "requires": list(self.requires),
        }

    @classmethod
    def from_dict(cls, data: WheelRecord) -> WheelInspection:
        return cls(
            filename=data["filename"],
            sha256=data["sha256"],
            name=data["name"],
            version=data["version"],
            tags=tuple(data["tags"]),
            top_level=tuple(data["top_level"]),
            elf_files=tuple(ElfFile.from_dict(elf) for elf in data["elf_files"]),
            loads=tuple(LoadSite.from_dict(site) for site in data["loads"]),
            programs=tuple(LoadSite.from_dict(site) for site in data["programs"]),
            modules=int(data["modules"]),
            size=data["size"],
            installed_size=data["installed_size"],
            newest=int(data["newest"]),  # a damaged record fails here and is read again
            requires=tuple(data["requires"]),
        )


def newest_date(infos: Iterable[zipfile.ZipInfo]) -> int:
    """The newest member date of a zip, in seconds; read as UTC (a zip's dates name no zone),
    so the same wheel gives the same date on every machine. 0 for an empty zip."""
    return max((calendar.timegm((*info.date_time, 0, 0, 0)) for info in infos), default=0)


def install_path(member: str) -> str | None:
    """Where a wheel member lands under `pip install --target`, or None if not in the tree.

    `<dist>-<ver>.data/purelib|platlib/` go to the root; the other .data schemes (scripts,
    headers, data) go elsewhere and are never loaded as libraries from the tree.
    """
    first, _, rest = member.partition("/")
    if not first.endswith(".data"):
        return member
    scheme, _, inner = rest.partition("/")
    return inner if scheme in LIBRARY_SCHEMES and inner else None


def _excluded_dir(name: str) -> bool:
    return name == "__pycache__" or name.endswith((".dist-info", ".data", ".libs", ".egg-info"))


def public_first(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(names), key=lambda name: (name.startswith("_"), name)))


def derive_top_level(tree_paths: Iterable[str]) -> tuple[str, ...]:
    """Top-level packages (dirs holding Python or extension files) and modules of a tree."""
    names = set()
    for path in tree_paths:
        first, sep, rest = path.partition("/")
        if sep:
            if first.isidentifier() and not _excluded_dir(first) and rest.endswith(MODULE_SUFFIXES):
                names.add(first)
        elif first.endswith(MODULE_SUFFIXES):
            # foo.py, foo.cpython-313-x86_64-linux-gnu.so, foo.abi3.so: module names hold no dot
            module = first.partition(".")[0]
            if module.isidentifier():
                names.add(module)
    return public_first(names)


def parse_filename(filename: str) -> tuple[str, str, tuple[str, ...]]:
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise UserError(f"{filename}: not a valid wheel filename ({exc})") from None
    return name, str(version), tuple(sorted(str(tag) for tag in tags))
