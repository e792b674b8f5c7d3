"""amd64 + arm64 for real: the two-arch stand-in, a two-arch reference base, one index pushed.

Emulated arm64 steps take minutes, so the module builds the two-arch reference base once and the
lightgbm extension once (module fixtures); the failure cases fail before any emulated RUN step
(resolution) or build only `COPY` steps for arm64 (a pure-Python wheel), then verify under qemu.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.machine import Registry
from support.registryhelp import registry_get, registry_tags
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:8]
HARDENED = [
    "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
    "--user", "65532:65532", "--network", "none", "--tmpfs", "/tmp",
]  # fmt: skip
TEMPLATE = """\
# the platform's sandbox template
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: python-multiarch
spec:
  podTemplate:
    spec:
      containers:
        - name: sandbox
          image: registry.example.com/old@sha256:{old}  # replaced by the tool
"""


def credentials_env(registry: Registry) -> dict[str, str]:
    return {
        **os.environ,
        "BSI_REGISTRY_USER": registry.user,
        "BSI_REGISTRY_PASSWORD": registry.password,
    }


def tool(registry: Registry, *args: str, timeout: int = 2400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=credentials_env(registry),
        timeout=timeout,
    )


def docker(test_env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [test_env["docker"], *args], capture_output=True, text=True, check=check, timeout=900
    )


@pytest.fixture(scope="module")
def cache_dir(shared_cache: Path) -> Path:
    """The session's warm cache (conftest): no test here is about a cold one."""
    return shared_cache


