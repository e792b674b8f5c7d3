"""Every pushed image carries its SBOM and provenance (issue 21), on the real engine and registry.

The reference base is pushed to the local registry by `base`'s own path (one arch, with its
own SBOM), and a build on it of a synthetic wheel whose extension links libgomp (so the apt
layer installs the real `libgomp1`) is pushed. The attachments are then found through the
referrers tag schema fallback (the registry here has no referrers API), read back, checked
against the CycloneDX 1.6 schema and against the image itself; verify is shown to fail an
SBOM that omits an installed distribution; `sbom` prints what is attached, and names an
image that has none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from support.faultproxy import FaultProxy, Plan, Rule
from support.machine import Registry as LocalRegistry
from support.registryhelp import tool
from support.wheelfactory import compile_so, make_wheel
from support.wheelindex import serve_wheel

from builder.cache import Cache
from builder.context.render import check_output
from builder.engines.connection import Engine
from builder.oci.auth import Credentials
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import attached_document, referrers
from builder.oci.ztoc import SOCI_INDEX
from builder.orchestration.reference_base import build_base_index, chosen_wheels, locked_packages
from builder.publish.attachments import read_attached
from builder.publish.build_facts import FACTS_TYPE
from builder.verify.run import verify_image

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

RUN = uuid.uuid4().hex[:8]
TAG = "cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64"
SBOM = "application/vnd.cyclonedx+json"
INTOTO = "application/vnd.in-toto+json"
INDEX_LOGIN = "bsi-index:index-s3cret"  # the wheel's index wants it: no document may carry it


def client_of(registry: LocalRegistry, repository: str) -> RepositoryClient:
    ref = ImageRef.parse(f"{registry.host}/{repository}:x")
    return RepositoryClient(ref, credentials=Credentials(registry.user, registry.password, "test"))


@dataclass
class Pushed:
    repository: str  # host/path
    digest: str  # the amd64 image's manifest digest (one arch: what the tag names)
    context: Path
    report: dict[str, Any]
    wheel_sha256: str
    local_tag: str
    stdout: str


@pytest.fixture(scope="module")
def base(
    registry: LocalRegistry, standin_index: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The reference base (amd64) pushed as an index by `base`'s own path, with its SBOM."""
    tag = f"{registry.host}/bsi-attach-{RUN}/runtime:1.0"
    env = {"BSI_REGISTRY_USER": registry.user, "BSI_REGISTRY_PASSWORD": registry.password}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        cache = Cache(tmp_path_factory.mktemp("base-cache"))
        build_base_index(
            ImageRef.parse(tag), ["amd64"], base_image=ImageRef.parse(standin_index), cache=cache
        )
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return tag


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry, base: str) -> Pushed:
    tmp_path = tmp_path_factory.mktemp("attach")
    core = compile_so(tmp_path, "int train(void) { return 1; }\n", "core.so", libs=["gomp"])
    wheel = make_wheel(
        tmp_path / "wheels",
        "gompy",
        "1.0",
        TAG,
        {
            "gompy/__init__.py": b"",
            "gompy/_core.cpython-313-x86_64-linux-gnu.so": core.read_bytes(),
        },
        top_level=["gompy"],
    )
    repository = f"{registry.host}/bsi-attach-{RUN}/gompy"
    local_tag = f"bsi-attach-{RUN}/gompy:test"
    with serve_wheel(wheel, "gompy", credentials=INDEX_LOGIN) as port:
        requirements = tmp_path / "requirements.txt"
        index = f"http://{INDEX_LOGIN}@127.0.0.1:{port}/simple"
        requirements.write_text(f"--extra-index-url {index}\ngompy\n")
        result = tool(
            registry, "-r", str(requirements), "--base-image", base, "--arch", "amd64",
            "--tag", local_tag, "--push", repository,
            "--output", str(tmp_path / "context"), "--cache-dir", str(tmp_path / "cache"),
        )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "context" / "report.json").read_text())["image"]
    return Pushed(
        repository,
        report["digest"],
        tmp_path / "context",
        report,
        hashlib.sha256(wheel.read_bytes()).hexdigest(),
        local_tag,
        result.stdout,
    )


