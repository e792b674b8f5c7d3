"""The test machine itself: engine, stand-in base images (amd64 and, emulated, arm64), local
registry with htpasswd auth and the two-arch stand-in index in it.

These fail first when scripts/setup-env.sh is broken, so other failures can be read as product bugs.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import tarfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from support.registryhelp import registry_get, registry_tags

# Loopback only: never through an HTTP(S)_PROXY from the environment.
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

HARDENED = [
    "--read-only",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--user",
    "65532:65532",
    "--network",
    "none",
]


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)


@pytest.mark.usefixtures("docker_client")
def test_engine_answers(docker_client, test_env):
    assert docker_client.ping() is True
    # The CLI the project uses is Debian's, which builds with BuildKit without buildx.
    out = run([test_env["docker"], "version", "--format", "{{.Server.Version}}"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


@pytest.mark.usefixtures("docker_client")
def test_standin_base_runs_python_313_hardened(test_env):
    cmd = [test_env["docker"], "run", "--rm", *HARDENED, test_env["base_image"]]
    out = run([*cmd, "python3", "-c", "import sys; print(sys.version)"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("3.13."), out.stdout
    # The hardening really applies: uid 65532, root filesystem read-only.
    probe = "import os; open('/probe', 'w')"
    out = run([*cmd, "python3", "-c", f"import os; print(os.getuid(), os.getgid()); {probe}"])
    assert out.stdout.split() == ["65532", "65532"]
    assert out.returncode != 0
    assert "Read-only file system" in out.stderr or "Permission denied" in out.stderr


def _catalog(host: str, user: str | None = None, password: str = "") -> urllib.request.Request:
    req = urllib.request.Request(f"http://{host}/v2/_catalog")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    return req


@pytest.mark.usefixtures("registry")
def test_registry_requires_credentials(registry):
    assert registry[0].startswith("127.0.0.1:")
    host, user, password = registry
    with pytest.raises(urllib.error.HTTPError) as refused:
        NO_PROXY_OPENER.open(_catalog(host), timeout=10)
    assert refused.value.code == 401
    assert "Basic" in refused.value.headers.get("WWW-Authenticate", "")

    with pytest.raises(urllib.error.HTTPError) as refused:
        NO_PROXY_OPENER.open(_catalog(host, user, "not-the-password"), timeout=10)
    assert refused.value.code == 401

    with NO_PROXY_OPENER.open(_catalog(host, user, password), timeout=10) as resp:
        assert resp.status == 200
        assert "repositories" in json.load(resp)


@pytest.mark.usefixtures("docker_client")
@pytest.mark.usefixtures("registry")
def test_engine_pushes_to_local_registry(test_env, registry, tmp_path):
    """docker login + push over plain http to the loopback registry, the publish step's path."""
    docker = test_env["docker"]
    env = {**os.environ, "DOCKER_CONFIG": str(tmp_path / "docker-config")}  # keep ~/.docker clean
    repo = f"{registry.host}/bsi-infra-test"
    tag = f"{repo}:{uuid.uuid4().hex[:12]}"

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = tag.encode()
        info = tarfile.TarInfo("marker.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    imp = subprocess.run(
        [docker, "import", "-", tag], input=layer.getvalue(), capture_output=True, timeout=120
    )
    assert imp.returncode == 0, imp.stderr
    try:
        login = run(
            [docker, "login", "-u", registry.user, "--password-stdin", registry.host],
            input=registry.password,
            env=env,
        )
        assert login.returncode == 0, login.stderr
        out = run([docker, "push", tag], env=env)
        assert out.returncode == 0, out.stderr
        assert "digest: sha256:" in out.stdout

        # the tag itself, not the catalog: a registry that keeps every run's repositories pages it
        assert tag.rsplit(":", 1)[1] in registry_tags(registry, "bsi-infra-test")
    finally:
        run([docker, "rmi", tag], env=env)


