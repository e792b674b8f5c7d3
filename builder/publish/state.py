"""Platform upgrades: what was built last time, and what a rebuild would change.

The state file is the record a pipeline commits next to its config: the platform version,
the base digest and python patch it was built on, the resolved extras, lock hash and apt set
per arch, and the pushed image. Comparing it with a fresh plan tells whether a rebuild is
needed, and whether it can be a rebase (builder.orchestration.produce_rebase: same locks, new
base).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import NotRequired, TypedDict

from builder.context.render import lock_text
from builder.errors import UserError
from builder.files import refuse_link, write_whole
from builder.layers.layer import lock_hash
from builder.oci.name import ImageRef
from builder.plan.plan import Plan, PlannedWheel
from builder.publish.writable import check_replaceable
from builder.resolve.resolution import SourceKind


class StateRecord(TypedDict):
    """The state file's JSON. A state written before a field existed lacks it."""

    platform_version: str
    base_image: str
    base_digest: NotRequired[str | None]
    python_version: str
    packages: dict[str, dict[str, str]]
    apt_packages: dict[str, list[str]]
    image: NotRequired[str | None]
    locks: NotRequired[dict[str, str] | None]
    path: NotRequired[str | None]
    bytecode: NotRequired[str | None]


class Route(StrEnum):
    """How an image was made: built from the base up, or its extras rebased onto a new base."""

    BUILD = "build"
    REBASE = "rebase"


@dataclass(frozen=True)
class BuildState:
    platform_version: str
    base_image: str
    base_digest: str | None
    python_version: str
    packages: Mapping[str, Mapping[str, str]]  # arch -> name -> version
    apt_packages: Mapping[str, tuple[str, ...]]  # arch -> packages
    image: str | None = None  # repository@sha256:... once pushed
    locks: Mapping[str, str] = field(default_factory=dict)  # arch -> lock hash (the resolution)
    path: Route | None = None  # how the recorded image was made
    bytecode: str | None = None  # the interpreter build that compiled its .pyc; None: none

    @cached_property
    def image_reference(self) -> ImageRef | None:
        """The recorded image as a reference, parsed once where the state is read back."""
        return ImageRef.parse(self.image, "previous image") if self.image else None

    def to_dict(self) -> StateRecord:
        return {
            "platform_version": self.platform_version,
            "base_image": self.base_image,
            "base_digest": self.base_digest,
            "python_version": self.python_version,
            "packages": {a: dict(sorted(p.items())) for a, p in sorted(self.packages.items())},
            "apt_packages": {a: list(p) for a, p in sorted(self.apt_packages.items())},
            "image": self.image,
            "locks": dict(sorted(self.locks.items())),
            "path": self.path,
            "bytecode": self.bytecode,
        }

    @classmethod
    def from_dict(cls, data: StateRecord) -> BuildState:
        return cls(
            platform_version=data["platform_version"],
            base_image=data["base_image"],
            base_digest=data.get("base_digest"),
            python_version=data["python_version"],
            packages={a: dict(p) for a, p in data["packages"].items()},
            apt_packages={a: tuple(p) for a, p in data["apt_packages"].items()},
            image=data.get("image"),
            locks=dict(data.get("locks") or {}),
            path=Route(route) if (route := data.get("path")) else None,
            bytecode=data.get("bytecode"),
        )


def state_of(
    plan: Plan, platform_version: str, image: str | None = None, path: str | None = None
) -> BuildState:
    """The state a delivery records; `path` is a `Route`'s value (a producer's)."""
    return BuildState(
        platform_version=platform_version,
        base_image=plan.base.image,
        base_digest=plan.base.digest,
        python_version=plan.base.python_version,
        packages={a.arch: {w.name: _pinned(w) for w in a.wheels} for a in plan.arches},
        apt_packages={a.arch: a.apt_packages for a in plan.arches},
        image=image,
        locks={a.arch: lock_hash(lock_text(plan, a.arch)) for a in plan.arches},
        path=Route(path) if path else None,
        bytecode=plan.bytecode,
    )


