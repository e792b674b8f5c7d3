"""No silent stale picks: say when a resolution is older than the index's newest release.

With wheels only, a resolver quietly falls back to an old release whenever newer ones ship
no usable wheel (pyvips: 2.1.0, one wheel from 2020, against 3.x sdist-only releases). Each
locked distribution is compared with the newest release the requirements allow: when that
release has no wheel for the target, it is reported (with both upload dates and why it was
excluded), and a pure-Python source release is offered for building on the host instead.
When the newest release does have a usable wheel, another distribution's requirement holds
the version back: uv's `# via` annotations name the candidates, and a note says so.

Prereleases count as pip counts them (PEP 440, `admitted`): only when the requirement names one
(`>=2.0b1`) or no final release satisfies it. uv also takes one when every final release is
ruled out by a conflict (dbt-core 2.0.0a4 against a base whose python-dateutil its finals
refuse); `unwanted_prereleases` finds such picks, for the resolution to refuse them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from builder.resolve.index import index_files
from builder.resolve.resolution import RemoteFile
from builder.resolve.target import Arch, BaseFacts, Target
from builder.retry import Retries

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


@dataclass(frozen=True)
class HeldBack:
    """A locked version older than the newest allowed release, although that one has a usable
    wheel: something in the set requires the older one."""

    name: str
    chosen: str
    newest: str

    def dependents(self, via: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
        """The distributions whose requirement may hold it back, when uv told."""
        return tuple(name for name in via.get(self.name, ()) if name != self.name)

    def message(self, via: Mapping[str, Sequence[str]]) -> str | None:
        """A note naming the distributions whose requirement holds it back, when uv told."""
        dependents = self.dependents(via)
        if not dependents:
            return None  # only the user's own requirement or a constraint: nothing to add
        who = (
            f"{dependents[0]}'s requirement"
            if len(dependents) == 1
            else f"the requirement of one of {', '.join(dependents)}"
        )
        return (
            f"note: {self.name}=={self.chosen} chosen, not the newest {self.newest} (which has"
            f" a usable wheel): held back by {who}"
        )


def held_back_notes(held: Sequence[HeldBack], via: Mapping[str, Sequence[str]]) -> list[str]:
    """One note for each family pinned together: held-back distributions joined through the
    requirements that hold them back (torch pins cuda-toolkit and NCCL; cuda-toolkit pins the
    other CUDA wheels) are said in one line, naming who holds the family back from outside it."""
    told = [pick for pick in held if pick.dependents(via)]
    family = {name: name for pick in told for name in (pick.name, *pick.dependents(via))}

    def root(name: str) -> str:
        while family[name] != name:
            name = family[name]
        return name

    for pick in told:
        for dependent in pick.dependents(via):
            family[root(pick.name)] = root(dependent)
    families: dict[str, list[HeldBack]] = {}
    for pick in told:
        families.setdefault(root(pick.name), []).append(pick)
    notes = []
    for members in families.values():
        names = {pick.name for pick in members}
        holders = sorted({d for pick in members for d in pick.dependents(via)} - names)
        if len(members) == 1 or not holders:  # alone, or holding each other back
            notes += [note for pick in members if (note := pick.message(via))]
            continue
        chosen = ", ".join(f"{p.name}=={p.chosen} (newest {p.newest})" for p in members)
        notes.append(
            f"note: {len(members)} distributions chosen older than their newest release with a"
            f" usable wheel, held back together by {' and '.join(holders)}'s requirements:"
            f" {chosen}"
        )
    return notes


def requested_held_notes(
    held: Sequence[HeldBack], via: Mapping[str, Sequence[str]], requested: Iterable[str]
) -> list[str]:
    """A note for each requested distribution held back although no other distribution
    requires it: the newest release's own requirements cannot be met here (dbt-core 1.12.6
    asks for a dbt-core-experimental-parser that has only source releases), which pip,
    building sources, would not meet the same way."""
    wanted = set(requested)
    return [
        f"note: {pick.name}=={pick.chosen} chosen, not the newest {pick.newest} (which has a"
        f" usable wheel): what {pick.newest} requires cannot be met with wheels for the target"
        f" and the base's pins (resolve {pick.name}=={pick.newest} to see why)"
        for pick in held
        if pick.name in wanted and not pick.dependents(via)
    ]


VIA_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\S+\s+# via (.+)$")


def parse_via(output: str) -> dict[str, tuple[str, ...]]:
    """Name → the distributions that require it, from `uv pip compile --annotation-style line`
    output (`numpy==2.3.5  # via scikit-learn, scipy, -r requirements.in`); files (`-r`, `-c`,
    `--override`) are left out."""
    via: dict[str, tuple[str, ...]] = {}
    for line in output.splitlines():
        if match := VIA_LINE.match(line.strip()):
            sources = [part.strip() for part in match.group(2).split(",")]
            via[canonicalize_name(match.group(1))] = tuple(
                canonicalize_name(part.partition("[")[0])
                for part in sources
                if part and not part.startswith("-")
            )
    return via


PIN_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)")


def parse_pins(output: str) -> dict[str, str]:
    """Name -> version, from `uv pip compile`'s requirements.txt output."""
    return {
        canonicalize_name(match.group(1)): match.group(2)
        for line in output.splitlines()
        if (match := PIN_LINE.match(line.strip()))
    }


