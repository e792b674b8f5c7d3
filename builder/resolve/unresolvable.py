"""What uv's failure to resolve a set means, said in one line that names the culprit.

uv explains a failure as a derivation, release by release: for boto3, whose botocore wants
python-dateutil<3 while the base pins 4.0.0, hundreds of lines. The error line names a missing
distribution, else a dependency that disagrees with a distribution the base pins (with the
pin), else an index uv could not read (unreachable, refusing its credentials: PyTorch's own
index from a network that cannot reach it), else uv's own cause, cut short, with any base pin
it mentions. An index or a page of links that refused the credentials (401, 403) is said first,
naming its host: uv then reports the distribution "not found", which it never looked for.
A conflict with a pin that an override would let through is said with that way
out (`base_way_out`): the resolver in builder.resolve.uv finds it by resolving with the override.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from builder.errors import UserError
from builder.resolve.requirements import RequirementSet
from builder.resolve.resolution import authentication_failed, redact
from builder.resolve.target import Arch, BaseFacts, BaseProfile, Target

NOT_FOUND = re.compile(r"Because (\S+) was not found in the package registry")
CAUSE = re.compile(r"cause: (.*?)(?:\n\s*\n|\Z)", re.S)
# uv's derivation of a dependency that disagrees with a pin: "botocore>=1.44.8 depends on
# python-dateutil>=2.1,<3.0.0 and python-dateutil==4.0.0, we can conclude …", or "all versions
# of bsi-app depend on …"
PIN_CONFLICT = re.compile(
    r"((?:all versions of )?\S+) (depends?) on (\S+?) and ([A-Za-z0-9._-]+)==(\S+?),"
)
# uv's hint when the newest release has wheels, only not for this platform: "Wheels are
# available for `tensorflow-cpu` (v2.21.0) on the following platforms: `manylinux_2_27_x86_64`,
# `win_amd64`"
PLATFORM_HINT = re.compile(
    r"Wheels are available for `([^`]+)` \(v([^)]+)\) on the following platforms: ([^\n]+)"
)
# "error: Failed to fetch: https://download.pytorch.org/whl/cpu/torch/" then "  cause: …" lines
FETCH_FAILED = re.compile(r"Failed to fetch: `?([^`\s]+)`?")
CAUSE_LINE = re.compile(r"^\s*cause: (.+)$", re.M)
# uv's "there is no version of typing-extensions==4.16.0": with several indexes, often a version
# another index has, which uv never asks once the first index lists the project
NO_VERSION = re.compile(r"there is no version of ([A-Za-z0-9][A-Za-z0-9._-]*)")
MAX_CAUSE = 400  # characters of uv's explanation an error line carries
# uv's words for an index, or a page of links, that refused the credentials: "An index URL
# (URL) could not be queried due to a lack of valid authentication credentials (401
# Unauthorized)", "HTTP status client error (403 Forbidden) for url (URL)"; matched in its
# text with the lines joined (uv wraps them at the terminal's width)
REFUSED = re.compile(
    r"An index URL \((?P<index>[^)\s]+)\) could not be queried due to a lack of valid"
    r" authentication credentials \((?P<status>[^)]+)\)"
    r"|\((?P<code>40[13] [A-Za-z ]+)\) for url \((?P<url>[^)\s]+)\)"
)


class NotOnIndex(UserError):
    """A distribution no index lists (`name`): a private one, when an image is verified that
    holds it (`verify IMAGE -r FILE` reads it from the image)."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


def origin(requirements: RequirementSet, name: str) -> str:
    """How an error names `name`: the requirement line that asked for it, or a dependency."""
    for requirement in requirements.requirements:
        if requirement.name == name:
            return f"{requirement} ({requirement.origin})"
    return f"{name} (a dependency)"


def unresolvable(
    stderr: str, requirements: RequirementSet, target: Target[BaseFacts], arch: Arch
) -> UserError:
    """The one-line error for uv's failed resolution for `arch` (its stderr)."""
    if refused := REFUSED.search(" ".join(stderr.split())):  # before "not found": never read
        url, status = refused["index"] or refused["url"], refused["status"] or refused["code"]
        return UserError(f"cannot resolve for {arch.name}: {authentication_failed(url, status)}")
    if match := NOT_FOUND.search(stderr):
        name = canonicalize_name(match.group(1))
        return NotOnIndex(
            f"{origin(requirements, name)}: no such distribution on the package index", name
        )
    if conflict := _base_conflict(stderr, target):
        return UserError(f"cannot resolve for {arch.name}: {conflict}")
    if platform := _platform_gap(stderr, requirements, arch):
        return UserError(platform)
    if unread := _unread_index(stderr):
        return UserError(f"cannot resolve for {arch.name}: {unread}")
    cause_match = CAUSE.search(stderr)
    cause = " ".join((cause_match.group(1) if cause_match else stderr.strip()).split())
    if len(cause) > MAX_CAUSE:
        cause = cause[:MAX_CAUSE].rsplit(" ", 1)[0] + " …"
    base_pins = [
        f"{name}=={version}"
        for name, version in sorted(target.base.distributions.items())
        if re.search(rf"\b{re.escape(name)}\b", cause, re.I)
    ]
    hint = f" (the base image pins {', '.join(base_pins)})" if base_pins else ""
    if len(requirements.indexes()) > 1 and (hidden := NO_VERSION.search(cause)):
        hint += (
            f"; with several indexes uv takes {canonicalize_name(hidden.group(1))} only from the"
            " first that lists it (--extra-index-url ones before --index-url): the others'"
            " versions are not seen"
        )
    return UserError(f"cannot resolve for {arch.name}: {cause}{hint}")


