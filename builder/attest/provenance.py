"""How an arch image was built, as an in-toto statement carrying SLSA provenance v1.

The subject is the arch image's manifest; `externalParameters` are what the operator chose
(requirement files by sha256, overrides, constraints, arches, flags, the platform version, the
base as named); `internalParameters` what the tool fixed (SOURCE_DATE_EPOCH, the layer formats);
`resolvedDependencies` every input the image was made from: the base by digest, each wheel by
URL and sha256, each apt package by purl and version. `runDetails` names this tool and its
version and when the run started and ended. No secret reaches it: index URLs are written
without their credentials, and apt secrets only by the id BuildKit mounts them under.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NotRequired, TypedDict

from builder.attest.contents import DebianPackage, WheelOrigin, without_credentials

MEDIA_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:build-sandbox-image:build:v1"
BUILDER_ID = "urn:build-sandbox-image"


@dataclass(frozen=True)
class InputFile:
    """A file the operator gave (a requirements, constraints or override file), by content."""

    path: str
    sha256: str


def input_files(contents: Iterable[tuple[str, bytes]]) -> tuple[InputFile, ...]:
    """Files the operator gave, by name and content hash (what provenance names them by); the
    caller reads them (builder.files.named_contents): this module is handed facts, it reads none."""
    return tuple(InputFile(name, hashlib.sha256(data).hexdigest()) for name, data in contents)


@dataclass(frozen=True)
class BuildParameters:
    """What the operator asked for: the inputs that, with the resolution, decide the image."""

    requirements: tuple[InputFile, ...]
    constraints: tuple[InputFile, ...] = ()
    overrides: tuple[InputFile, ...] = ()
    arches: tuple[str, ...] = ()
    platform_version: str = ""
    base_image: str = ""
    flags: Mapping[str, bool | str] = field(default_factory=dict)  # with_optional, bytecode...


@dataclass(frozen=True)
class BuildRun:
    """The one build of one arch image that the statement is about."""

    repository: str
    digest: str  # the arch image's manifest digest: the statement's subject
    arch: str
    base_reference: str
    base_digest: str
    wheels: tuple[WheelOrigin, ...]
    apt: tuple[DebianPackage, ...]  # what the apt layer installed, with versions
    source_date_epoch: int
    tool_version: str
    started: datetime
    finished: datetime
    internal: Mapping[str, str] = field(default_factory=dict)  # layer formats, interpreter...


class FileRecord(TypedDict):
    """An operator's file in `externalParameters`: its path and content digest."""

    path: str
    digest: dict[str, str]  # algorithm -> hex


class ExternalParameters(TypedDict):
    """SLSA's `externalParameters`: what the operator asked for."""

    requirements: list[FileRecord]
    constraints: list[FileRecord]
    overrides: list[FileRecord]
    arches: list[str]
    platformVersion: str
    baseImage: str
    flags: dict[str, bool | str]


class ResourceDescriptor(TypedDict):
    """SLSA's `ResourceDescriptor`, with the fields a resolved dependency here has."""

    name: str
    uri: str
    digest: NotRequired[dict[str, str]]  # algorithm -> hex
    annotations: NotRequired[dict[str, str]]


def provenance_document(parameters: BuildParameters, run: BuildRun) -> bytes:
    """The in-toto statement as JSON, keys sorted (stable bytes for the same inputs)."""
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": run.repository, "digest": {"sha256": run.digest.removeprefix("sha256:")}}
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": _external(parameters),
                "internalParameters": {
                    "SOURCE_DATE_EPOCH": run.source_date_epoch,
                    "arch": run.arch,
                    **dict(sorted(run.internal.items())),
                },
                "resolvedDependencies": _resolved(run),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"build-sandbox-image": run.tool_version}},
                "metadata": {
                    "invocationId": f"{run.repository}@{run.digest}",
                    "startedOn": _time(run.started),
                    "finishedOn": _time(run.finished),
                },
            },
        },
    }
    return json.dumps(statement, indent=2, sort_keys=True).encode()


def _external(parameters: BuildParameters) -> ExternalParameters:
    return ExternalParameters(
        requirements=[_file(f) for f in parameters.requirements],
        constraints=[_file(f) for f in parameters.constraints],
        overrides=[_file(f) for f in parameters.overrides],
        arches=list(parameters.arches),
        platformVersion=parameters.platform_version,
        baseImage=parameters.base_image,
        flags=dict(sorted(parameters.flags.items())),
    )


def _file(file: InputFile) -> FileRecord:
    return FileRecord(path=file.path, digest={"sha256": file.sha256})


def _resolved(run: BuildRun) -> list[ResourceDescriptor]:
    base = ResourceDescriptor(
        name="base",
        uri=f"oci://{run.base_reference}",
        digest={"sha256": run.base_digest.removeprefix("sha256:")},
    )
    wheels = [_wheel(w) for w in sorted(run.wheels, key=lambda w: w.filename)]
    apt = [
        ResourceDescriptor(
            name=p.name,
            uri=f"pkg:deb/debian/{p.name}@{p.version}?arch={p.architecture or run.arch}",
            annotations={"version": p.version, "source": p.source},
        )
        for p in sorted(run.apt, key=lambda p: p.name)
    ]
    return [base, *wheels, *apt]


def _wheel(wheel: WheelOrigin) -> ResourceDescriptor:
    """A wheel as a material: its file's digest, the commit it was built from (a repository's),
    and its origin when not an index (`find-links`, `path`, `url`, `vcs`)."""
    found = ResourceDescriptor(
        name=wheel.filename, uri=without_credentials(wheel.url), digest={"sha256": wheel.sha256}
    )
    if wheel.commit:
        found["digest"]["gitCommit"] = wheel.commit
    if wheel.kind:
        found["annotations"] = {"origin": wheel.kind}
    return found


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
