"""What delivery attaches to each arch image: its SBOM and its provenance, from its facts.

The facts are read out of the engine image that is verified (builder.assemble.read_contents: dpkg's
status, every METADATA on PYTHONPATH) and joined with what the plan knows and the image
cannot say: each extra's wheel (URL, sha256), the base by digest, which Debian packages the
base brought, the target's marker environment. They are read once, before verification, so
verify can compare the running image with the SBOM. The SBOM is rendered and schema-checked
once, named by the image id; once the image value to write exists it is restamped with the
manifest digest (only the root's name depends on it), the provenance is rendered, and both are
pushed with the image by builder.oci.remote.write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import docker

from builder import credentials
from builder.assemble.read_contents import image_facts
from builder.attest import provenance, sbom
from builder.attest.contents import (
    PythonDistribution,
    WheelOrigin,
    debian_packages,
    distribution,
)
from builder.attest.provenance import BuildParameters, BuildRun
from builder.context.labels import tool_version
from builder.contract import DEPS
from builder.engines.connection import engine_client, native_arch
from builder.errors import RegistryError, RegistryUnreachable, UserError
from builder.oci.name import ImageRef
from builder.oci.referrers import Attachment, attached_document, referrers
from builder.oci.remote import read
from builder.oci.v1 import ConfigFile, Index, Platform, digest_of
from builder.plan.plan import EXTRA_DEPS, Plan, PlannedWheel
from builder.reporter import QUIET, Reporter
from builder.resolve.origins import is_default
from builder.resolve.target import ARCHES, Target
from builder.retry import Retries

SBOM_FILE = "sbom-{arch}.cdx.json"
PROVENANCE_FILE = "provenance-{arch}.intoto.json"


@dataclass
class Attestable:
    """One arch image's SBOM facts and provenance run, everything but its manifest digest."""

    contents: sbom.ImageContents
    run: BuildRun
    parameters: BuildParameters
    documents: dict[str, bytes] = field(default_factory=dict)  # file name -> bytes, once written
    rendered: bytes | None = None  # the SBOM named by the image id, once rendered

    def sbom(self) -> bytes:
        """The SBOM named by the image id (what verify compares lists the same parts), rendered
        and schema-checked once: the attached one is this one restamped with the digest."""
        if self.rendered is None:
            from builder.attest.sbom_render import sbom_document  # the CycloneDX library

            self.rendered = sbom_document(self.contents)
        return self.rendered

    def attachments(self, repository: str, digest: str) -> tuple[Attachment, ...]:
        """The SBOM and the provenance of the image written as `repository@digest`."""
        run = replace(self.run, repository=repository, digest=digest, finished=datetime.now(UTC))
        arch = self.contents.arch
        document = sbom.restamped(self.sbom(), repository, digest)
        statement = provenance.provenance_document(self.parameters, run)
        self.documents = {
            SBOM_FILE.format(arch=arch): document,
            PROVENANCE_FILE.format(arch=arch): statement,
        }
        return (
            Attachment(sbom.MEDIA_TYPE, document),
            Attachment(provenance.MEDIA_TYPE, statement),
        )


@dataclass(frozen=True)
class ImageFactsRequest:
    """Which arch image to read, under what name, and what the image cannot say of itself."""

    arch: str
    engine_name: str
    config: bytes  # the config verified: its id names the image until it has a digest
    repository: str
    base_reference: str  # what the image was built FROM, as the operator named it
    base_digest: str
    environment: Mapping[str, str]  # the target's PEP 508 markers, for the METADATA
    entries: tuple[str, ...]  # the PYTHONPATH entries to read
    wheels: Mapping[str, WheelOrigin] = field(default_factory=dict)  # what this build installed
    base_wheels: Mapping[str, WheelOrigin] = field(
        default_factory=dict
    )  # where /app/deps came from
    base_packages: frozenset[str] | None = None  # the base's dpkg names; None: not probed
    apt_packages: frozenset[str] = frozenset()  # what the apt layer was asked to install
    extras_layers: Mapping[str, str] = field(default_factory=dict)  # dist name -> diff ID


def plan_facts(
    plan: Plan,
    produced: tuple[str, str, bytes],
    repository: str,
    extras_layers: Mapping[str, str],
    reporter: Reporter = QUIET,
    retries: Retries | None = None,
) -> ImageFactsRequest:
    """What an extension image's facts need from its plan; `produced`: arch, name, config.

    The base's /app/deps wheels come from the SBOM attached to the base, where it has one.
    """
    arch, engine_name, config = produced
    planned = next(a for a in plan.arches if a.arch == arch)
    return ImageFactsRequest(
        arch=arch,
        engine_name=engine_name,
        config=config,
        repository=repository,
        base_reference=plan.base.image,
        base_digest=plan.base.digest or "",
        environment=Target(plan.base, (ARCHES[arch],)).marker_environment(ARCHES[arch]),
        entries=tuple(e for e in dict.fromkeys((DEPS, plan.pythonpath_entry, EXTRA_DEPS))),
        wheels={w.name: wheel_origin(w) for w in planned.wheels},
        base_wheels=base_wheels(plan.base_reference, arch, reporter, retries),
        base_packages=plan.base.packages.get(arch),
        apt_packages=frozenset(planned.apt_packages),
        extras_layers=extras_layers,
    )


