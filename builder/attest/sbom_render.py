"""An image's contents (builder.attest.sbom.ImageContents) rendered as a CycloneDX 1.6 SBOM.

The only module that imports cyclonedx-python-lib (about 0.3 s, and its schema validator, whose
format checkers compile some 40 grammars: 2-7 s on the test machine): it is imported where an
SBOM is rendered, not by every command that can carry one.
"""

from __future__ import annotations

from cyclonedx.contrib.license.factories import LicenseFactory
from cyclonedx.model import (
    ExternalReference,
    ExternalReferenceType,
    HashAlgorithm,
    HashType,
    Property,
    XsUri,
)
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output import make_outputter
from cyclonedx.schema import OutputFormat, SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from builder.attest.contents import (
    DebianPackage,
    PythonDistribution,
    WheelOrigin,
    without_credentials,
)
from builder.attest.sbom import DISTRO, PROPERTY, TOOL, ImageContents, serial_number
from builder.errors import UserError

SCHEMA = SchemaVersion.V1_6


def sbom_document(contents: ImageContents) -> bytes:
    """The SBOM as CycloneDX 1.6 JSON, checked against the schema before it is returned."""
    text = make_outputter(_bom(contents), OutputFormat.JSON, SCHEMA).output_as_string(indent=2)
    errors = JsonStrictValidator(SCHEMA).validate_str(text)
    if errors is not None:
        raise UserError(f"SBOM of {contents.repository}@{contents.digest}: invalid ({errors})")
    return text.encode()


def _bom(contents: ImageContents) -> Bom:
    root = Component(
        type=ComponentType.CONTAINER,
        name=contents.repository,
        version=contents.digest,
        bom_ref=f"{contents.repository}@{contents.digest}",
        properties=[Property(name=f"{PROPERTY}:arch", value=contents.arch)],
    )
    base = Component(
        type=ComponentType.CONTAINER,
        name=contents.base_reference,
        version=contents.base_digest,
        bom_ref=f"base:{contents.base_reference}@{contents.base_digest}",
    )
    in_base = {(p.name, p.architecture, p.version) for p in contents.base_debian}
    debs = {package: _deb(package, contents.arch, in_base) for package in contents.debian}
    dists = {dist.name: _pypi(dist) for dist in contents.python}
    bom = Bom(
        serial_number=serial_number(contents.repository, contents.digest),
        metadata=BomMetaData(
            timestamp=contents.created,
            component=root,
            tools=ToolRepository(
                components=[
                    Component(
                        type=ComponentType.APPLICATION, name=TOOL, version=contents.tool_version
                    )
                ]
            ),
        ),
        components=[base, *debs.values(), *dists.values()],
    )
    added = [c for p, c in debs.items() if (p.name, p.architecture, p.version) not in in_base]
    extras = [dists[d.name] for d in contents.python if d.layer or d.wheel]
    bom.register_dependency(root, [base, *added, *extras])
    owned = [c for p, c in debs.items() if (p.name, p.architecture, p.version) in in_base]
    bom.register_dependency(base, [*owned, *(c for c in dists.values() if c not in extras)])
    for dist in contents.python:
        bom.register_dependency(dists[dist.name], [dists[n] for n in dist.requires if n in dists])
    return bom


def _deb(package: DebianPackage, arch: str, in_base: set[tuple[str, str, str]]) -> Component:
    purl = PackageURL(
        type="deb",
        namespace="debian",
        name=package.name,
        version=package.version,
        qualifiers={"arch": package.architecture or arch, "distro": DISTRO},
    )
    origin = "base" if (package.name, package.architecture, package.version) in in_base else "apt"
    return Component(
        type=ComponentType.LIBRARY,
        name=package.name,
        version=package.version,
        purl=purl,
        bom_ref=purl.to_string(),
        properties=[
            Property(name=f"{PROPERTY}:layer", value=origin),
            Property(name=f"{PROPERTY}:deb:source", value=package.source),
            Property(name=f"{PROPERTY}:deb:source-version", value=package.source_version),
        ],
    )


def _qualifiers(wheel: WheelOrigin | None) -> dict[str, str] | None:
    """Where a distribution came from, as purl says it: `repository_url` for an index that is
    not PyPI, `vcs_url` for a repository at its commit, `download_url` for a file elsewhere."""
    if wheel is None:
        return None
    if wheel.kind == "vcs":
        return {"vcs_url": without_credentials(wheel.url)}
    if wheel.kind:
        return {"download_url": without_credentials(wheel.url)}
    index = without_credentials(wheel.index)
    return {"repository_url": index} if index else None


def _reference_type(wheel: WheelOrigin) -> ExternalReferenceType:
    """A repository is a VCS reference; anything fetched as a file, a distribution."""
    return ExternalReferenceType.VCS if wheel.kind == "vcs" else ExternalReferenceType.DISTRIBUTION


def _pypi(dist: PythonDistribution) -> Component:
    """A distribution's component; its purl names the index it came from when that is not
    PyPI (purl's `repository_url` qualifier: a `+cpu` torch from PyTorch's own index)."""
    purl = PackageURL(
        type="pypi", name=dist.name, version=dist.version, qualifiers=_qualifiers(dist.wheel)
    )
    properties = [Property(name=f"{PROPERTY}:location", value=dist.location)]
    if dist.layer:
        properties.append(Property(name=f"{PROPERTY}:layer", value=dist.layer))
    hashes, references = [], []
    if dist.wheel is not None:
        hashes.append(HashType(alg=HashAlgorithm.SHA_256, content=dist.wheel.sha256))
        references.append(
            ExternalReference(
                type=_reference_type(dist.wheel),
                url=XsUri(without_credentials(dist.wheel.url)),
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=dist.wheel.sha256)],
            )
        )
        properties.append(Property(name=f"{PROPERTY}:wheel", value=dist.wheel.filename))
    return Component(
        type=ComponentType.LIBRARY,
        name=dist.name,
        version=dist.version,
        purl=purl,
        bom_ref=purl.to_string(),
        hashes=hashes,
        external_references=references,
        licenses=_licenses(dist.licenses),
        properties=properties,
    )


def _licenses(texts: tuple[str, ...]) -> list[LicenseExpression | DisjunctiveLicense]:
    """SPDX ids and expressions where the text is one, names otherwise.

    CycloneDX takes either one expression or a list of licences: several texts that would each
    read as an expression are kept as names.
    """
    factory = LicenseFactory()
    made = [factory.make_from_string(text) for text in texts]
    if len(made) > 1 and any(isinstance(one, LicenseExpression) for one in made):
        return [factory.make_with_name(text) for text in texts]
    return made
