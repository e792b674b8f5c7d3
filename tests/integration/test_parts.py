"""Runners played for real (issue 46): one plan, each arch built by `part` on its own engine from
its own copy of the plan and its own empty cache, then `merge` in a third directory.

The runners: the default engine builds amd64, the second engine (tests/support/secondengine.py:
its own dockerd, socket and data root) builds arm64, under its qemu as an arm64 runner would
natively. Each `part` runs with the package index unreachable (a proxy that answers nothing):
what it builds comes from the plan alone. The merge's refusals each leave the registry's tags,
the template and the state as they were.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from support.machine import Registry
from support.registryhelp import registry_get, registry_tags, tool

from builder.attest import provenance, sbom
from builder.oci.client import Credentials, RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import referrers
from builder.oci.ztoc import SOCI_INDEX

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:8]
PREFIX = f"bsi-parts-{RUN}"
TEMPLATE = """\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: python-parts
spec:
  podTemplate:
    spec:
      containers:
        - name: sandbox
          image: registry.example.com/old@sha256:{old}
"""
NO_INDEX = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
KEYS = REPO_ROOT / "tests" / "support" / "sign_keys"  # cosign's own format (its README)
PASSPHRASE = "bsi-test-passphrase"


def runner(registry: Registry, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a runner without the package index runs it (the registry is on 127.0.0.1,
    which the proxy settings leave alone)."""
    env = {
        **os.environ,
        **NO_INDEX,
        "no_proxy": "127.0.0.1,localhost",
        "NO_PROXY": "127.0.0.1,localhost",
        "BSI_REGISTRY_USER": registry.user,
        "BSI_REGISTRY_PASSWORD": registry.password,
        "BSI_SIGN_PASSWORD": PASSPHRASE,
    }
    return subprocess.run(
        [sys.executable, "-m", "builder", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=2400,
    )


@dataclass
class Runs:
    plan: Path  # as planned: copied to each runner and to the merge's directory
    repository: str
    amd64: subprocess.CompletedProcess[str]
    arm64: subprocess.CompletedProcess[str]
    parts: dict[str, dict[str, Any]]  # arch -> its PLAN/parts/ARCH.json
    merge_dir: Path  # a third copy of the plan, with both parts' records
    template: Path
    state: Path
    runners: dict[str, Path]  # arch -> its runner's copy of the plan


def copy_plan(plan: Path, where: Path) -> Path:
    shutil.copytree(plan, where, symlinks=True)
    return where


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
    registry: Registry,
    shared_cache: Path,
    two_arch_base: str,
    second_engine: Any,
    docker_client: Any,
) -> Iterator[Runs]:
    """Plan once (warm cache, index reachable), then each arch's part on its own engine."""
    tmp_path = tmp_path_factory.mktemp("parts")
    (tmp_path / "requirements.txt").write_text("six\n")
    repository = f"{registry.host}/{PREFIX}/six"
    plan = tmp_path / "plan"
    planned = tool(
        registry, "-r", str(tmp_path / "requirements.txt"), "--base-image", two_arch_base,
        "--push", repository, "--no-build", "--output", str(plan),
        "--cache-dir", str(shared_cache),
    )  # fmt: skip
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-2000:]
    a, b = copy_plan(plan, tmp_path / "a" / "plan"), copy_plan(plan, tmp_path / "b" / "plan")
    amd64 = runner(
        registry, "part", str(a), "--arch", "amd64", "--push", repository,
        "--cache-dir", str(tmp_path / "a" / "cache"), "--sign-key", str(KEYS / "cosign.key"),
    )  # fmt: skip
    assert amd64.returncode == 0, amd64.stdout[-4000:] + amd64.stderr[-2000:]
    arm64 = runner(
        registry, "part", str(b), "--arch", "arm64", "--push", repository,
        "--cache-dir", str(tmp_path / "b" / "cache"), "--engine", f"arm64={second_engine.url}",
        "--sign-key", str(KEYS / "cosign.key"),
    )  # fmt: skip
    assert arm64.returncode == 0, arm64.stdout[-4000:] + arm64.stderr[-2000:]
    merge_dir = copy_plan(plan, tmp_path / "m" / "plan")
    (merge_dir / "parts").mkdir()
    parts = {}
    for arch, runner_dir in (("amd64", a), ("arm64", b)):
        source = runner_dir / "parts" / f"{arch}.json"
        shutil.copy(source, merge_dir / "parts")
        parts[arch] = json.loads(source.read_text())
    template = tmp_path / "template.yaml"
    template.write_text(TEMPLATE.format(old="0" * 64))
    state = tmp_path / "state.json"
    state.write_text(  # a previous build's record (a state that is not one fails the merge first)
        '{"recorded": "before", "platform_version": "0.9", "base_image": "x",'
        ' "python_version": "3.13.0", "packages": {}, "apt_packages": {}}\n'
    )
    runners = {"amd64": a, "arm64": b}
    yield Runs(plan, repository, amd64, arm64, parts, merge_dir, template, state, runners)
    extras = json.loads((plan / "plan.json").read_text())["plan_id"]["extras_hash"]
    second = second_engine.client()
    try:
        for client in (docker_client, second):
            remove_tagged(client, (PREFIX, f"sandbox-extension:x{extras}-"))
    finally:
        second.close()


