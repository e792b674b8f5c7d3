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

The document is rendered by builder.attest.sbom_render, the one module that imports the
CycloneDX library; this one holds the contents and reads documents back, so a command that
renders no SBOM does not import it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from packageurl import PackageURL

from builder.attest.contents import DebianPackage, PythonDistribution, WheelOrigin
from builder.errors import UserError

MEDIA_TYPE = "application/vnd.cyclonedx+json"
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


def restamped(document: bytes, repository: str, digest: str) -> bytes:
    """`document` (an sbom_document) about the image `repository@digest` instead.

    Only the root's name, version and bom-ref and the serial number depend on them, so the
    document rendered and schema-checked for verify (named by the image id) is reused once the
    manifest digest exists, rather than rendered and checked again: the result is the bytes
    sbom_render.sbom_document gives for those contents with that repository and digest.
    """
    data = json.loads(document)
    root = data["metadata"]["component"]
    old, new = root["bom-ref"], f"{repository}@{digest}"
    root |= {"name": repository, "version": digest, "bom-ref": new}
    data["serialNumber"] = serial_number(repository, digest).urn
    dependencies = data.get("dependencies") or []
    for entry in dependencies:
        if entry.get("ref") == old:
            entry["ref"] = new
    dependencies.sort(key=lambda entry: entry["ref"])  # CycloneDX's order: by ref
    return json.dumps(data, indent=2).encode()


def serial_number(repository: str, digest: str) -> uuid.UUID:
    """The same image, the same serial number."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{repository}@{digest}")


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
                _repository_url(component.get("purl")),
            )
        except (KeyError, TypeError, IndexError):
            continue
        found[str(component.get("name"))] = origin
    return found


def _repository_url(purl: object) -> str:
    """The index a component's purl names (`repository_url`), "" for PyPI or an unreadable one."""
    try:
        qualifiers = PackageURL.from_string(str(purl)).qualifiers
    except ValueError:
        return ""
    return str(qualifiers.get("repository_url", "")) if isinstance(qualifiers, dict) else ""


def timestamp(epoch: int) -> datetime:
    """SOURCE_DATE_EPOCH as the SBOM's aware UTC timestamp."""
    return datetime.fromtimestamp(epoch, tz=UTC)
