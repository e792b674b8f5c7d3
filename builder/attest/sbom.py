"""One arch image's contents as a CycloneDX 1.6 SBOM, and the SBOM read back.

The root component is the image (type container, named by its repository, its version the
manifest digest); it depends on the base image (reference and digest), on every distribution in
/app/deps-extra and on every Debian package the apt layer added; the base depends on its own
packages and /app/deps. Python distributions depend on what their METADATA requires on the
target, where that is in the image. Every component carries a purl (`pkg:deb/debian/…`,
`pkg:pypi/…`); a wheel the tool installed carries its sha256 and the URL it was fetched from;
`build-sandbox-image:*` properties say where each part lives (PYTHONPATH entry, layer, or which
of base and apt layer holds a package). The serial number and timestamp follow from the image
digest and SOURCE_DATE_EPOCH, so the same image always gets the same SBOM.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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
from packageurl import PackageURL

from builder.attest.contents import (
    DebianPackage,
    PythonDistribution,
    WheelOrigin,
    without_credentials,
)
from builder.errors import UserError

MEDIA_TYPE = "application/vnd.cyclonedx+json"
SCHEMA = SchemaVersion.V1_6
TOOL = "build-sandbox-image"
DISTRO = "debian-13"
PROPERTY = "build-sandbox-image"  # prefix of the properties the tool sets


@dataclass(frozen=True)
class ImageContents:
    """Everything an arch image's SBOM lists, and what identifies the image."""

    repository: str  # where the image is pushed: registry/repository
    digest: str  # its manifest's digest
    arch: str
    base_reference: str  # the base as the operator names it (the platform version's tag)
    base_digest: str
    debian: tuple[DebianPackage, ...]  # every package installed in the image
    base_debian: tuple[DebianPackage, ...]  # those of the base: the rest came with the apt layer
    python: tuple[PythonDistribution, ...]  # /app/deps and /app/deps-extra
    created: datetime  # SOURCE_DATE_EPOCH: the SBOM's timestamp
    tool_version: str


def sbom_document(contents: ImageContents) -> bytes:
    """The SBOM as CycloneDX 1.6 JSON, checked against the schema before it is returned."""
    # Imported here, not at the top: jsonschema's format checkers compile some 40 grammars when
    # imported (2-7 s on the test machine), which every command (the CLI imports this module)
    # would pay, a no-change rerun included.
    from cyclonedx.validation.json import JsonStrictValidator

    text = make_outputter(_bom(contents), OutputFormat.JSON, SCHEMA).output_as_string(indent=2)
    errors = JsonStrictValidator(SCHEMA).validate_str(text)
    if errors is not None:
        raise UserError(f"SBOM of {contents.repository}@{contents.digest}: invalid ({errors})")
    return text.encode()


def restamped(document: bytes, repository: str, digest: str) -> bytes:
    """`document` (an sbom_document) about the image `repository@digest` instead.

    Only the root's name, version and bom-ref and the serial number depend on them, so the
    document rendered and schema-checked for verify (named by the image id) is reused once the
    manifest digest exists, rather than rendered and checked again: the result is the bytes
    sbom_document gives for those contents with that repository and digest.
    """
    data = json.loads(document)
    root = data["metadata"]["component"]
    old, new = root["bom-ref"], f"{repository}@{digest}"
    root |= {"name": repository, "version": digest, "bom-ref": new}
    data["serialNumber"] = _serial(repository, digest).urn
    dependencies = data.get("dependencies") or []
    for entry in dependencies:
        if entry.get("ref") == old:
            entry["ref"] = new
    dependencies.sort(key=lambda entry: entry["ref"])  # CycloneDX's order: by ref
    return json.dumps(data, indent=2).encode()


def _serial(repository: str, digest: str) -> uuid.UUID:
    """The same image, the same serial number."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{repository}@{digest}")


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
        serial_number=_serial(contents.repository, contents.digest),
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


def _pypi(dist: PythonDistribution) -> Component:
    purl = PackageURL(type="pypi", name=dist.name, version=dist.version)
    properties = [Property(name=f"{PROPERTY}:location", value=dist.location)]
    if dist.layer:
        properties.append(Property(name=f"{PROPERTY}:layer", value=dist.layer))
    hashes, references = [], []
    if dist.wheel is not None:
        hashes.append(HashType(alg=HashAlgorithm.SHA_256, content=dist.wheel.sha256))
        references.append(
            ExternalReference(
                type=ExternalReferenceType.DISTRIBUTION,
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


@dataclass(frozen=True)
class Listed:
    """One component an SBOM lists, as a check compares it with an image: kind, name, version."""

    kind: str  # "deb" or "pypi"
    name: str
    version: str


def listed(document: bytes | str) -> tuple[str, frozenset[Listed]]:
    """The image digest an SBOM is about, and every Debian package and distribution it lists."""
    try:
        data: Any = json.loads(document)
        subject = str(data["metadata"]["component"]["version"])
        components: Iterable[Any] = data.get("components") or ()
    except (ValueError, KeyError, TypeError):
        raise UserError("SBOM: not a CycloneDX document with a metadata component") from None
    found = set()
    for component in components:
        purl = str(component.get("purl") or "") if isinstance(component, dict) else ""
        if purl.startswith(("pkg:deb/", "pkg:pypi/")):
            parsed = PackageURL.from_string(purl)
            found.add(Listed(parsed.type, parsed.name, str(parsed.version or "")))
    return subject, frozenset(found)


def wheel_origins(document: bytes | str, location: str) -> dict[str, WheelOrigin]:
    """The wheel (file, URL, sha256) an SBOM names for each distribution in `location`.

    An image built on a base reads its base's SBOM so: the base's /app/deps came from wheels
    only the base's own build knew.
    """
    try:
        components = json.loads(document).get("components") or ()
    except (ValueError, AttributeError):
        return {}
    found = {}
    for component in components:
        if not isinstance(component, dict):
            continue
        properties = {
            p.get("name"): p.get("value")
            for p in component.get("properties") or ()
            if isinstance(p, dict)
        }
        references = component.get("externalReferences") or ()
        hashes = component.get("hashes") or ()
        if properties.get(f"{PROPERTY}:location") != location or not references or not hashes:
            continue
        try:
            origin = WheelOrigin(
                str(properties[f"{PROPERTY}:wheel"]),
                str(references[0]["url"]),
                str(hashes[0]["content"]),
            )
        except (KeyError, TypeError, IndexError):
            continue
        found[str(component.get("name"))] = origin
    return found


def timestamp(epoch: int) -> datetime:
    """SOURCE_DATE_EPOCH as the SBOM's aware UTC timestamp."""
    return datetime.fromtimestamp(epoch, tz=UTC)