def _platform_gap(stderr: str, requirements: RequirementSet, arch: Arch) -> str | None:
    """A distribution whose releases have wheels, only none for this arch, when uv's cause is
    about it (tensorflow-cpu on arm64): what that release has instead, or None."""
    cause = CAUSE.search(stderr)
    for hint in PLATFORM_HINT.finditer(stderr):
        name, version = hint.group(1), hint.group(2)
        if cause is None or name not in cause.group(1):
            continue
        platforms = ", ".join(re.findall(r"`([^`]+)`", hint.group(3)))
        return (
            f"{origin(requirements, canonicalize_name(name))}: no wheel for {arch.name}"
            f" ({arch.machine}) on the package index; release {version} has wheels only for"
            f" {platforms}"
        )
    return None


def check_against_base(
    requirements: RequirementSet, target: Target[BaseProfile], arch: Arch
) -> None:
    """Refuse a requirement the base's pinned version does not satisfy, before resolving."""
    environment = target.marker_environment(arch)
    for requirement in (*requirements.requirements, *requirements.constraints):
        pinned = target.base.distributions.get(requirement.name)
        if pinned is None or not requirement.applies(environment):
            continue
        if not requirement.requirement.specifier.contains(pinned, prereleases=True):
            raise UserError(
                f"{requirement} ({requirement.origin}) conflicts with the base image"
                f" {target.base.image}, which pins {requirement.name}=={pinned}"
            )


def _base_conflict(stderr: str, target: Target[BaseFacts]) -> str | None:
    """A dependency that disagrees with a distribution the base pins, as uv derived it (the
    last derivation: the newest release it tried), or None. A requirement that names the pinned
    distribution itself is refused before resolving (`check_against_base`); one of its
    dependencies only shows here, among uv's hundreds of lines about every older release."""
    for dependent, verb, wanted, name, version in reversed(PIN_CONFLICT.findall(stderr)):
        if target.base.distributions.get(canonicalize_name(name)) == version:
            return (
                f"{dependent} {verb} on {wanted}, but the base image"
                f" pins {canonicalize_name(name)}=={version} (its /app/deps comes first on"
                " PYTHONPATH)"
            )
    return None


def _unread_index(stderr: str) -> str | None:
    """The index uv could not read, the project it asked for and uv's last cause, or None."""
    if not (match := FETCH_FAILED.search(stderr)):
        return None
    url = redact(match.group(1))
    causes = CAUSE_LINE.findall(stderr, match.end())
    why = " ".join(causes[-1].split())[:MAX_CAUSE] if causes else "no answer"
    if not url.endswith("/"):  # not a project's page (`<index>/<project>/`)
        return f"fetching {url} failed ({why})"
    index, _, project = url.rstrip("/").rpartition("/")
    return f"the index {index} could not be read for {project} ({why})"


def not_found(stderr: str) -> bool:
    """Did uv fail because a distribution is on no index?"""
    return NOT_FOUND.search(stderr) is not None


@dataclass(frozen=True)
class BaseConflict:
    """A release the set takes whose requirement the base's pin does not satisfy."""

    release: str  # "botocore==1.44.30"
    wanted: str  # what it asks: "python-dateutil>=2.1,<3.0.0"
    name: str  # the base's distribution: "python-dateutil"
    pinned: str  # the base's version: "4.0.0"


def implicated_pins(stderr: str, target: Target[BaseFacts]) -> dict[str, str]:
    """The base's pins uv's failure names (`python-dateutil==4.0.0`), name -> version."""
    return {
        name: version
        for name, version in target.base.distributions.items()
        if re.search(rf"(?<![\w.-]){re.escape(name)}=={re.escape(version)}(?![\w.])", stderr, re.I)
    }


def wanted_of(stderr: str, release: str, name: str) -> str:
    """What `release` asks of `name`, read from uv's failure to resolve it against the pin
    ("botocore>=1.44.18 depends on python-dateutil>=2.1,<3.0.0 and python-dateutil==4.0.0");
    the bare name when uv said it otherwise."""
    project = release.partition("==")[0]
    pattern = rf"{re.escape(project)}(?:[=<>~!]\S*)? depends on ({re.escape(name)}\S*) and"
    match = re.search(pattern, stderr, re.I)
    return match.group(1) if match else name


def base_way_out(
    conflicts: Sequence[BaseConflict], overrides: Mapping[str, str], arch: Arch
) -> UserError:
    """The one-line error for a set the base's pins refuse, naming each conflict and the
    override lines that let it resolve. The base's /app/deps comes first on PYTHONPATH, so the
    base's version is what runs whatever the extras would install: the override says so."""
    said = "; ".join(
        f"{c.release} depends on {c.wanted}, but the base image pins {c.name}=={c.pinned}"
        for c in conflicts
    )
    lines = " and ".join(f"{name}=={version}" for name, version in sorted(overrides.items()))
    runs = " and ".join(f"{name} {version}" for name, version in sorted(overrides.items()))
    return UserError(
        f"cannot resolve for {arch.name}: {said}. The base's /app/deps comes first on"
        f" PYTHONPATH, so its {runs} is what runs either way: to plan with it, give --override FILE"
        f" with the line{'s' if len(overrides) > 1 else ''} {lines}"
    )