def build(
    registry: Registry, tmp_path: Path, cache_dir: Path, base: str, requirements: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    req = tmp_path / "requirements.txt"
    req.write_text(requirements)
    return tool(
        registry, "-r", str(req), "--base-image", base, "--output", str(tmp_path / "context"),
        "--cache-dir", str(cache_dir), *extra,
    )  # fmt: skip


class Lightgbm:
    def __init__(self, repository: str, result: subprocess.CompletedProcess[str], context: Path,
                 template: Path, old_template: str) -> None:  # fmt: skip
        self.repository = repository
        self.result = result
        self.report = json.loads((context / "report.json").read_text())
        self.dockerfile = (context / "Dockerfile").read_text()
        self.template = template
        self.old_template = old_template


@pytest.fixture(scope="module")
def lightgbm(
    tmp_path_factory: pytest.TempPathFactory,
    registry: Registry,
    cache_dir: Path,
    two_arch_base: str,
) -> Lightgbm:
    """lightgbm built for both arches (the default: the base offers both), pushed as an index."""
    tmp_path = tmp_path_factory.mktemp("lightgbm")
    repository = f"{registry.host}/bsi-multi-{RUN}/lightgbm"
    template = tmp_path / "template.yaml"
    old = TEMPLATE.format(old="0" * 64)
    template.write_text(old)
    result = build(
        registry, tmp_path, cache_dir, two_arch_base, "lightgbm\n",
        "--tag", f"bsi-multi-{RUN}/lightgbm:test", "--push", repository,
        "--template", str(template),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return Lightgbm(repository, result, tmp_path / "context", template, old)


def test_index_lists_both_platforms_and_tags_name_it(
    lightgbm: Lightgbm, registry: Registry
) -> None:
    image = lightgbm.report["image"]
    path = lightgbm.repository.split("/", 1)[1]
    tags = registry_tags(registry, path)
    assert [f"{lightgbm.repository}:{t}" for t in tags] == image["tags"]
    with registry_get(registry, f"/v2/{path}/manifests/{tags[0]}") as response:
        body = response.read()
        served = response.headers["Docker-Content-Digest"]
    index = json.loads(body)
    assert served == image["index"] == f"sha256:{hashlib.sha256(body).hexdigest()}"
    assert index["mediaType"] == "application/vnd.docker.distribution.manifest.list.v2+json"
    platforms = {
        (m["platform"]["os"], m["platform"]["architecture"]): m for m in index["manifests"]
    }
    assert set(platforms) == {("linux", "amd64"), ("linux", "arm64")}
    for arch in ("amd64", "arm64"):
        assert platforms[("linux", arch)]["digest"] == image["arches"][arch]["digest"]
        assert image["arches"][arch]["verification"]["passed"] is True
    assert image["pushed"] == f"{lightgbm.repository}@{image['index']}"


def test_template_names_the_index_by_digest(lightgbm: Lightgbm) -> None:
    text = lightgbm.template.read_text()
    reference = lightgbm.report["image"]["pushed"]
    assert f"image: {reference}  # replaced by the tool" in text
    assert text.startswith("# the platform's sandbox template\n")


def test_verification_table_names_the_arch_of_each_line(lightgbm: Lightgbm) -> None:
    out = lightgbm.result.stdout
    assert "PASS  [amd64] import lightgbm" in out
    assert "PASS  [arm64] import lightgbm" in out
    assert "FAIL" not in out


def test_libgomp1_in_both_apt_sets(lightgbm: Lightgbm) -> None:
    arches = lightgbm.report["architectures"]
    assert "libgomp1" in arches["amd64"]["apt_packages"]
    assert "libgomp1" in arches["arm64"]["apt_packages"]


def test_each_arch_ends_with_its_own_reproducible_layer_and_carries_the_labels(
    lightgbm: Lightgbm, registry: Registry, two_arch_base: str
) -> None:
    """The pushed top layers are the blobs the tool wrote, one per distribution; labels
    everywhere."""
    assert "FROM extras-${TARGETARCH}" in lightgbm.dockerfile
    assert "ADD deps-extra-arm64-01.tar /" in lightgbm.dockerfile
    image = lightgbm.report["image"]
    path = lightgbm.repository.split("/", 1)[1]
    with registry_get(registry, f"/v2/{path}/manifests/{image['index']}") as response:
        annotations = json.loads(response.read())["annotations"]
    base_name = two_arch_base.rsplit(":", 1)[0]
    assert annotations["org.opencontainers.image.base.name"].startswith(base_name)
    assert annotations["org.opencontainers.image.base.digest"].startswith("sha256:")
    assert annotations["org.opencontainers.image.version"] == image["tags"][0].rsplit(":", 1)[1]
    layers = {}
    for arch in ("amd64", "arm64"):
        arch_record = image["arches"][arch]
        with registry_get(registry, f"/v2/{path}/manifests/{arch_record['digest']}") as response:
            manifest = json.loads(response.read())
        stack = arch_record["extras_layers"]
        assert "lightgbm" in {name for one in stack for name in one["distributions"]}
        pushed = [layer["digest"] for layer in manifest["layers"][-len(stack) :]]
        assert pushed == [one["digest"] for one in stack]
        kinds = [one["kind"] for one in stack]  # distribution layers, then their bytecode above
        assert kinds == ["distribution"] * kinds.count("distribution") + ["bytecode"] * (
            len(kinds) - kinds.count("distribution")
        )
        assert "bytecode" in kinds, "a CLI build compiles the extras by default"
        layers[arch] = next(one["digest"] for one in stack if one["distributions"] == ["lightgbm"])
        with registry_get(registry, f"/v2/{path}/blobs/{manifest['config']['digest']}") as response:
            labels = json.loads(response.read())["config"]["Labels"]
        assert {k: labels[k] for k in annotations} == annotations
    assert layers["amd64"] != layers["arm64"]
    # only the system stage (apt) runs arm64 code under BuildKit
    assert "[arm64] #" in lightgbm.result.stdout


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_each_arch_by_digest_runs_hardened_and_imports_lightgbm(
    lightgbm: Lightgbm,
    arch: str,
    test_env: dict,
    registry: Registry,
    docker_client: Any,
) -> None:
    reference = f"{lightgbm.repository}@{lightgbm.report['image']['arches'][arch]['digest']}"
    auth = {"username": registry.user, "password": registry.password}
    docker_client.images.pull(reference, auth_config=auth)
    code = (
        "import os, platform, lightgbm\n"
        "caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]\n"
        "try:\n    open('/etc/bsi-probe', 'w')\n    ro = 'writable'\n"
        "except OSError:\n    ro = 'read-only'\n"
        "print(platform.machine(), os.getuid(), caps, ro, lightgbm.__file__)\n"
    )
    result = docker(
        test_env, "run", "--rm", "--platform", f"linux/{arch}", *HARDENED,
        "--entrypoint", "python3", reference, "-c", code, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    machine = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
    assert result.stdout.split() == [
        machine, "65532", "0000000000000000", "read-only", "/app/deps-extra/lightgbm/__init__.py",
    ]  # fmt: skip


def test_x86_64_only_wheels_asked_for_arm64_fail_naming_both(
    tmp_path: Path,
    registry: Registry,
    cache_dir: Path,
    standin_index: str,
) -> None:
    repository = f"{registry.host}/bsi-multi-{RUN}/mkl"
    result = build(
        registry, tmp_path, cache_dir, standin_index, "mkl\n",
        "--arch", "amd64", "--arch", "arm64", "--push", repository,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "mkl" in error and "arm64" in error
    assert registry_tags(registry, repository.split("/", 1)[1]) == []


def test_an_arch_the_base_lacks_is_refused(
    tmp_path: Path, registry: Registry, cache_dir: Path, standin_index: str
) -> None:
    amd64_only = standin_index + "-amd64"
    result = build(
        registry, tmp_path, cache_dir, amd64_only, "six\n", "--arch", "arm64", "--no-build"
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: base image {amd64_only} has no linux/arm64 variant (it offers linux/amd64)"
    )


def test_base_with_several_arches_needs_a_registry_tag(registry: Registry) -> None:
    result = tool(registry, "base", "--tag", "local-only:1", "--arch", "amd64", "--arch", "arm64")
    assert result.returncode == 1
    assert "needs a registry reference" in result.stderr and "local-only:1" in result.stderr


@pytest.fixture
def arm_probe_index(tmp_path: Path) -> Iterator[str]:
    """An index whose one library imports on x86_64 only: its arm64 'variant lacks a library'."""
    wheel = make_wheel(
        tmp_path / "wheels", "bsi-arm-probe", "1.0", "py3-none-any",
        {"bsi_arm_probe/__init__.py": (
            b"import platform\n"
            b"if platform.machine() == 'aarch64':\n"
            b"    raise ImportError('libbsiprobe.so.1: cannot open shared object file')\n"
        )},
    )  # fmt: skip
    with serve_wheel(wheel, "bsi-arm-probe") as port:
        yield f"http://127.0.0.1:{port}/simple"


def test_arm64_only_verification_failure_pushes_nothing(
    tmp_path: Path,
    registry: Registry,
    cache_dir: Path,
    two_arch_base: str,
    arm_probe_index: str,
) -> None:
    repository = f"{registry.host}/bsi-multi-{RUN}/armfail"
    template = tmp_path / "template.yaml"
    template.write_text(TEMPLATE.format(old="1" * 64))
    before = template.read_bytes()
    result = build(
        registry, tmp_path, cache_dir, two_arch_base,
        f"--extra-index-url {arm_probe_index}\nbsi-arm-probe\n",
        "--tag", f"bsi-multi-{RUN}/armfail:test", "--push", repository,
        "--template", str(template),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert "PASS  [amd64] import bsi_arm_probe" in result.stdout
    assert "FAIL  [arm64] import bsi_arm_probe" in result.stdout
    assert "[arm64] import bsi_arm_probe" in result.stderr
    assert registry_tags(registry, repository.split("/", 1)[1]) == []
    assert template.read_bytes() == before
    report = json.loads((tmp_path / "context" / "report.json").read_text())["image"]
    assert "pushed" not in report and "index" not in report
    assert report["arches"]["amd64"]["verification"]["passed"] is True
    assert report["arches"]["arm64"]["verification"]["passed"] is False