# ---------------------------------------------------------------------------------------------
# arm64: emulation, the arm64 stand-in and the two-arch index in the local registry
# ---------------------------------------------------------------------------------------------
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
AARCH64_MAGIC = "7f454c460201010000000000000000000200b700"  # ELF64 LE, e_machine EM_AARCH64


def _binfmt_entries() -> list[dict[str, str]]:
    """Each registered binfmt_misc handler as {"name", "state", "magic", "flags", ...}."""
    entries = []
    for path in sorted(BINFMT_DIR.iterdir()):
        if path.name in {"register", "status"}:
            continue
        lines = path.read_text().splitlines()
        entry = {"name": path.name, "state": lines[0]}
        for line in lines[1:]:
            key, _, value = line.partition(" ")
            entry[key.rstrip(":")] = value
        entries.append(entry)
    return entries


def test_aarch64_emulator_registered_with_fix_binary(arm64_emulation: None) -> None:
    """Containers see no host paths: only an F handler runs arm64 binaries inside the engine."""
    assert (BINFMT_DIR / "status").read_text().strip() == "enabled"
    aarch64 = [e for e in _binfmt_entries() if e.get("magic") == AARCH64_MAGIC]
    assert aarch64, "no binfmt_misc handler for aarch64 ELF binaries"
    for entry in aarch64:
        assert entry["state"] == "enabled", entry
        assert "F" in entry.get("flags", ""), entry
        assert "qemu-aarch64" in Path(entry["interpreter"]).resolve().name, entry


@pytest.mark.usefixtures("docker_client")
def test_arm64_standin_is_arm64_and_runs_python_hardened(docker_client, test_env, arm64_standin):
    image = docker_client.images.get(test_env["base_image_arm64"])
    assert (image.attrs["Os"], image.attrs["Architecture"]) == ("linux", "arm64")
    # The same image config as the amd64 stand-in, so either can stand for the official index.
    amd64 = docker_client.images.get(test_env["base_image"]).attrs
    assert amd64["Architecture"] == "amd64"
    assert image.attrs["Config"]["Cmd"] == amd64["Config"]["Cmd"] == ["python3"]
    assert sorted(image.attrs["Config"]["Env"]) == sorted(amd64["Config"]["Env"])

    probe = "import os, platform, sys; print(platform.machine(), os.getuid(), sys.version[:5])"
    cmd = [test_env["docker"], "run", "--rm", *HARDENED, "--platform", "linux/arm64"]
    out = run([*cmd, test_env["base_image_arm64"], "python3", "-c", probe])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["aarch64", "65532", "3.13."], out.stdout


def _registry_json(registry, path: str) -> tuple[dict, str]:
    """GET /v2/<path> with the test credentials: (parsed body, Docker-Content-Digest)."""
    with registry_get(registry, f"/v2/{path}") as response:
        return json.load(response), response.headers["Docker-Content-Digest"]


@pytest.mark.usefixtures("registry")
def test_registry_index_names_amd64_and_arm64(registry, test_env, standin_index):
    host, _, rest = test_env["multiarch_base"].partition("/")
    assert host == registry.host
    name, tag = rest.rsplit(":", 1)
    index, digest = _registry_json(registry, f"{name}/manifests/{tag}")
    assert test_env["multiarch_base_index"] == f"{host}/{name}@{digest}"
    assert index["mediaType"] in {
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.index.v1+json",
    }
    platforms = {
        f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
        for m in index["manifests"]
    }
    assert sorted(platforms) == ["linux/amd64", "linux/arm64"]
    for arch, digest in platforms.items():
        arch = arch.split("/")[1]
        assert test_env[f"multiarch_base_{arch}"] == f"{host}/{name}@{digest}"
        # Each entry really is an image of its arch: its config says so.
        manifest, served = _registry_json(registry, f"{name}/manifests/{digest}")
        assert served == digest
        config, _ = _registry_json(registry, f"{name}/blobs/{manifest['config']['digest']}")
        assert (config["os"], config["architecture"]) == ("linux", arch)