def attached(registry: LocalRegistry, pushed: Pushed) -> dict[str, bytes]:
    target = client_of(registry, pushed.repository.split("/", 1)[1])
    return {r.artifact_type: attached_document(target, r) for r in referrers(target, pushed.digest)}


def test_the_sbom_and_provenance_are_found_through_the_fallback_tag(
    registry: LocalRegistry, pushed: Pushed
) -> None:
    documents = attached(registry, pushed)
    # and a SOCI index: built from another cache, the image takes its base's layers' ztocs from
    # the index `base` attached to the base (builder.layers.soci.base_ztocs); and the build
    # facts a later --cache-from reads (builder.publish.build_facts)
    assert set(documents) == {SBOM, INTOTO, SOCI_INDEX, FACTS_TYPE}
    assert pushed.report["soci"]["ztocs"] and pushed.report["soci"]["index"]
    assert documents[SBOM] == (pushed.context / "sbom-amd64.cdx.json").read_bytes()
    assert documents[INTOTO] == (pushed.context / "provenance-amd64.intoto.json").read_bytes()
    assert pushed.report["attachments"] == ["provenance-amd64.intoto.json", "sbom-amd64.cdx.json"]
    assert check_output(pushed.context) == pushed.context  # the next run may replace it
    assert not any(b"index-s3cret" in document for document in documents.values())
    statement = json.loads(documents[INTOTO])
    flags = statement["predicate"]["buildDefinition"]["externalParameters"]["flags"]
    assert "http://127.0.0.1:" in flags["indexes"] and "bsi-index" not in flags["indexes"]
    assert statement["subject"][0]["digest"] == {"sha256": pushed.digest.removeprefix("sha256:")}
    resolved = {
        d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    }
    assert resolved[f"gompy-1.0-{TAG}.whl"]["digest"] == {"sha256": pushed.wheel_sha256}
    assert "libgomp1" in resolved