def wheel_origin(wheel: PlannedWheel) -> WheelOrigin:
    """What the SBOM says of a wheel: its file, and its index when that is not PyPI (purl's
    default, which its `repository_url` qualifier names only otherwise)."""
    index = "" if is_default(wheel.index) else wheel.index
    source = wheel.source
    if source is None:
        return WheelOrigin(wheel.filename, wheel.url, wheel.sha256, index)
    kind, commit = source.kind.value, source.commit
    return WheelOrigin(wheel.filename, wheel.url, wheel.sha256, index, kind, commit)


def attestable(
    client: docker.DockerClient,
    request: ImageFactsRequest,
    parameters: BuildParameters,
    started: datetime,
) -> Attestable:
    """Read the image's facts and join them with what the request adds."""
    arch = request.arch
    facts = image_facts(client, request.engine_name, request.entries)
    debian = debian_packages(facts.dpkg_status)
    names = request.base_packages
    base_debian = tuple(
        p
        for p in debian
        if (p.name in names if names is not None else p.name not in request.apt_packages)
    )
    config = ConfigFile.parse(request.config)
    epoch = int(datetime.fromisoformat(config.created).timestamp())
    environment = request.environment
    top = config.diff_ids or ("",)
    python: list[PythonDistribution] = []
    for location, text in facts.metadata:
        found = distribution(text, location, environment)
        if location == DEPS:
            found = replace(found, wheel=request.base_wheels.get(found.name))
        else:
            layer = request.extras_layers.get(found.name, top[-1])
            found = replace(found, wheel=request.wheels.get(found.name), layer=layer)
        python.append(found)
    image_id = digest_of(request.config)
    contents = sbom.ImageContents(
        repository=request.repository,
        digest=image_id,
        arch=arch,
        base_reference=request.base_reference,
        base_digest=request.base_digest,
        debian=debian,
        base_debian=base_debian,
        python=tuple(python),
        created=sbom.timestamp(epoch),
        tool_version=tool_version(),
    )
    in_base = set(base_debian)
    run = BuildRun(
        repository=request.repository,
        digest=image_id,
        arch=arch,
        base_reference=request.base_reference,
        base_digest=request.base_digest,
        wheels=tuple(request.wheels.values()),
        apt=tuple(p for p in debian if p not in in_base),
        source_date_epoch=epoch,
        tool_version=contents.tool_version,
        started=started,
        finished=started,
        internal={"python": environment.get("python_full_version", "")},
    )
    return Attestable(contents, run, parameters)


@dataclass(frozen=True)
class Attached:
    """What one arch image of a reference carries: its digest and the document asked for."""

    arch: str
    digest: str
    document: bytes | None  # None: nothing of that type is attached


def read_attached(
    ref: ImageRef, artifact_type: str, arch: str | None = None, retries: Retries | None = None
) -> list[Attached]:
    """The `artifact_type` document attached to each arch image `ref` names (an index: the
    arch asked, or every one it lists; an image: that image), read as `retries` say."""
    reference = str(ref)
    registry = credentials.registry(ref, reference, retries)
    found = read(registry)
    if isinstance(found, Index):
        wanted = (
            [arch] if arch else [e.platform.architecture for e in found.manifests if e.platform]
        )
        images = []
        for name in dict.fromkeys(wanted):
            entry = found.pick(Platform.linux(name))
            if entry is None:
                raise UserError(f"{reference}: no linux/{name} image in its index")
            images.append((name, entry.digest))
    else:
        if arch and found.architecture and found.architecture != arch:
            raise UserError(f"{reference} is a {found.architecture} image, not {arch}")
        images = [(found.architecture or arch or "", found.digest)]
    result = []
    for name, digest in images:
        kinds = [r for r in referrers(registry, digest) if r.artifact_type == artifact_type]
        document = attached_document(registry, kinds[-1]) if kinds else None
        result.append(Attached(name, digest, document))
    return result


def base_wheels(
    ref: ImageRef, arch: str, reporter: Reporter = QUIET, retries: Retries | None = None
) -> Mapping[str, WheelOrigin]:
    """The wheels the base's /app/deps came from, as the base's own SBOM names them; none when
    the base names no registry or carries no SBOM, or (with a warning: the SBOM is poorer for
    it) when its registry cannot be reached even after the retries."""
    if ref.is_hub:
        return {}
    try:
        found = read_attached(ref, sbom.MEDIA_TYPE, arch, retries)
    except RegistryUnreachable as error:
        reporter.warn(f"{error}; the SBOM names no origin for the base's /app/deps wheels")
        return {}
    except (RegistryError, UserError):
        return {}
    document = found[0].document if found else None
    return sbom.wheel_origins(document, DEPS) if document else {}


def attached_sbom(ref: ImageRef, retries: Retries | None = None) -> bytes | None:
    """The SBOM attached to a pushed image (of an index: the engine's arch, the image verify
    runs), for verify to compare; None when `ref` names no registry (a local image, a Hub
    name), or nothing is attached to it."""
    if ref.is_hub:  # a local name, or Docker Hub: not where this tool pushes
        return None
    client = engine_client()
    arch = native_arch(client) if client else None
    try:
        found = read_attached(ref, sbom.MEDIA_TYPE, arch, retries)
    except (RegistryError, UserError):
        return None
    return found[0].document if found else None
