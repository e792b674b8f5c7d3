"""A fleet signs each template with its own config's key: the real `rebuild`, the real cosign.

Two configs on the reference base pushed as `runtime:v1`, each with a `sign-key` of its own
made by `cosign generate-key-pair`: `good`'s passphrase is the one in COSIGN_PASSWORD, `bad`'s
is another. `rebuild --config good --config bad` builds `good` (one cheap build: `six`, no
bytecode), signs and attests what it pushes and points its template; `bad` fails on its key
alone, before anything of it is planned: nothing pushed, its template untouched. cosign
accepts `good`'s image with `good`'s key and refuses it with `bad`'s.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from support.images import remove_images
from support.registryhelp import CREDENTIAL_VARS, mount_image, registry_tags

pytestmark = pytest.mark.usefixtures("package_index")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PASSPHRASE = "bsi-fleet-passphrase"
DIGEST = r"sha256:[0-9a-f]{64}"


def generate(cosign: str, where: Path, passphrase: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        [cosign, "generate-key-pair"],
        cwd=where,
        env={**os.environ, "COSIGN_PASSWORD": passphrase},
        capture_output=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr


def write_configs(tmp_path: Path, cosign: str, runtime: str, repositories: str) -> None:
    """`good` and `bad`, each a config of one cheap build with a key of its own: `good`'s
    passphrase is PASSPHRASE (the one the run is given), `bad`'s another."""
    for name, passphrase in (("good", PASSPHRASE), ("bad", "another-passphrase")):
        here = tmp_path / name
        generate(cosign, here, passphrase)
        (here / "requirements.txt").write_text("six\n")
        shutil.copy(EXAMPLES / "sandbox-template.yaml", here / "sandbox-template.yaml")
        (here / "cfg.toml").write_text(
            'requirements = ["requirements.txt"]\n'
            f'base-repository = "{runtime}"\n'
            'platform-version = "v0"\n'
            'architectures = ["amd64"]\n'
            f'repository = "{repositories}/sandbox-{name}"\n'
            'template = "sandbox-template.yaml"\n'
            "bytecode = false\n"
            'sign-key = "cosign.key"\n'
        )


def rebuild_env(tmp_path: Path, registry: Any, docker_host: str) -> dict[str, str]:
    """The run's environment: the registry's login in a Docker config of its own (none in
    BSI_ variables), and the passphrase only in COSIGN_PASSWORD."""
    config = tmp_path / "docker-config"
    config.mkdir()
    auth = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS}
    env |= {"DOCKER_CONFIG": str(config), "DOCKER_HOST": docker_host, "COSIGN_PASSWORD": PASSPHRASE}
    env.pop("BSI_SIGN_PASSWORD", None)
    return env


def assert_no_secret_written(good: Path) -> None:
    """Neither the passphrase nor the key reaches the state, report.json or the context."""
    key_lines = (good / "cosign.key").read_bytes().splitlines()[1:-1]
    written = [good / "cfg.state.json", good / "sandbox-template.yaml"]
    written += [p for p in (good / "sandbox-image").rglob("*") if p.is_file()]
    assert good / "sandbox-image" / "report.json" in written
    for path in written:
        data = path.read_bytes()
        assert PASSPHRASE.encode() not in data, path
        assert not any(line in data for line in key_lines), path


def assert_cosign_verdicts(
    cosign: str, tmp_path: Path, env: dict[str, str], reference: str
) -> None:
    """cosign accepts the signature and the attestation with `good`'s key, refuses them with
    `bad`'s."""
    flags = ["--insecure-ignore-tlog", "--allow-insecure-registry", "--allow-http-registry"]
    for name, passes in (("good", True), ("bad", False)):
        public = str(tmp_path / name / "cosign.pub")
        for check in (["verify"], ["verify-attestation", "--type", "slsaprovenance1"]):
            checked = subprocess.run(
                [cosign, *check, "--key", public, *flags, reference],
                env={**env, "HOME": str(tmp_path)},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert (checked.returncode == 0) is passes, (name, check, checked.stderr)


def test_a_fleet_signs_each_template_with_its_own_key(
    pushed_reference: str,
    docker_client: docker.DockerClient,
    registry: Any,
    test_env: dict,
    tmp_path: Path,
) -> None:
    cosign = test_env["cosign"]
    namespace = f"bsi-sign-fleet-{uuid.uuid4().hex[:8]}"
    runtime = f"{registry.host}/{namespace}/runtime"
    try:
        mount_image(registry, pushed_reference, f"{runtime}:v1")
        write_configs(tmp_path, cosign, runtime, f"{registry.host}/{namespace}")
        untouched = (tmp_path / "bad" / "sandbox-template.yaml").read_bytes()
        env = rebuild_env(tmp_path, registry, test_env["docker_host"])
        args = ["--config", "good/cfg.toml", "--config", "bad/cfg.toml", "--platform-version", "v1"]
        found = subprocess.run(
            [sys.executable, "-m", "builder", "rebuild", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert found.returncode == 1, found.stdout + found.stderr
        assert re.search(r"bad/cfg\.toml\s+failed\s+.*cosign\.key: wrong passphrase", found.stdout)
        pushed = re.search(
            rf"good/cfg\.toml\s+build\s+({re.escape(registry.host)}/\S+@{DIGEST})", found.stdout
        )
        assert pushed, found.stdout
        assert PASSPHRASE not in found.stdout + found.stderr
        assert (tmp_path / "bad" / "sandbox-template.yaml").read_bytes() == untouched
        assert registry_tags(registry, f"{namespace}/sandbox-bad") == []
        reference = pushed.group(1)
        assert reference in (tmp_path / "good" / "sandbox-template.yaml").read_text()
        assert_no_secret_written(tmp_path / "good")
        assert_cosign_verdicts(cosign, tmp_path, env, reference)
    finally:
        remove_images(docker_client, namespace)
