"""Facts -> `BaseProfile`, one function for both readers; and how a profile is judged.

The engine probe observes one architecture inside a container; the registry reader observes
every architecture the image's index holds. Both hand the same facts per architecture (python,
glibc, distributions per PYTHONPATH directory, sonames, unpackaged sonames, dpkg packages) to
`profile_from_facts`; an architecture not observed gets the sonames its packages ship on trixie
(the shipped soname index) plus the unpackaged libraries, whose names do not depend on the arch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NotRequired, TypedDict

from builder.contract import DEPS, SANDBOX_UID
from builder.oci.name import ImageRef
from builder.plan.debian import packages_providing
from builder.resolve.target import ARCHES, GLIBC_MAJOR, GLIBC_MINOR, BaseFacts, BaseProfile

TARGET_PYTHON = "3.13"
TARGET_GLIBC = f"{GLIBC_MAJOR}.{GLIBC_MINOR}"
EXAMPLES = 5
DEBIAN_VERSION = re.compile(r"^(?:\d+:)?(\d+\.\d+(?:\.\d+)?)")


def installed_packages(status: str) -> dict[str, str]:
    """Package -> version for every `install ok installed` stanza of a dpkg status file."""
    packages = {}
    for stanza in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1)
            for line in stanza.splitlines()
            if ": " in line and not line.startswith(" ")
        )
        if fields.get("Status") == "install ok installed" and "Package" in fields:
            packages[fields["Package"].split(":")[0]] = fields.get("Version", "")
    return packages


class ArchFacts(TypedDict):
    """One arch's facts of a base, as both readers gather them (the engine's probe script, and
    builder.base.layers through the registry) and their caches keep them (JSON)."""

    glibc: str
    distributions: dict[str, dict[str, str]]  # PYTHONPATH directory -> name -> version
    sonames: list[str]
    unpackaged: list[str]  # sonames no dpkg package owns
    packages: list[str]  # dpkg names
    python: NotRequired[str]  # the full version; the registry reader adds it after the layers
    machine: NotRequired[str]  # uname -m: the engine's script
    # the registry reader's: the image config's, and the evidence for the python version
    user: NotRequired[str]
    pythonpath: NotRequired[str]
    python_packages: NotRequired[dict[str, str]]  # python3.X[-minimal] -> Debian version
    python3_link: NotRequired[str]  # where /usr/bin/python3 leads


def pythonpath_dirs(pythonpath: str) -> list[str]:
    return [d for d in pythonpath.split(":") if d]


def profile_from_facts(
    image: ImageRef,
    observed: Mapping[str, ArchFacts],
    *,
    pythonpath: str,
    user: str,
    digest: str | None,
    source: str,
) -> BaseProfile:
    """The profile of `image` from facts per observed arch (amd64's lead when present).

    `observed` is keyed by ARCHES names and holds at least one arch (the callers check).
    """
    main = observed.get("amd64") or next(iter(observed.values()))
    distributions: dict[str, str] = {}
    for directory in pythonpath_dirs(pythonpath):  # first on the path wins, as at import time
        for name, version in main["distributions"].get(directory, {}).items():
            distributions.setdefault(name, version)
    sonames = {}
    packages = {}
    for arch in ARCHES.values():
        facts = observed.get(arch.name)
        if facts:
            sonames[arch.name] = frozenset(facts["sonames"])
            packages[arch.name] = frozenset(facts["packages"])
        else:
            known = frozenset(main["packages"])
            sonames[arch.name] = packages_providing(known, arch) | frozenset(main["unpackaged"])
            packages[arch.name] = known
    return BaseProfile(
        reference=image,
        python_version=main["python"],
        glibc=main["glibc"],
        user=user,
        pythonpath=pythonpath,
        distributions=distributions,
        sonames=sonames,
        packages=packages,
        digest=digest,
        source=source,
    )


def profile_differences(shipped: BaseFacts, probed: BaseFacts) -> list[str]:
    """What the real base has that the shipped profile does not say: shown, never hidden."""
    lines = []
    for label, old, new in (
        ("python", shipped.python_version, probed.python_version),
        ("glibc", shipped.glibc, probed.glibc),
        ("user", shipped.user or "root", probed.user or "root"),
        ("PYTHONPATH", shipped.pythonpath or "unset", probed.pythonpath or "unset"),
    ):
        if old != new:
            lines.append(f"{label}: {new} (shipped profile says {old})")
    old_dists, new_dists = shipped.distributions, probed.distributions
    added = sorted(set(new_dists) - set(old_dists))
    removed = sorted(set(old_dists) - set(new_dists))
    changed = sorted(n for n in set(old_dists) & set(new_dists) if old_dists[n] != new_dists[n])
    if added:
        lines.append("distributions only in the base: " + _pins(added, new_dists))
    if removed:
        lines.append("distributions missing from the base: " + _pins(removed, old_dists))
    if changed:
        lines.append(
            "distributions at other versions: "
            + ", ".join(f"{n} {new_dists[n]} (shipped {old_dists[n]})" for n in changed)
        )
    for arch in sorted(set(shipped.sonames) | set(probed.sonames)):
        old_sonames = shipped.sonames.get(arch, frozenset())
        new_sonames = probed.sonames.get(arch, frozenset())
        if missing := old_sonames - new_sonames:
            lines.append(f"{arch}: {_count(missing)} of the shipped profile missing")
        if extra := new_sonames - old_sonames:
            lines.append(f"{arch}: {_count(extra)} not in the shipped profile")
    return lines


def _pins(names: list[str], versions: Mapping[str, str]) -> str:
    return ", ".join(f"{name}=={versions[name]}" for name in names)


def _count(sonames: frozenset[str]) -> str:
    examples = sorted(sonames)[:EXAMPLES]
    more = ", …" if len(sonames) > EXAMPLES else ""
    noun = "soname" if len(sonames) == 1 else "sonames"
    return f"{len(sonames)} {noun} ({', '.join(examples)}{more})"


def base_problems(profile: BaseProfile) -> list[str]:
    """Ways the base breaks the runtime contract the extension recipe relies on."""
    problems = []
    if profile.user.split(":", 1)[0] in {"", "0", "root"}:
        problems.append(f"{profile.image} runs as root (the runtime must run as uid {SANDBOX_UID})")
    if DEPS not in pythonpath_dirs(profile.pythonpath):
        problems.append(
            f"{profile.image}: {DEPS} is not on PYTHONPATH ({profile.pythonpath or 'unset'})"
        )
    if ".".join(profile.python_version.split(".")[:2]) != TARGET_PYTHON:
        problems.append(f"{profile.image}: python is {profile.python_version}, not {TARGET_PYTHON}")
    if profile.glibc != TARGET_GLIBC:
        problems.append(
            f"{profile.image}: glibc is {profile.glibc or 'absent'}, not {TARGET_GLIBC}"
        )
    return problems
