"""What we build for: CPython 3.13 on Debian 13, per architecture, on top of a known base.

A base's facts say what the base image already provides (its /app/deps distributions, its
shared libraries, its python patch version); a base profile is those facts with the image they
belong to. The shipped facts describe the reference runtime base; `builder.base.probe` produces
a profile of the same shape from a real image.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache, cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Generic, NotRequired, TypedDict, TypeVar

from builder.data import shipped_text
from builder.errors import UserError
from builder.oci.name import ImageRef

if TYPE_CHECKING:
    from packaging.tags import Tag

GLIBC_MAJOR, GLIBC_MINOR = 2, 41
LEGACY_ALIASES = MappingProxyType({17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"})


@dataclass(frozen=True)
class Arch:
    """One Debian architecture and the names other tools give it."""

    name: str  # Debian / OCI name: amd64
    machine: str  # uname -m and wheel platform suffix: x86_64
    triplet: str  # multiarch directory: x86_64-linux-gnu
    loader: str  # the dynamic loader's soname, never a package to install
    # The oldest manylinux glibc minor a wheel may target here, as pip (packaging) rules: 2.5 on
    # x86_64, where manylinux1 began; 2.17 on aarch64, the first glibc released for it.
    oldest_manylinux_minor: int

    @property
    def uv_platform(self) -> str:
        # uv's newest manylinux target is 2_40; glibc 2.41 adds no wheel tag in use.
        return f"{self.machine}-manylinux_2_40"

    def platforms(self) -> list[str]:
        """Wheel platform tags the target accepts, most specific first."""
        tags = []
        for minor in range(GLIBC_MINOR, self.oldest_manylinux_minor - 1, -1):
            tags.append(f"manylinux_{GLIBC_MAJOR}_{minor}_{self.machine}")
            if minor in LEGACY_ALIASES:
                tags.append(f"{LEGACY_ALIASES[minor]}_{self.machine}")
        return tags


ARCHES: Mapping[str, Arch] = MappingProxyType(
    {
        "amd64": Arch("amd64", "x86_64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2", 5),
        "arm64": Arch("arm64", "aarch64", "aarch64-linux-gnu", "ld-linux-aarch64.so.1", 17),
    }
)


def arch_named(name: str) -> Arch:
    try:
        return ARCHES[name]
    except KeyError:
        raise UserError(f"unknown architecture {name!r}: choose from {', '.join(ARCHES)}") from None


REFERENCE_BASE = "sandbox-runtime:3.13-trixie"
"""The reference runtime base: the default `--base-image`, and the image the shipped facts were
probed from (scripts/gen_base_profile.py). Text: the CLI parses it like any value it is given."""


class FactsRecord(TypedDict):
    """`BaseFacts` as JSON: the shipped file (builder/data/base-profile.json). A record written
    before `packages` existed lacks it."""

    python_version: str
    glibc: str
    user: str
    pythonpath: str
    distributions: dict[str, str]
    sonames: dict[str, list[str]]
    packages: NotRequired[dict[str, list[str]]]


class ProfileRecord(FactsRecord):
    """A `BaseProfile` as JSON: report.json's `base`, and part of a resolution's cache key."""

    image: str
    digest: str | None


@dataclass(frozen=True)
class BaseFacts:
    """What a base runtime image provides, whatever it is called: the facts the plan is made
    against (markers, pins, sonames, packages).

    Apart from `BaseProfile` (the facts of one named image) so that the shipped facts can be read
    without a reference: they describe the reference base, and hold for whichever image the
    operator names when nothing better can be probed. A reference is parsed only where its text
    enters the run, never from this file.
    """

    python_version: str  # full patch version, e.g. 3.13.5
    glibc: str
    user: str
    pythonpath: str
    distributions: Mapping[str, str]  # normalized name -> version, from /app/deps
    sonames: Mapping[str, frozenset[str]]  # arch name -> sonames the image provides
    packages: Mapping[str, frozenset[str]] = field(default_factory=dict)  # arch -> dpkg names

    @classmethod
    def from_dict(cls, data: FactsRecord) -> BaseFacts:
        from packaging.utils import canonicalize_name  # imports packaging.tags: see _tag_priority

        return cls(
            python_version=data["python_version"],
            glibc=data["glibc"],
            user=data["user"],
            pythonpath=data["pythonpath"],
            distributions={canonicalize_name(k): v for k, v in data["distributions"].items()},
            sonames={a: frozenset(s) for a, s in data["sonames"].items()},
            packages={a: frozenset(p) for a, p in data.get("packages", {}).items()},
        )

    def facts_record(self) -> FactsRecord:
        return {
            "python_version": self.python_version,
            "glibc": self.glibc,
            "user": self.user,
            "pythonpath": self.pythonpath,
            "distributions": dict(sorted(self.distributions.items())),
            "sonames": {a: sorted(s) for a, s in sorted(self.sonames.items())},
            "packages": {a: sorted(p) for a, p in sorted(self.packages.items())},
        }

    def constraints(self) -> list[str]:
        """The base's distributions as pip constraint lines."""
        return [f"{name}=={version}" for name, version in sorted(self.distributions.items())]


