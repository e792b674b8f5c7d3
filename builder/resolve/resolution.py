"""What a resolution is: the files an index serves, and the pins chosen from them, per arch.

Plain values, apart from the resolver and the index client that make them, so planning (pure)
can hold a resolution without importing anything that reaches the network.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from builder.resolve.target import Arch


@dataclass(frozen=True)
class RemoteFile:
    filename: str
    url: str
    sha256: str
    size: int | None = None
    uploaded: str | None = None  # ISO date from the index (PEP 700), when it says
    yanked: bool = False
    # A wheel built on the host: the sdist the index served, whose sha256 `--hash` names.
    built_from: RemoteFile | None = None


def redact(url: str) -> str:
    """The URL without any user:password part, safe to print or write to a report."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


@dataclass(frozen=True)
class LockedPackage:
    name: str  # PEP 503 normalized
    version: str
    wheels: tuple[RemoteFile, ...]  # the wheels the resolver found usable for this arch
    index: str = ""  # the index it came from, credentials removed ("": not known)


@dataclass(frozen=True)
class Resolution:
    arch: Arch
    packages: tuple[LockedPackage, ...]  # to install: the base's distributions left out
    provided_by_base: tuple[str, ...]  # "name==version" the base image already has
    built_from_source: tuple[str, ...]  # "name==version" built into pure wheels on the host
    pylock: str  # uv's PEP 751 lock for this arch, extras and base alike
    warnings: tuple[str, ...] = ()  # stale picks, pins with newer releases