def _pinned(wheel: PlannedWheel) -> str:
    """The version a state records; for a direct requirement with what pins it (the commit, the
    file's sha256), so a branch that moved or a file replaced under the same version is a change,
    and the same commit or file is none."""
    source = wheel.source
    if source is None or source.kind is SourceKind.FIND_LINKS:  # a wheelhouse: as an index
        return wheel.version
    if source.commit:
        return f"{wheel.version} (commit {source.commit[:12]})"
    return f"{wheel.version} (sha256:{(source.sha256 or wheel.sha256)[:12]})"


def rebase_blocker(previous: BuildState | None, current: BuildState) -> str | None:
    """Why an upgrade needs a full build, or None when the extras can be rebased as they are.

    The bytecode layers are reused only for a byte-identical interpreter (its build); another
    compiles them again (natively, from cached parts) on the build path, which still reuses
    every distribution layer by digest.
    """
    if previous is None or not previous.image:
        return "no previous pushed image recorded"
    if not previous.locks:
        return "the previous state records no lock hashes"
    if previous.locks != current.locks:
        return "the resolution changed"
    if previous.python_version.rsplit(".", 1)[0] != current.python_version.rsplit(".", 1)[0]:
        return "the python minor version changed"
    if previous.bytecode != current.bytecode:
        before, after = previous.bytecode or "none", current.bytecode or "none"
        return f"the extras' bytecode interpreter changed ({before[:12]} -> {after[:12]})"
    return None


def load_state(path: Path) -> BuildState | None:
    """The state recorded at `path`; a symlink there is refused before any work, as its write
    at the end would be (builder.files)."""
    refuse_link(path)
    try:
        return BuildState.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, LookupError, TypeError, AttributeError) as error:
        # not JSON, not UTF-8, a directory, or JSON of another shape (a list, a string)
        raise UserError(
            f"{path}: unreadable build state ({type(error).__name__}: {error})"
        ) from None


def check_state(path: Path) -> BuildState | None:
    """The state at `path` (None: none recorded yet), checked before a run builds anything:
    readable, well-formed, and replaceable (builder.publish.writable)."""
    previous = load_state(path)
    check_replaceable(path, "build state")
    return previous


def write_json_whole(path: Path, document: object) -> None:
    """`document` as JSON at `path`, written whole or not at all, never through a symlink
    (builder.files): a reader never sees half a record, whatever stops the run."""
    write_whole(path, json.dumps(document, indent=2) + "\n", durable=True)


def save_state(path: Path, state: BuildState) -> None:
    write_json_whole(path, state.to_dict())


def _changed(label: str, old: object, new: object) -> list[str]:
    return [f"{label}: {old} -> {new}"] if old != new else []


def changes(previous: BuildState | None, current: BuildState) -> list[str]:
    """Human lines for everything that differs; empty means no rebuild is needed."""
    if previous is None:
        return ["no previous build recorded"]
    lines = [
        *_changed("platform version", previous.platform_version, current.platform_version),
        *_changed("base digest", previous.base_digest, current.base_digest),
        *_changed("python", previous.python_version, current.python_version),
    ]
    for arch in sorted(set(previous.packages) | set(current.packages)):
        old, new = previous.packages.get(arch, {}), current.packages.get(arch, {})
        for name in sorted(set(old) | set(new)):
            if name not in new:
                lines.append(f"{arch}: {name} {old[name]} removed")
            elif name not in old:
                lines.append(f"{arch}: {name} {new[name]} added")
            elif old[name] != new[name]:
                lines.append(f"{arch}: {name} {old[name]} -> {new[name]}")
        old_apt = set(previous.apt_packages.get(arch, ()))
        new_apt = set(current.apt_packages.get(arch, ()))
        lines += [f"{arch}: apt +{p}" for p in sorted(new_apt - old_apt)]
        lines += [f"{arch}: apt -{p}" for p in sorted(old_apt - new_apt)]
    return lines