@dataclass(frozen=True, kw_only=True)
class BaseProfile(BaseFacts):
    """One base image's facts with the image they belong to: shipped for a base, or probed."""

    reference: ImageRef  # parsed once where the base enters the run
    digest: str | None = None
    source: str = "shipped profile"

    @classmethod
    def of(
        cls, facts: BaseFacts, reference: ImageRef, digest: str | None, source: str
    ) -> BaseProfile:
        """`facts` as those of `reference`."""
        shared = {one.name: getattr(facts, one.name) for one in fields(BaseFacts)}
        return cls(**shared, reference=reference, digest=digest, source=source)

    @property
    def image(self) -> str:
        """The base as the operator (or the CLI's default) wrote it: what report.json shows.

        The reference itself is parsed where the base enters the run (the CLI, the config); the
        probes and every later step take `reference`."""
        return self.reference.as_written

    @property
    def pinned(self) -> ImageRef:
        """What the final stage starts FROM: the reference, pinned to the probed digest."""
        if self.digest and not self.reference.digest:
            return self.reference.with_digest(self.digest)
        return self.reference

    def to_dict(self) -> ProfileRecord:
        return {"image": self.image, "digest": self.digest, **self.facts_record()}


@cache
def shipped_facts() -> BaseFacts:
    """The reference base's facts, as shipped: what a plan assumes when no probe can be made,
    and what a probed base is compared with."""
    text = shipped_text("base-profile.json")
    return BaseFacts.from_dict(json.loads(text))


def shipped_profile(image: ImageRef) -> BaseProfile:
    """The shipped facts as those of `image` (the offline fallback); the source says whose they
    are when `image` is not the reference base."""
    source = "shipped profile"
    if image.as_written != REFERENCE_BASE:
        source = f"shipped profile of {REFERENCE_BASE}"
    return BaseProfile.of(shipped_facts(), image, digest=None, source=source)


Facts = TypeVar("Facts", bound=BaseFacts, covariant=True)


@dataclass(frozen=True)
class Target(Generic[Facts]):
    """The interpreter, libc and architectures a plan is made for.

    `Target[BaseFacts]` is enough to choose wheels and evaluate markers; a resolution, whose
    error names the base and whose cache key holds its digest, takes a `Target[BaseProfile]`."""

    base: Facts
    arches: tuple[Arch, ...]

    @property
    def python_version(self) -> str:
        return self.base.python_version

    @property
    def python_tuple(self) -> tuple[int, int]:
        major, minor = self.base.python_version.split(".")[:2]
        return int(major), int(minor)

    @cached_property
    def _tag_priority(self) -> dict[str, dict[Tag, int]]:
        # packaging.tags is imported here: the CLI's options name ARCHES, and `--help` must not
        # pay for the tag machinery.
        from packaging.tags import compatible_tags, cpython_tags

        major, minor = self.python_tuple
        interpreter = f"cp{major}{minor}"
        result = {}
        for arch in self.arches:
            platforms = [*arch.platforms(), "any"]
            ordered = [
                *cpython_tags((major, minor), abis=[interpreter], platforms=platforms),
                *compatible_tags((major, minor), interpreter=interpreter, platforms=platforms),
            ]
            result[arch.name] = {tag: rank for rank, tag in enumerate(dict.fromkeys(ordered))}
        return result

    def tag_rank(self, arch: Arch, tags: frozenset[Tag]) -> int | None:
        """Rank of the best tag the target accepts (lower is better), or None if none."""
        priority = self._tag_priority[arch.name]
        ranks = [priority[tag] for tag in tags if tag in priority]
        return min(ranks) if ranks else None

    def marker_environment(self, arch: Arch) -> dict[str, str]:
        """PEP 508 marker values of the target interpreter, not of this host."""
        major, minor = self.python_tuple
        return {
            "implementation_name": "cpython",
            "implementation_version": self.python_version,
            "os_name": "posix",
            "platform_machine": arch.machine,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": self.python_version,
            "python_version": f"{major}.{minor}",
            "sys_platform": "linux",
        }
