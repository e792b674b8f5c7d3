"""The facts an SBOM lists, read from the texts an image holds.

`debian_packages` reads dpkg's status database (what `dpkg-query -W` lists: every paragraph
whose Status is "install ok installed"), with python-debian's deb822 reader; `distribution`
reads a `.dist-info/METADATA` with packaging's metadata reader, leniently (old METADATA
versions and unknown fields are everywhere in real wheels), and keeps the dependencies whose
markers hold on the target.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.metadata import RawMetadata, parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.errors import UserError

INSTALLED = "install ok installed"
LICENSE_CLASSIFIER = "License :: "


@dataclass(frozen=True)
class DebianPackage:
    """One installed Debian package, as dpkg records it."""

    name: str
    version: str
    architecture: str
    source: str  # the source package it was built from (its own name when dpkg says none)
    source_version: str


@dataclass(frozen=True)
class WheelOrigin:
    """Where a distribution's wheel came from: what the lock pinned and fetched."""

    filename: str
    url: str
    sha256: str
    index: str = ""  # the index it came from when not PyPI, credentials removed ("": PyPI)
    kind: str = ""  # when from no index: find-links, path, url or vcs (SourceKind's values)
    commit: str = ""  # vcs: the commit it was built from (`url` names the repository at it)


@dataclass(frozen=True)
class PythonDistribution:
    """One installed distribution: its identity, where it lives, where it came from."""

    name: str  # PEP 503 normalized
    version: str
    location: str  # the PYTHONPATH entry it is installed in: /app/deps or /app/deps-extra
    layer: str = ""  # diff ID of the layer holding it, when the tool wrote that layer
    wheel: WheelOrigin | None = None
    licenses: tuple[str, ...] = ()  # an SPDX expression, or License / classifier names
    requires: tuple[str, ...] = ()  # normalized names it depends on, on the target


def debian_packages(status: str) -> tuple[DebianPackage, ...]:
    """Every installed package of a dpkg status database, sorted by name and arch."""
    from debian.deb822 import Deb822  # only a run that reads an image's packages pays for it

    found = []
    for paragraph in Deb822.iter_paragraphs(status.splitlines(keepends=True)):
        if paragraph.get("Status", "").strip() != INSTALLED or "Package" not in paragraph:
            continue
        name, version = paragraph["Package"], paragraph.get("Version", "")
        source, _, rest = paragraph.get("Source", name).partition(" ")
        source_version = rest.strip().strip("()") or version
        found.append(
            DebianPackage(name, version, paragraph.get("Architecture", ""), source, source_version)
        )
    return tuple(sorted(found, key=lambda p: (p.name, p.architecture)))


def distribution(
    metadata: str,
    location: str,
    environment: Mapping[str, str],
    *,
    layer: str = "",
    wheel: WheelOrigin | None = None,
) -> PythonDistribution:
    """A distribution from its METADATA; `environment` evaluates the Requires-Dist markers."""
    raw, _ = parse_email(metadata)  # the raw fields: lenient, as real wheels need
    name, version = raw.get("name"), raw.get("version")
    if not name or not version:
        raise UserError(f"METADATA in {location}: no Name or Version")
    return PythonDistribution(
        canonicalize_name(name),
        version,
        location,
        layer,
        wheel,
        _licenses(raw),
        _requires(raw.get("requires_dist") or [], environment),
    )


def _licenses(raw: RawMetadata) -> tuple[str, ...]:
    """The SPDX expression when the METADATA has one (2.4), else License and classifiers."""
    if expression := (raw.get("license_expression") or "").strip():
        return (expression,)
    names = []
    text = (raw.get("license") or "").strip()
    if text and "\n" not in text and len(text) <= 100:  # a name, not a licence's full text
        names.append(text)
    for classifier in raw.get("classifiers") or ():
        if classifier.startswith(LICENSE_CLASSIFIER):
            names.append(classifier.rsplit(" :: ", 1)[-1])
    return tuple(dict.fromkeys(names))


def _requires(requirements: list[str], environment: Mapping[str, str]) -> tuple[str, ...]:
    names = []
    for text in requirements:
        try:
            required = Requirement(text)
        except InvalidRequirement:
            continue  # what pip would refuse to install cannot be in the image either
        marker = required.marker
        if marker is None or marker.evaluate({**environment, "extra": ""}):
            names.append(canonicalize_name(required.name))
    return tuple(sorted(set(names)))


def without_credentials(url: str) -> str:
    """`url` with any user:password@ removed: an index URL may carry a token, and what an
    attachment says travels to every registry and scanner that reads it."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
