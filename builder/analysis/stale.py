"""No silent stale picks: say when a resolution is older than the index's newest release.

With wheels only, a resolver quietly falls back to an old release whenever newer ones ship
no usable wheel (pyvips: 2.1.0, one wheel from 2020, against 3.x sdist-only releases). Each
locked distribution is compared with the newest release the requirements allow: when that
release has no wheel for the target, it is reported (with both upload dates and why it was
excluded), and a pure-Python source release is offered for building on the host instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from builder.analysis.index import RemoteFile, index_files
from builder.analysis.target import Arch, Target

WORKERS = 8


@dataclass
class Release:
    version: Version
    wheels: list[RemoteFile] = field(default_factory=list)
    sdist: RemoteFile | None = None

    @property
    def uploaded(self) -> str:
        dates = [f.uploaded[:10] for f in (*self.wheels, self.sdist) if f and f.uploaded]
        return min(dates) if dates else "upload date unknown"


@dataclass(frozen=True)
class StalePick:
    """A locked version older than the newest allowed release, which has no usable wheel."""

    name: str
    chosen: str
    chosen_uploaded: str
    newest: str
    newest_uploaded: str
    reason: str  # why the newest release was excluded
    sdist: RemoteFile | None  # the newest release's source, when that is all it has

    def message(self) -> str:
        return (
            f"warning: {self.name}=={self.chosen} ({self.chosen_uploaded}) chosen, but the"
            f" newest release {self.newest} ({self.newest_uploaded}) {self.reason}"
        )


def releases(files: Sequence[RemoteFile]) -> dict[Version, Release]:
    """Files grouped by version; yanked files left out, as resolvers do."""
    found: dict[Version, Release] = {}
    for file in files:
        if file.yanked:
            continue
        try:
            if file.filename.endswith(".whl"):
                version = parse_wheel_filename(file.filename)[1]
                found.setdefault(version, Release(version)).wheels.append(file)
            else:
                version = parse_sdist_filename(file.filename)[1]
                found.setdefault(version, Release(version)).sdist = file
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
    return found


def _stale(
    name: str,
    chosen: str,
    files: Sequence[RemoteFile],
    specifier: SpecifierSet,
    target: Target,
    arch: Arch,
) -> StalePick | None:
    by_version = releases(files)
    current = Version(chosen)
    allowed = [
        v
        for v in by_version
        if v > current and (current.is_prerelease or not v.is_prerelease) and v in specifier
    ]
    if not allowed:
        return None
    newest = by_version[max(allowed)]
    tags = [frozenset(parse_wheel_filename(w.filename)[3]) for w in newest.wheels]
    if any(target.tag_rank(arch, t) is not None for t in tags):
        return None  # a usable wheel exists: something else in the set holds the version back
    if newest.wheels:
        reason = f"has no wheel for CPython {target.python_version} on manylinux {arch.machine}"
    else:
        reason = "has only a source distribution"
    chosen_release = by_version.get(current)
    return StalePick(
        name=name,
        chosen=chosen,
        chosen_uploaded=chosen_release.uploaded if chosen_release else "upload date unknown",
        newest=str(newest.version),
        newest_uploaded=newest.uploaded,
        reason=reason,
        sdist=None if newest.wheels else newest.sdist,
    )


def stale_picks(
    locked: Mapping[str, str],
    specifiers: Mapping[str, SpecifierSet],
    indexes: Sequence[str],
    target: Target,
    arch: Arch,
) -> list[StalePick]:
    """Every locked name → version that the index has a newer, wheel-less release of."""
    names = sorted(locked)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        listings = list(pool.map(lambda name: index_files(indexes, name), names))
    found = [
        _stale(name, locked[name], files, specifiers.get(name, SpecifierSet()), target, arch)
        for name, files in zip(names, listings, strict=True)
    ]
    return [pick for pick in found if pick is not None]


def pinned_notes(
    locked: Mapping[str, str], pins: Mapping[str, SpecifierSet], indexes: Sequence[str]
) -> list[str]:
    """A note for each `==` pin the index has newer releases of: the user's choice stays."""
    notes = []
    for name, specifier in sorted(pins.items()):
        if name not in locked or not any(s.operator in {"==", "==="} for s in specifier):
            continue
        newer = [v for v in releases(index_files(indexes, name)) if v > Version(locked[name])]
        stable = [v for v in newer if not v.is_prerelease]
        if stable:
            notes.append(f"note: {name}=={locked[name]} is pinned; newest release: {max(stable)}")
    return notes
