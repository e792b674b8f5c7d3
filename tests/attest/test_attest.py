"""The SBOM and provenance documents (builder.attest), from facts to JSON, schema-checked."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from builder.attest.contents import (
    DebianPackage,
    WheelOrigin,
    debian_packages,
    distribution,
)
from builder.attest.provenance import (
    PREDICATE_TYPE,
    BuildParameters,
    BuildRun,
    InputFile,
    provenance_document,
)
from builder.attest.sbom import (
    ImageContents,
    Listed,
    listed,
    restamped,
    timestamp,
    wheel_origins,
)
from builder.attest.sbom_render import sbom_document
from builder.errors import UserError

STATUS = """\
Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.41-12
Description: GNU C Library
 multi-line description
 .

Package: libgomp1
Status: install ok installed
Architecture: amd64
Source: gcc-14 (14.2.0-19)
Version: 14.2.0-19

Package: removed-thing
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""

TARGET = {
    "python_version": "3.13",
    "python_full_version": "3.13.5",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "os_name": "posix",
}

LIGHTGBM = """\
Metadata-Version: 2.1
Name: LightGBM
Version: 4.6.0
License: The MIT License (Microsoft)
Classifier: License :: OSI Approved :: MIT License
Requires-Dist: numpy>=1.17.0
Requires-Dist: scipy
Requires-Dist: pandas>=0.24.0; extra == "pandas"
Requires-Dist: tomli; python_version < "3.11"
Requires-Dist: pywin32; sys_platform == "win32"
"""

NUMPY = "Metadata-Version: 2.4\nName: numpy\nVersion: 2.3.1\nLicense-Expression: BSD-3-Clause\n"


def test_dpkg_status_lists_installed_packages_with_their_source() -> None:
    packages = debian_packages(STATUS)
    assert packages == (
        DebianPackage("libc6", "2.41-12", "amd64", "glibc", "2.41-12"),
        DebianPackage("libgomp1", "14.2.0-19", "amd64", "gcc-14", "14.2.0-19"),
    )


def test_metadata_gives_name_licences_and_the_targets_requirements() -> None:
    lightgbm = distribution(LIGHTGBM, "/app/deps-extra", TARGET)
    assert (lightgbm.name, lightgbm.version) == ("lightgbm", "4.6.0")
    assert lightgbm.licenses == ("The MIT License (Microsoft)", "MIT License")
    assert lightgbm.requires == ("numpy", "scipy")  # no extra, no <3.11, no win32
    numpy = distribution(NUMPY, "/app/deps", TARGET)
    assert numpy.licenses == ("BSD-3-Clause",)
    with pytest.raises(UserError, match="no Name or Version"):
        distribution("Metadata-Version: 2.1\nSummary: x\n", "/app/deps", TARGET)


def _contents() -> ImageContents:
    wheel = WheelOrigin(
        "lightgbm-4.6.0-py3-none-manylinux_2_28_x86_64.whl",
        "https://user:s3cret@index.example/packages/lightgbm-4.6.0.whl",
        "ab" * 32,
    )
    base_debs = debian_packages(STATUS)[:1]
    return ImageContents(
        repository="127.0.0.1:5000/platform/sandbox",
        digest="sha256:" + "1" * 64,
        arch="amd64",
        base_reference="127.0.0.1:5000/platform/runtime:1.4.2",
        base_digest="sha256:" + "2" * 64,
        debian=debian_packages(STATUS),
        base_debian=base_debs,
        python=(
            distribution(NUMPY, "/app/deps", TARGET),
            replace(
                distribution(LIGHTGBM, "/app/deps-extra", TARGET),
                layer="sha256:" + "3" * 64,
                wheel=wheel,
            ),
        ),
        created=timestamp(1_700_000_000),
        tool_version="0.1.0",
    )


def test_sbom_is_valid_cyclonedx_and_lists_every_part() -> None:
    document = sbom_document(_contents())  # validated against the 1.6 schema inside
    data = json.loads(document)
    assert data["specVersion"] == "1.6"
    assert data["metadata"]["timestamp"].startswith("2023-11-14T22:13:20")
    by_purl = {c["purl"]: c for c in data["components"] if "purl" in c}
    lightgbm = by_purl["pkg:pypi/lightgbm@4.6.0"]
    assert lightgbm["hashes"] == [{"alg": "SHA-256", "content": "ab" * 32}]
    reference = lightgbm["externalReferences"][0]
    assert reference["url"] == "https://index.example/packages/lightgbm-4.6.0.whl"
    assert b"s3cret" not in document, "credentials never reach an attachment"
    gomp = by_purl["pkg:deb/debian/libgomp1@14.2.0-19?arch=amd64&distro=debian-13"]
    properties = {p["name"]: p["value"] for p in gomp["properties"]}
    assert properties["build-sandbox-image:layer"] == "apt"
    assert properties["build-sandbox-image:deb:source"] == "gcc-14"
    libc = by_purl["pkg:deb/debian/libc6@2.41-12?arch=amd64&distro=debian-13"]
    assert {p["value"] for p in libc["properties"]} >= {"base", "glibc"}
    graph = {d["ref"]: set(d.get("dependsOn", ())) for d in data["dependencies"]}
    root = data["metadata"]["component"]["bom-ref"]
    base = next(c["bom-ref"] for c in data["components"] if c["type"] == "container")
    assert graph[root] == {base, gomp["bom-ref"], lightgbm["bom-ref"]}
    assert graph[base] == {libc["bom-ref"], "pkg:pypi/numpy@2.3.1"}
    assert graph[lightgbm["bom-ref"]] == {"pkg:pypi/numpy@2.3.1"}  # scipy is not in the image