def test_the_sbom_is_valid_and_lists_the_wheel_and_the_apt_package(
    registry: LocalRegistry, pushed: Pushed, test_env: dict
) -> None:
    document = attached(registry, pushed)[SBOM]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(document.decode()) is None
    data = json.loads(document)
    assert data["metadata"]["component"]["version"] == pushed.digest
    by_name = {c["name"]: c for c in data["components"]}
    gompy = by_name["gompy"]
    assert gompy["hashes"] == [{"alg": "SHA-256", "content": pushed.wheel_sha256}]
    # not PyPI's: the purl names its index (credentials removed); PyPI's pandas names none
    assert re.fullmatch(
        r"pkg:pypi/gompy@1\.0\?repository_url=http://127\.0\.0\.1:\d+/simple", gompy["purl"]
    )
    assert INDEX_LOGIN.encode() not in document
    assert {"name": "build-sandbox-image:location", "value": "/app/deps-extra"} in gompy[
        "properties"
    ]
    installed = subprocess.run(
        [test_env["docker"], "run", "--rm", "--entrypoint", "dpkg-query", pushed.local_tag,
         "-W", "-f", "${Version}", "libgomp1"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    gomp = by_name["libgomp1"]
    assert gomp["version"] == installed
    assert gomp["purl"].startswith(f"pkg:deb/debian/libgomp1@{installed}?arch=amd64")
    assert {"name": "build-sandbox-image:layer", "value": "apt"} in gomp["properties"]
    pandas = by_name["pandas"]  # the base's /app/deps, its wheel as the base's own SBOM says
    (wheel,) = [w for w in chosen_wheels("amd64") if w.name == "pandas"]
    assert pandas["hashes"] == [{"alg": "SHA-256", "content": wheel.file.sha256}]
    assert pandas["purl"] == f"pkg:pypi/pandas@{wheel.version}"
    assert {"name": "build-sandbox-image:location", "value": "/app/deps"} in pandas["properties"]


def test_the_delivery_verified_the_image_against_its_sbom(pushed: Pushed) -> None:
    checks = {c["name"]: c for c in pushed.report["verification"]["checks"]}
    assert checks["sbom"]["passed"], checks["sbom"]
    assert "PASS  sbom" in pushed.stdout


def test_verify_fails_an_sbom_that_omits_an_installed_distribution(
    registry: LocalRegistry, pushed: Pushed, docker_client: Any
) -> None:
    data = json.loads(attached(registry, pushed)[SBOM])
    data["components"] = [c for c in data["components"] if c["name"] != "gompy"]
    omitting = json.dumps(data).encode()
    report = verify_image(
        pushed.local_tag, engine=Engine.local(docker_client), sdk=False, sbom=omitting
    )
    (line,) = [c for c in report.checks if c.name == "sbom"]
    assert not line.passed and not report.passed
    assert "1 installed but not in the SBOM (pypi:gompy==1.0)" in line.detail


def test_sbom_prints_what_an_earlier_run_attached(registry: LocalRegistry, pushed: Pushed) -> None:
    tag = pushed.report["tags"][0]
    result = tool(registry, "sbom", tag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n").encode() == attached(registry, pushed)[SBOM]
    statement = tool(registry, "sbom", tag, "--arch", "amd64", "--provenance")
    assert statement.returncode == 0, statement.stderr
    assert json.loads(statement.stdout)["predicateType"] == "https://slsa.dev/provenance/v1"


def test_sbom_through_a_flaky_registry_says_its_retries_beside_the_document(
    registry: LocalRegistry, pushed: Pushed
) -> None:
    """`sbom` reads with the run's policy and says each retry, on stderr: its stdout is the
    document alone, byte for byte what a clean registry gives."""
    tag = pushed.report["tags"][0]
    rules = (
        Rule(r"^GET /v2/.*/manifests/", "503"),  # the tag's index
        Rule(r"^GET /v2/.*/referrers/", "drop-before"),
    )
    proxy = FaultProxy(registry.host, Plan(rules=rules))
    try:
        result = tool(registry, "sbom", tag.replace(registry.host, proxy.host, 1))
    finally:
        proxy.close()
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n").encode() == attached(registry, pushed)[SBOM]
    notes = result.stderr.splitlines()
    assert len(notes) >= 2 and all(line.startswith("note: registry ") for line in notes), notes
    assert any(f"registry {proxy.host} answered 503 to GET " in line for line in notes)
    assert any("/referrers/" in line and "(try 1 of 5)" in line for line in notes)


def test_sbom_names_an_image_with_nothing_attached(
    registry: LocalRegistry, standin_index: str
) -> None:
    bare = standin_index  # the stand-in, pushed by the setup without attachments
    result = tool(registry, "sbom", bare, "--arch", "amd64")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: no SBOM is attached to {bare} (amd64, sha256:")


def test_verify_of_a_pushed_image_compares_it_with_its_attached_sbom(
    registry: LocalRegistry, pushed: Pushed
) -> None:
    result = tool(registry, "verify", f"{pushed.repository}@{pushed.digest}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "PASS  sbom" in result.stdout and "exactly the" in result.stdout
    assert "PASS  soci" in result.stdout  # the index (the base's ztocs) matches the layers


def test_the_reference_base_pushed_as_an_index_carries_its_own(
    registry: LocalRegistry, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
    (found,) = read_attached(ImageRef.parse(base), SBOM)
    assert found.arch == "amd64" and found.document is not None
    data = json.loads(found.document)
    assert data["metadata"]["component"]["version"] == found.digest
    by_name = {c["name"]: c for c in data["components"]}
    pandas = next(p for p in locked_packages("amd64") if p.name == "pandas")
    assert by_name["pandas"]["version"] == pandas.version
    (wheel,) = [w for w in chosen_wheels("amd64") if w.name == "pandas"]
    assert by_name["pandas"]["hashes"] == [{"alg": "SHA-256", "content": wheel.file.sha256}]
    assert by_name["libc6"]["purl"].startswith("pkg:deb/debian/libc6@")
    (statement,) = read_attached(ImageRef.parse(base), INTOTO, "amd64")
    assert statement.document is not None
    resolved = json.loads(statement.document)["predicate"]["buildDefinition"]
    assert wheel.file.filename in {d["name"] for d in resolved["resolvedDependencies"]}
