"""Where each locked distribution came from: the index the resolver took it from.

With more than one index (PyPI and PyTorch's CPU index, a company's mirror) the answer is not
the wheel's URL: files live on other hosts (PyPI's on files.pythonhosted.org), and uv's rule
(the first index, in its order, that has the project: `--extra-index-url` before
`--index-url`) decides, not the newest version across indexes as pip would. uv says which
index it used (`uv pip compile --emit-index-annotation`); that answer is what the plan,
report.json and the SBOM record, with any credentials removed. The check for newer releases
reads the same index, so it compares what uv could have chosen.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from builder.resolve.requirements import DEFAULT_INDEX, RequirementSet
from builder.resolve.resolution import (
    LockedPackage,
    Resolution,
    Source,
    SourceKind,
    redact,
)

if TYPE_CHECKING:
    from builder.resolve.direct.fetch import Fetched

PIN_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==\S+")
FROM_LINE = re.compile(r"^\s+# from (\S+)\s*$")


def parse_origins(output: str) -> dict[str, str]:
    """Name → the index uv resolved it from (credentials removed), from `uv pip compile
    --emit-index-annotation` output (`idna==3.10  # via requests` then `    # from URL`).

    A distribution from a local directory (a wheel built on the host, found through
    `--find-links`) came from no index: it is left out.
    """
    found: dict[str, str] = {}
    name = None
    for line in output.splitlines():
        if match := PIN_LINE.match(line):
            name = canonicalize_name(match.group(1))
        elif (match := FROM_LINE.match(line)) and name and match.group(1).startswith("http"):
            found[name] = redact(match.group(1)).rstrip("/")
    return found


def origins_of(
    names: Iterable[str], requirements: RequirementSet, annotations: Callable[[], str]
) -> dict[str, str]:
    """Name -> the index each distribution came from: the only index when there is one and uv
    picks no other (no uv run needed), else the one uv names in its `annotations`."""
    indexes = requirements.indexes()
    pages = [f for f in requirements.find_links if f.startswith(("http://", "https://"))]
    if len(indexes) == 1 and not requirements.torch_backend and not pages:
        return {name: redact(indexes[0]).rstrip("/") for name in names}
    return parse_origins(annotations())


def is_default(index: str) -> bool:
    """Whether `index` is PyPI's simple index, however it is spelled (a trailing slash)."""
    return redact(index).rstrip("/") == DEFAULT_INDEX


def as_given(origin: str, indexes: Sequence[str]) -> tuple[str, ...]:
    """The index `origin` names, as the requirements spell it (with its credentials, which a
    listing of a private index needs); every index when the origin is unknown; the origin
    itself when no requirement names it (uv chose it: `--torch-backend`)."""
    if not origin:
        return tuple(indexes)
    same = [index for index in indexes if redact(index).rstrip("/") == origin]
    return (same[0],) if same else (origin,)


def with_sources(
    resolution: Resolution, find_links: Sequence[str], fetched: Sequence[Fetched]
) -> Resolution:
    """`resolution` with each distribution's `Source` when it came from no index: a direct
    requirement's (what it was fetched from), or the wheelhouse its wheel lies in."""
    direct = {f.requirement.name: f.source for f in fetched}
    packages = tuple(
        _sourced(package, direct.get(package.name), find_links) for package in resolution.packages
    )
    return replace(resolution, packages=packages)


def _sourced(
    package: LockedPackage, source: Source | None, find_links: Sequence[str]
) -> LockedPackage:
    if source is None:
        source = next(
            (
                Source(SourceKind.FIND_LINKS, redact(location))
                for location in find_links
                for wheel in package.wheels
                if _within(wheel.url, location, package.index)
            ),
            None,
        )
    return replace(package, source=source, index="") if source else package


def _within(url: str, location: str, index: str) -> bool:
    """Whether a wheel came from a find-links location: it lies in that directory, or uv
    named that page of links as where it found it (`index`, credentials removed)."""
    if location.startswith(("http://", "https://")):
        return index == redact(location).rstrip("/")
    path = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    return url.startswith("file:") and path.parent == Path(location)