def test_the_same_image_always_gets_the_same_sbom() -> None:
    assert sbom_document(_contents()) == sbom_document(_contents())


def test_an_sbom_reads_back_as_what_it_lists() -> None:
    subject, found = listed(sbom_document(_contents()))
    assert subject == "sha256:" + "1" * 64
    assert found == {
        Listed("deb", "libc6", "2.41-12"),
        Listed("deb", "libgomp1", "14.2.0-19"),
        Listed("pypi", "numpy", "2.3.1"),
        Listed("pypi", "lightgbm", "4.6.0"),
    }
    with pytest.raises(UserError, match="not a CycloneDX document"):
        listed(b'{"bomFormat": "CycloneDX"}')


def test_provenance_names_inputs_and_no_secret() -> None:
    contents = _contents()
    wheel = contents.python[1].wheel
    assert wheel is not None
    document = provenance_document(
        BuildParameters(
            requirements=(InputFile("requirements.txt", "cd" * 32),),
            arches=("amd64", "arm64"),
            platform_version="1.4.2",
            base_image=contents.base_reference,
            flags={"with_optional": False, "bytecode": True},
        ),
        BuildRun(
            repository=contents.repository,
            digest=contents.digest,
            arch="amd64",
            base_reference=contents.base_reference,
            base_digest=contents.base_digest,
            wheels=(wheel,),
            apt=contents.debian[1:],
            source_date_epoch=1_700_000_000,
            tool_version="0.1.0",
            started=datetime(2026, 12, 1, 6, 0, tzinfo=UTC),
            finished=datetime(2026, 12, 1, 6, 1, tzinfo=UTC),
        ),
    )
    assert b"s3cret" not in document
    statement = json.loads(document)
    assert statement["predicateType"] == PREDICATE_TYPE
    assert statement["subject"] == [{"name": contents.repository, "digest": {"sha256": "1" * 64}}]
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["requirements"] == [
        {"path": "requirements.txt", "digest": {"sha256": "cd" * 32}}
    ]
    assert definition["internalParameters"]["SOURCE_DATE_EPOCH"] == 1_700_000_000
    resolved = {d["name"]: d for d in definition["resolvedDependencies"]}
    assert resolved["base"]["digest"] == {"sha256": "2" * 64}
    assert resolved[wheel.filename]["digest"] == {"sha256": "ab" * 32}
    assert resolved["libgomp1"]["annotations"]["version"] == "14.2.0-19"
    assert statement["predicate"]["runDetails"]["metadata"]["startedOn"] == "2026-12-01T06:00:00Z"


def test_an_image_built_on_a_base_reads_the_base_s_wheels_from_its_sbom() -> None:
    document = sbom_document(_contents())
    origins = wheel_origins(document, "/app/deps-extra")
    assert origins == {
        "lightgbm": WheelOrigin(
            "lightgbm-4.6.0-py3-none-manylinux_2_28_x86_64.whl",
            "https://index.example/packages/lightgbm-4.6.0.whl",  # as attached: no credentials
            "ab" * 32,
        )
    }
    assert wheel_origins(document, "/app/deps") == {}  # numpy: no wheel known
    assert wheel_origins(b"not json", "/app/deps") == {}


@pytest.mark.parametrize(
    "repository", ["127.0.0.1:5000/platform/sandbox", "aa.example/first", "zz.example/last"]
)
def test_an_sbom_restamped_with_the_manifest_digest_is_the_one_rendered_for_it(
    repository: str,
) -> None:
    by_id = sbom_document(_contents())  # what verify compares, named by the image id
    digest = "sha256:" + "9" * 64
    direct = sbom_document(replace(_contents(), repository=repository, digest=digest))
    assert restamped(by_id, repository, digest) == direct
    assert listed(restamped(by_id, repository, digest))[0] == digest != listed(by_id)[0]