def releases(name: str, files: Sequence[RemoteFile]) -> dict[Version, Release]:
    """`name`'s files grouped by version, read as pip and uv read them: yanked files and files
    whose name parses as another project's are left out (the index lists
    `selenium-2.0-dev-9429.tar.gz` under selenium, but that names `selenium-2-0-dev` 9429)."""
    project = canonicalize_name(name)
    found: dict[Version, Release] = {}
    for file in files:
        if file.yanked:
            continue
        try:
            if file.filename.endswith(".whl"):
                parsed, version = parse_wheel_filename(file.filename)[:2]
            else:
                parsed, version = parse_sdist_filename(file.filename)
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        if parsed != project:
            continue
        release = found.setdefault(version, Release(version))
        if file.filename.endswith(".whl"):
            release.wheels.append(file)
        else:
            release.sdist = file
    return found


def _stale(
    name: str,
    chosen: str,
    files: Sequence[RemoteFile],
    specifier: SpecifierSet,
    target: Target[BaseFacts],
    arch: Arch,
) -> StalePick | HeldBack | None:
    by_version = releases(name, files)
    current = Version(chosen)
    allowed = [v for v in admitted(specifier, by_version) if v > current]
    if not allowed:
        return None
    newest = by_version[max(allowed)]
    if _has_usable_wheel(newest, target, arch):
        return HeldBack(name, chosen, str(newest.version))
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


def admitted(specifier: SpecifierSet, versions: Iterable[Version]) -> list[Version]:
    """The versions pip would choose among for `specifier`: its final releases, and its
    prereleases only when it names one or no final release satisfies it (packaging's
    `filter`, which pip and uv apply; `contains` admits a prerelease to an empty set)."""
    return list(specifier.filter(versions))


def unwanted_prereleases(
    locked: Mapping[str, str],
    specifiers: Mapping[str, SpecifierSet],
    listings: Mapping[str, Sequence[RemoteFile]],
    target: Target[BaseFacts],
    arch: Arch,
) -> list[str]:
    """The locked prereleases pip would not pick: a final release with a wheel the target
    accepts satisfies the requirement, which names no prerelease. `listings`: those names'
    files (`index_listings`)."""
    unwanted = []
    for name, chosen in sorted(locked.items()):
        if not Version(chosen).is_prerelease:
            continue
        usable = [
            release.version
            for release in releases(name, listings.get(name, ())).values()
            if _has_usable_wheel(release, target, arch)
        ]
        specifier = specifiers.get(name, SpecifierSet())
        if Version(chosen) not in admitted(specifier, [*usable, Version(chosen)]):
            unwanted.append(name)
    return unwanted


def _has_usable_wheel(release: Release, target: Target[BaseFacts], arch: Arch) -> bool:
    tags = [frozenset(parse_wheel_filename(w.filename)[3]) for w in release.wheels]
    return any(target.tag_rank(arch, t) is not None for t in tags)


def index_listings(
    names: Iterable[str],
    indexes: Sequence[str],
    retries: Retries | None = None,
    where: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[RemoteFile]]:
    """Name -> the files the indexes list for it, fetched in parallel, each name once;
    `where`: the indexes to read for a name (the one it came from), when not all of them."""
    unique = sorted(set(names))
    only = where or {}
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        listed = pool.map(lambda name: index_files(only.get(name, indexes), name, retries), unique)
        return dict(zip(unique, listed, strict=True))


def stale_picks(
    locked: Mapping[str, str],
    specifiers: Mapping[str, SpecifierSet],
    listings: Mapping[str, Sequence[RemoteFile]],
    target: Target[BaseFacts],
    arch: Arch,
) -> tuple[list[StalePick], list[HeldBack]]:
    """Locked versions older than the newest allowed release: those whose newer release has
    no usable wheel, and those something else in the set holds back. `listings`: each locked
    name's files on the index (`index_listings`)."""
    found = [
        _stale(name, version, listings[name], specifiers.get(name, SpecifierSet()), target, arch)
        for name, version in sorted(locked.items())
    ]
    return (
        [pick for pick in found if isinstance(pick, StalePick)],
        [pick for pick in found if isinstance(pick, HeldBack)],
    )


def pinned_notes(
    locked: Mapping[str, str],
    pins: Mapping[str, SpecifierSet],
    listings: Mapping[str, Sequence[RemoteFile]],
) -> list[str]:
    """A note for each `==` pin the index has newer releases of: the user's choice stays."""
    notes = []
    for name, specifier in sorted(pins.items()):
        if name not in locked or not any(s.operator in {"==", "==="} for s in specifier):
            continue
        newer = [v for v in releases(name, listings[name]) if v > Version(locked[name])]
        stable = [v for v in newer if not v.is_prerelease]
        if stable:
            notes.append(f"note: {name}=={locked[name]} is pinned; newest release: {max(stable)}")
    return notes
