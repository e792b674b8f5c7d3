"""What a resolution is: the files an index serves, and the pins chosen from them, per arch.

Plain values, apart from the resolver and the index client that make them, so planning (pure)
can hold a resolution without importing anything that reaches the network.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

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


AUTH_FAILED = frozenset({401, 403})  # an HTTP answer refusing the credentials (or their lack)


def authentication_failed(url: str, status: str) -> str:
    """What a 401 or 403 from an index, a wheelhouse or a download means, naming the host and
    never the credentials: it is no missing distribution, and must not read as one."""
    host = urllib.parse.urlsplit(redact(url)).netloc or redact(url)
    return (
        f"authentication failed at {host} ({status}): the user:password@ of its URL is wrong,"
        " or missing"
    )


class SourceKind(StrEnum):
    """Where a distribution came from when not from an index (report.json says the value)."""

    FIND_LINKS = "find-links"  # a wheelhouse: a directory or a page of links (--find-links)
    PATH = "path"  # a local wheel, sdist or project directory the requirements name
    URL = "url"  # a direct URL to a wheel or sdist (`name @ https://…`)
    VCS = "vcs"  # a git repository at a commit (`name @ git+https://…@ref`)


@dataclass(frozen=True)
class Source:
    """A non-index origin as the records name it: never with credentials, always pinned (the
    sha256 of the file fetched or read, or the commit a VCS ref resolved to)."""

    kind: SourceKind
    location: str  # the directory, path, URL or repository URL, credentials removed
    sha256: str = ""  # of the file as fetched (path, URL): its `--hash`
    commit: str = ""  # VCS: the 40-hex commit the ref resolved to
    ref: str = ""  # VCS: the ref as written ("": the default branch)
    subdirectory: str = ""  # VCS/URL: the project's directory inside it

    def describe(self) -> str:
        """One short line for the plan's table: the commit whole, a file's sha256 begun."""
        if self.kind is SourceKind.VCS:
            return self.url()
        if self.kind is SourceKind.FIND_LINKS:
            return f"find-links {self.location}"
        return f"{self.location} (sha256:{self.sha256[:12]}…)" if self.sha256 else self.location

    def pin(self) -> str:
        """What the lock says of it: what pins it, and nothing of the machine (a local path is
        not named, so a checkout elsewhere gives the same lock and the same extras hash)."""
        if self.kind is SourceKind.PATH:
            return f"a local file (sha256:{self.sha256})" if self.sha256 else "a local project"
        if self.kind is SourceKind.URL:
            return f"{self.location} (sha256:{self.sha256})"
        return self.describe()

    def url(self) -> str:
        """The origin as one URL: the file's, or the repository's at the commit (pip's form)."""
        if self.kind is SourceKind.VCS:
            where = f"#subdirectory={self.subdirectory}" if self.subdirectory else ""
            return f"{self.location}@{self.commit}{where}"
        if self.kind is SourceKind.PATH:
            return Path(self.location).as_uri()
        return self.location


@dataclass(frozen=True)
class LockedPackage:
    name: str  # PEP 503 normalized
    version: str
    wheels: tuple[RemoteFile, ...]  # the wheels the resolver found usable for this arch
    index: str = ""  # the index it came from, credentials removed ("": not known)
    source: Source | None = None  # where it came from when not from an index


@dataclass(frozen=True)
class Resolution:
    arch: Arch
    packages: tuple[LockedPackage, ...]  # to install: the base's distributions left out
    provided_by_base: tuple[str, ...]  # "name==version" the base image already has
    built_from_source: tuple[str, ...]  # "name==version" built into pure wheels on the host
    pylock: str  # uv's PEP 751 lock for this arch, extras and base alike
    warnings: tuple[str, ...] = ()  # stale picks, pins with newer releases


def same_pins(one: Resolution, other: Resolution) -> bool:
    """Whether two resolutions install the same: the same wheels from the same places, the
    same base pins, the same lock (their notes may differ). A run that fetched for `one`
    before `other` was known may go on with what it fetched."""
    return (one.packages, one.provided_by_base, one.built_from_source, one.pylock) == (
        other.packages,
        other.provided_by_base,
        other.built_from_source,
        other.pylock,
    )