def remove_tagged(client: Any, marks: tuple[str, ...]) -> None:
    """The images this module tagged (a part's local tag, the one-job run's), by tag."""
    for image in client.api.images():
        for tag in image.get("RepoTags") or ():
            if any(mark in tag for mark in marks):
                with contextlib.suppress(docker.errors.ImageNotFound):
                    client.images.remove(tag)


def merge(
    registry: Registry, runs: Runs, plan_dir: Path, *signed: str
) -> subprocess.CompletedProcess[str]:
    return runner(
        registry, "merge", str(plan_dir), "--push", runs.repository,
        "--template", str(runs.template), "--state", str(runs.state), *signed,
    )  # fmt: skip


def path_of(repository: str) -> str:
    return repository.split("/", 1)[1]


def client_of(registry: Registry, repository: str) -> RepositoryClient:
    ref = ImageRef.parse(f"{repository}:x")
    return RepositoryClient(ref, credentials=Credentials(registry.user, registry.password, "test"))


def refused(
    registry: Registry, runs: Runs, tmp_path: Path, edit: Any
) -> subprocess.CompletedProcess[str]:
    """A merge of a copy of the merge's directory whose parts `edit` changed: it must write
    nothing (the tags, the template and the state as they were)."""
    plan_dir = copy_plan(runs.merge_dir, tmp_path / "plan")
    edit(plan_dir / "parts")
    tags = registry_tags(registry, path_of(runs.repository))
    template, state = runs.template.read_bytes(), runs.state.read_bytes()
    result = merge(registry, runs, plan_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert registry_tags(registry, path_of(runs.repository)) == tags
    assert runs.template.read_bytes() == template
    assert runs.state.read_bytes() == state
    return result


def edited(arch: str, **fields: object) -> Any:
    def edit(parts: Path) -> None:
        path = parts / f"{arch}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    return edit


def test_each_part_was_built_on_its_engine_and_pushed_by_digest_alone(
    runs: Runs, registry: Registry, second_engine: Any
) -> None:
    assert "(emulated)" not in runs.amd64.stdout.split("part amd64", 1)[1].splitlines()[0]
    assert f"hardened on {second_engine.url}" in runs.arm64.stdout
    assert "part arm64 (emulated): " in runs.arm64.stdout  # both engines here are amd64
    for arch in ("amd64", "arm64"):
        part = runs.parts[arch]
        assert part["arch"] == arch and part["verification"] == "passed"
        assert part["plan_id"] == runs.parts["amd64"]["plan_id"]  # one plan, one id
        assert part["bytes_pushed"] > 0 and part["size"] > 0
        with registry_get(registry, f"/v2/{path_of(runs.repository)}/manifests/{part['digest']}"):
            pass  # held by digest
    named = [t for t in registry_tags(registry, path_of(runs.repository)) if "sha256-" not in t]
    assert named in ([], [tag_of(runs)])  # no tag but the merge's (cosign's sha256-*.sig aside)


def tag_of(runs: Runs) -> str:
    document = json.loads((runs.plan / "plan.json").read_text())
    version = document["platform_version"]
    return f"{version}-x{document['plan_id']['extras_hash']}"


def test_merge_without_a_part_names_the_missing_arch(
    runs: Runs, registry: Registry, tmp_path: Path
) -> None:
    result = refused(registry, runs, tmp_path, lambda parts: (parts / "arm64.json").unlink())
    assert result.stderr.startswith("error: no part for arm64")


def test_merge_with_a_part_of_another_plan_names_it(
    runs: Runs, registry: Registry, tmp_path: Path
) -> None:
    other = "0123456789ab@sha256:" + "e" * 64
    result = refused(registry, runs, tmp_path, edited("amd64", plan_id=other))
    assert result.stderr.startswith(f"error: part amd64.json: of plan {other}")


def test_merge_with_a_digest_the_registry_lacks_names_the_part(
    runs: Runs, registry: Registry, tmp_path: Path
) -> None:
    absent = "sha256:" + hashlib.sha256(f"absent {RUN}".encode()).hexdigest()
    result = refused(registry, runs, tmp_path, edited("arm64", digest=absent))
    assert result.stderr.startswith(f"error: part arm64: {absent} is not in")


def test_merge_with_a_failed_verification_names_the_part(
    runs: Runs, registry: Registry, tmp_path: Path
) -> None:
    result = refused(registry, runs, tmp_path, edited("amd64", verification="failed"))
    assert result.stderr.startswith("error: part amd64.json: its verification failed")


def test_merge_with_one_arch_s_image_under_the_other_arch_names_it(
    runs: Runs, registry: Registry, tmp_path: Path
) -> None:
    amd64 = runs.parts["amd64"]["digest"]
    result = refused(registry, runs, tmp_path, edited("arm64", digest=amd64))
    assert result.stderr.startswith(f"error: part arm64: {amd64} is not this plan's arm64 image")


def test_merge_writes_the_index_of_both_parts_the_tag_the_template_and_the_state(
    runs: Runs, registry: Registry, test_env: dict, tmp_path: Path
) -> None:
    result = merge(registry, runs, runs.merge_dir, "--sign-key", str(KEYS / "cosign.key"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    path = path_of(runs.repository)
    assert tag_of(runs) in registry_tags(registry, path)
    with registry_get(registry, f"/v2/{path}/manifests/{tag_of(runs)}") as response:
        index_bytes = response.read()
    index = json.loads(index_bytes)
    by_arch = {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}
    assert by_arch == {arch: runs.parts[arch]["digest"] for arch in ("amd64", "arm64")}
    digest = "sha256:" + hashlib.sha256(index_bytes).hexdigest()
    assert f"image: {runs.repository}@{digest}" in runs.template.read_text()
    assert json.loads(runs.state.read_text())["image"] == f"{runs.repository}@{digest}"
    target = client_of(registry, runs.repository)
    for arch, image in by_arch.items():  # each part's SBOM, provenance and SOCI index
        kinds = {one.artifact_type for one in referrers(target, image)}
        assert {sbom.MEDIA_TYPE, provenance.MEDIA_TYPE, SOCI_INDEX} <= kinds, (arch, kinds)
    signed = {  # the tag and the index by the merge, each arch image by its part
        f"{runs.repository}:{tag_of(runs)}": digest,
        f"{runs.repository}@{digest}": digest,
        **{f"{runs.repository}@{image}": image for image in by_arch.values()},
    }
    for reference, subject in signed.items():
        claims = cosign_verify(registry, test_env, reference, tmp_path)
        assert claims[0]["critical"]["image"]["docker-manifest-digest"] == subject, reference


def cosign_verify(registry: Registry, test_env: dict, reference: str, home: Path) -> Any:
    """cosign's own check of `reference`'s signature with the public key, logged in through a
    Docker config of the test's own."""
    config = home / "docker-config"
    config.mkdir(exist_ok=True)
    auth = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    env = {**os.environ, "DOCKER_CONFIG": str(config), "HOME": str(home), "TUF_ROOT": str(home)}
    found = subprocess.run(
        [test_env["cosign"], "verify", "--key", str(KEYS / "cosign.pub"), reference,
         "--insecure-ignore-tlog", "--allow-insecure-registry", "--allow-http-registry"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    return json.loads(found.stdout)


def diff_ids(registry: Registry, repository: str, digest: str) -> list[str]:
    path = path_of(repository)
    with registry_get(registry, f"/v2/{path}/manifests/{digest}") as response:
        config = json.loads(response.read())["config"]["digest"]
    with registry_get(registry, f"/v2/{path}/blobs/{config}") as response:
        return list(json.loads(response.read())["rootfs"]["diff_ids"])


def test_the_parts_carry_the_extras_layers_a_one_job_run_pushes(
    runs: Runs, registry: Registry, shared_cache: Path, two_arch_base: str, tmp_path: Path
) -> None:
    """Issue 46's "same image either way": a one-job run of the same set on the same base
    (unverified: verification changes no byte) pushes, for each arch, the extras layers the
    part of that arch pushed, bytecode layers included."""
    repository = f"{registry.host}/{PREFIX}/one-job"
    (tmp_path / "requirements.txt").write_text("six\n")
    result = tool(
        registry, "-r", str(tmp_path / "requirements.txt"), "--base-image", two_arch_base,
        "--push", repository, "--no-verify", "--output", str(tmp_path / "context"),
        "--cache-dir", str(shared_cache), "--tag", f"{PREFIX}/one-job:test",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    one_job = json.loads((tmp_path / "context" / "report.json").read_text())["image"]["arches"]
    planned = json.loads((runs.plan / "plan.json").read_text())["layers"]
    for arch in ("amd64", "arm64"):
        extras = [layer["diff_id"] for layer in planned[arch]]
        assert len(extras) == 2  # the distribution's layer and its bytecode's
        split = diff_ids(registry, runs.repository, runs.parts[arch]["digest"])
        whole = diff_ids(registry, repository, one_job[arch]["digest"])
        assert split[-len(extras) :] == extras == whole[-len(extras) :], arch


def test_a_rerun_of_a_pushed_part_builds_nothing(runs: Runs, registry: Registry) -> None:
    again = runner(
        registry, "part", str(runs.runners["amd64"]), "--arch", "amd64",
        "--push", runs.repository,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr
    assert "already pushed: " + runs.parts["amd64"]["digest"] in again.stdout
    assert "building" not in again.stdout and "verifying" not in again.stdout


def test_a_part_that_fails_verification_records_it_pushes_nothing_and_merge_refuses(
    registry: Registry, shared_cache: Path, standin_index: str, tmp_path: Path, docker_client: Any
) -> None:
    """The stand-in base runs as root: its image fails the hardened verification for real."""
    (tmp_path / "requirements.txt").write_text("six\n")
    repository = f"{registry.host}/{PREFIX}/failing"
    plan = tmp_path / "plan"
    planned = tool(
        registry, "-r", str(tmp_path / "requirements.txt"), "--base-image", standin_index,
        "--arch", "amd64", "--push", repository, "--no-build", "--output", str(plan),
        "--cache-dir", str(shared_cache),
    )  # fmt: skip
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-2000:]
    failed = runner(
        registry, "part", str(plan), "--arch", "amd64", "--push", repository,
        "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr
    assert failed.stderr.startswith("error: part amd64: verification failed (")
    assert len(failed.stderr.strip().splitlines()) == 1
    record = json.loads((plan / "parts" / "amd64.json").read_text())
    assert record["verification"] == "failed" and record["digest"] is None
    assert registry_tags(registry, path_of(repository), referrers=True) == []  # nothing pushed
    merged = tool(registry, "merge", str(plan), "--push", repository)
    assert merged.returncode == 1
    assert merged.stderr == "error: part amd64.json: its verification failed\n"
    assert registry_tags(registry, path_of(repository), referrers=True) == []
    extras = json.loads((plan / "plan.json").read_text())["plan_id"]["extras_hash"]
    remove_tagged(docker_client, (f"sandbox-extension:x{extras}-",))
