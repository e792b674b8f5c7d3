"""What one ELF file asks of the dynamic loader: sonames, search paths, symbol versions.

Pure reading with pyelftools (no ldd, nothing executed), so wheels for any architecture can be
inspected on any host. Facts are kept raw ($ORIGIN unexpanded); `builder.plan.natives`
interprets them. pyelftools (which imports pdb) is imported only when a file is read: a run whose
wheels are all inspected already (cached) reads none.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import IO, TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from elftools.elf.dynamic import DynamicSection, DynamicSegment
    from elftools.elf.elffile import ELFFile

ELF_MAGIC = b"\x7fELF"
MACHINES = MappingProxyType({"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64"})


class ElfRecord(TypedDict):
    """An `ElfFile` as the wheel inspection cache holds it (JSON)."""

    path: str
    machine: str
    soname: str | None
    needed: list[str]
    rpaths: list[str]
    version_needs: list[list[str]]  # [library file, version name]


class UnreadableElf(ValueError):
    """A malformed ELF file (pyelftools' ELFError, as ours: callers need not import it)."""


@dataclass(frozen=True)
class ElfFile:
    """One ELF file at its place in the install tree."""

    path: str  # POSIX path inside the install tree
    machine: str  # x86_64, aarch64, or pyelftools' e_machine name for anything else
    soname: str | None
    needed: tuple[str, ...]  # DT_NEEDED, in order
    rpaths: tuple[str, ...]  # DT_RPATH then DT_RUNPATH entries, raw
    version_needs: tuple[tuple[str, str], ...]  # (library file, version name), sorted, unique

    def to_dict(self) -> ElfRecord:
        return {
            "path": self.path,
            "machine": self.machine,
            "soname": self.soname,
            "needed": list(self.needed),
            "rpaths": list(self.rpaths),
            "version_needs": [list(pair) for pair in self.version_needs],
        }

    @classmethod
    def from_dict(cls, data: ElfRecord) -> ElfFile:
        return cls(
            path=data["path"],
            machine=data["machine"],
            soname=data["soname"],
            needed=tuple(data["needed"]),
            rpaths=tuple(data["rpaths"]),
            version_needs=tuple((library, version) for library, version in data["version_needs"]),
        )


def is_elf(head: bytes) -> bool:
    """True when the first bytes of a file are the ELF magic."""
    return head[:4] == ELF_MAGIC


def _dynamic(elf: ELFFile) -> DynamicSection | DynamicSegment | None:
    from elftools.elf.dynamic import DynamicSection, DynamicSegment

    # Stripped-of-sections files (sstrip) still have the PT_DYNAMIC segment the loader uses.
    for section in elf.iter_sections("SHT_DYNAMIC"):
        if isinstance(section, DynamicSection):
            return section
    for segment in elf.iter_segments("PT_DYNAMIC"):
        if isinstance(segment, DynamicSegment):
            return segment
    return None


def read_elf(stream: IO[bytes], path: str) -> ElfFile:
    """Read the loader-relevant facts; raises UnreadableElf on a malformed file."""
    from elftools.common.exceptions import ELFError

    try:
        return _read(stream, path)
    except ELFError as error:
        raise UnreadableElf(str(error)) from error


def _read(stream: IO[bytes], path: str) -> ElfFile:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    elf = ELFFile(stream)
    soname: str | None = None
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    dynamic = _dynamic(elf)
    if dynamic is not None:
        # DynamicTag sets .needed/.soname/.rpath/.runpath with setattr for those tags only
        # (the string-table value, a str), so pyelftools' annotations cannot declare them.
        for tag in dynamic.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(tag.needed)  # type: ignore[attr-defined]
            elif kind == "DT_SONAME":
                soname = tag.soname  # type: ignore[attr-defined]
            elif kind == "DT_RPATH":
                rpath.extend(entry for entry in tag.rpath.split(":") if entry)  # type: ignore[attr-defined]
            elif kind == "DT_RUNPATH":
                runpath.extend(entry for entry in tag.runpath.split(":") if entry)  # type: ignore[attr-defined]
    versions: set[tuple[str, str]] = set()
    for section in elf.iter_sections("SHT_GNU_verneed"):
        if isinstance(section, GNUVerNeedSection):
            for verneed, auxiliaries in section.iter_versions():
                library = verneed.name  # always set from vn_file for a verneed section
                if library is not None:
                    versions.update((library, aux.name) for aux in auxiliaries)
    machine = elf["e_machine"]
    return ElfFile(
        path=path,
        machine=MACHINES.get(machine, str(machine)),
        soname=soname,
        needed=tuple(needed),
        rpaths=(*rpath, *runpath),
        version_needs=tuple(sorted(versions)),
    )
