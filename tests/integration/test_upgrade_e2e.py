"""Publish and platform upgrade end to end: the real CLI, engine and htpasswd registry.

Three platform versions of the reference base are pushed to the local registry:

- `runtime:v1`  the reference image as is;
- `runtime:v2`  plus soupsieve in /app/deps, so extras `beautifulsoup4>=4.13` no longer install it;
- `runtime:v3-conflict`  plus beautifulsoup4==4.12.0 in /app/deps, contradicting the extras.

v2 and v3-conflict are then removed from the engine, as on a CI runner that has never seen a new
platform version: `rebuild` has to pull them, which needs a `docker login` (a Docker config);
BSI_REGISTRY_USER/BSI_REGISTRY_PASSWORD are push credentials only. The first build pushes with
the environment credentials and an empty Docker config, the rebuild with the Docker config only.

Order: the module fixture `first_build` performs the first build (test 1 checks it); the rebuild
to v2 is one test with its steps (check, rebuild, check again); the conflict and the
no-credentials tests compare bytes before and after, so they hold at v1 or v2 alike.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import pytest
from support.bases import derived_base, newest_pure_wheel, patched_base
from support.images import docker_login, local_images, remove_images, template_image
from support.registryhelp import (
    CREDENTIAL_VARS,
    blob_status,
    push,
    registry_get,
    registry_tags,
    served_digest,
)

from builder.cache import Cache

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
EXAMPLE_IMAGE = "registry.example.com/platform/python-sandbox:3.13-slim-trixie-x000000000000"
DIGEST = r"sha256:[0-9a-f]{64}"
CLI_TIMEOUT = 600
CONFLICT_PIN = "4.12.0"  # beautifulsoup4 in runtime:v3-conflict; the extras want >=4.13


# --- the CLI ------------------------------------------------------------------------------------


@dataclass
class World:
    registry: object
    namespace: str  # bsi-e2e-<run>: repositories live under it, unique per test run
    runtime: str  # host/namespace/runtime, the platform's base repository
    sandbox: str  # host/namespace/sandbox, where the extension images go
    base_digests: dict[str, str]  # platform version -> digest of the pushed base
    workdir: Path  # the config, requirements, template, warm pool, state and context
    cache: Path
    no_login: Path  # an empty DOCKER_CONFIG: no stored credentials at all
    logged_in: Path  # a DOCKER_CONFIG written by `docker login` to the test registry
    docker_host: str

    @property
    def config(self) -> Path:
        return self.workdir / "cfg.toml"

    @property
    def template(self) -> Path:
        return self.workdir / "sandbox-template.yaml"

    @property
    def state(self) -> Path:
        return self.workdir / "cfg.state.json"

    def repo(self, repository: str) -> str:
        """The registry's name for `repository` (without the host)."""
        return repository.split("/", 1)[1]

    def env(self, *, docker_config: Path, env_credentials: bool) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS}
        env |= {"DOCKER_CONFIG": str(docker_config), "DOCKER_HOST": self.docker_host}
        if env_credentials:
            env |= {
                "BSI_REGISTRY_USER": self.registry.user,
                "BSI_REGISTRY_PASSWORD": self.registry.password,
            }
        return env

    def run(
        self, *args: str, docker_config: Path | None = None, env_credentials: bool = False
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "builder", *args, "--cache-dir", str(self.cache)]
        return subprocess.run(
            command,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            env=self.env(
                docker_config=docker_config or self.logged_in, env_credentials=env_credentials
            ),
        )


def explain(result: subprocess.CompletedProcess[str]) -> str:
    tail = "\n".join(result.stderr.splitlines()[-25:])
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr (tail)\n{tail}"


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def snapshot(*paths: Path) -> dict[Path, bytes | None]:
    return {path: path.read_bytes() if path.exists() else None for path in paths}


def pushed_reference(stdout: str, repository: str) -> str:
    found = re.findall(rf"^pushed: ({re.escape(repository)}@{DIGEST})$", stdout, re.M)
    assert len(found) == 1, stdout
    return found[0]


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(reference_image, docker_client, registry, test_env, tmp_path_factory, shared_cache):
    """The three platform versions in the registry, a pipeline directory and the Docker configs."""
    namespace = f"bsi-e2e-{uuid.uuid4().hex[:8]}"
    try:
        yield make_world(
            namespace,
            reference_image,
            docker_client,
            registry,
            test_env,
            tmp_path_factory,
            shared_cache,
        )
    finally:
        remove_images(docker_client, namespace)


def make_world(
    namespace, reference_image, docker_client, registry, test_env, tmp_path_factory, cache_dir
) -> World:
    runtime = f"{registry.host}/{namespace}/runtime"
    cache = Cache(cache_dir)
    scratch = tmp_path_factory.mktemp("e2e-bases")

    logged_in = docker_login(test_env, registry, tmp_path_factory.mktemp("docker-config-login"))

    docker_client.api.tag(reference_image, runtime, "v1")
    derived_base(reference_image, newest_pure_wheel(cache, "soupsieve"), f"{runtime}:v2", scratch)
    derived_base(
        reference_image,
        newest_pure_wheel(cache, "beautifulsoup4", CONFLICT_PIN),
        f"{runtime}:v3-conflict",
        scratch,
    )
    patched_base(f"{runtime}:v2", f"{runtime}:v2.1", scratch)
    digests = {
        version: push(docker_client, registry, f"{runtime}:{version}")
        for version in ("v1", "v2", "v2.1", "v3-conflict")
    }
    # A runner that never saw the new platform versions: rebuild must pull them.
    for version in ("v2", "v2.1", "v3-conflict"):
        docker_client.images.remove(f"{runtime}:{version}")

    workdir = tmp_path_factory.mktemp("pipeline")
    (workdir / "requirements.txt").write_text("beautifulsoup4>=4.13\n")
    shutil.copy(EXAMPLES / "sandbox-template.yaml", workdir / "sandbox-template.yaml")
    shutil.copy(EXAMPLES / "sandbox-warmpool.yaml", workdir / "sandbox-warmpool.yaml")
    world = World(
        registry=registry,
        namespace=namespace,
        runtime=runtime,
        sandbox=f"{registry.host}/{namespace}/sandbox",
        base_digests=digests,
        workdir=workdir,
        cache=cache_dir,
        no_login=tmp_path_factory.mktemp("docker-config-empty"),
        logged_in=logged_in,
        docker_host=test_env["docker_host"],
    )
    world.config.write_text(
        "# e2e pipeline config\n"
        'requirements = ["requirements.txt"]\n'
        f'base-repository = "{runtime}"\n'
        'platform-version = "v1"   # bumped by rebuild\n'
        'architectures = ["amd64"]\n'
        f'repository = "{world.sandbox}"\n'
        'template = "sandbox-template.yaml"\n'
        'warm-pools = ["sandbox-warmpool.yaml"]\n'
    )
    return world


@dataclass
class FirstBuild:
    original_template: bytes
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def first_build(world: World) -> FirstBuild:
    """`build-sandbox-image --config cfg.toml`, pushing with the environment's credentials."""
    original = world.template.read_bytes()
    result = world.run(
        "--config", str(world.config), docker_config=world.no_login, env_credentials=True
    )
    return FirstBuild(original, result)


# --- tests --------------------------------------------------------------------------------------


def test_first_build_pushes_by_digest_and_points_the_template(world: World, first_build) -> None:
    result = first_build.result
    assert result.returncode == 0, explain(result)
    reference = pushed_reference(result.stdout, world.sandbox)
    digest = reference.split("@", 1)[1]

    (tag,) = registry_tags(world.registry, world.repo(world.sandbox))
    assert re.fullmatch(r"v1-x[0-9a-f]{12}", tag)
    assert served_digest(world.registry, world.repo(world.sandbox), tag) == digest

    assert template_image(world.template) == reference
    original = first_build.original_template.decode()
    assert original.count(EXAMPLE_IMAGE) == 1
    assert world.template.read_text() == original.replace(EXAMPLE_IMAGE, reference)

    state = json.loads(world.state.read_text())
    assert state["platform_version"] == "v1"
    assert state["base_digest"] == world.base_digests["v1"]
    assert state["image"] == reference
    assert set(state["packages"]["amd64"]) == {"beautifulsoup4", "soupsieve"}
    report = json.loads((world.workdir / "sandbox-image" / "report.json").read_text())
    assert report["image"]["pushed"] == reference
    assert report["image"]["push_seconds"] > 0
    assert set(report["image"]["arches"]["amd64"]["seconds"]) == {
        "build",
        "preload",
        "load",
        "facts",
        "verify",
    }

    assert f"template python-sandbox: {EXAMPLE_IMAGE} -> {reference}" in result.stdout
    assert "kubectl apply -f" in result.stdout
    assert re.search(
        r"SandboxWarmPool python-sandbox-pool .* OnReplenish .*Recreate", result.stdout
    )


def test_rebuild_to_a_new_platform_version(world: World, first_build) -> None:
    assert first_build.result.returncode == 0, "the first build failed"
    sandbox_repo = world.repo(world.sandbox)
    old_reference = json.loads(world.state.read_text())["image"]
    old_soupsieve = json.loads(world.state.read_text())["packages"]["amd64"]["soupsieve"]
    tags_before = registry_tags(world.registry, sandbox_repo)
    config_before = world.config.read_text()
    before = snapshot(world.template, world.state, world.config)
    expected = [
        "platform version: v1 -> v2",
        f"base digest: {world.base_digests['v1']} -> {world.base_digests['v2']}",
        f"amd64: soupsieve {old_soupsieve} removed",
    ]

    # --check: a rebuild is needed (exit 3), and what would change; nothing is touched.
    # v2 is not on the engine: the probe pulls it with the environment's credentials alone.
    check = world.run(
        "rebuild", "--config", str(world.config), "--platform-version", "v2", "--check",
        docker_config=world.no_login, env_credentials=True,
    )  # fmt: skip
    assert check.returncode == 3, explain(check)
    assert "changes since the last build:" in check.stdout
    for line in expected:
        assert f"  {line}\n" in check.stdout, check.stdout
    assert "  amd64: beautifulsoup4" not in check.stdout  # the same version on either base
    assert snapshot(world.template, world.state, world.config) == before
    assert registry_tags(world.registry, sandbox_repo) == tags_before

    # The rebuild: the same diff, a new digest pushed, the template, state and config follow.
    rebuild = world.run("rebuild", "--config", str(world.config), "--platform-version", "v2")
    assert rebuild.returncode == 0, explain(rebuild)
    assert "upgrade path: build (the resolution changed)" in rebuild.stderr + rebuild.stdout
    for line in expected:
        assert f"  {line}\n" in rebuild.stdout, rebuild.stdout
    reference = pushed_reference(rebuild.stdout, world.sandbox)
    assert reference != old_reference
    tags = registry_tags(world.registry, sandbox_repo)
    (new_tag,) = set(tags) - set(tags_before)
    assert re.fullmatch(r"v2-x[0-9a-f]{12}", new_tag)
    assert served_digest(world.registry, sandbox_repo, new_tag) == reference.split("@", 1)[1]
    assert template_image(world.template) == reference
    assert f"-> {reference}" in rebuild.stdout
    assert world.config.read_text() == config_before.replace(
        'platform-version = "v1"', 'platform-version = "v2"'
    )
    state = json.loads(world.state.read_text())
    assert state["platform_version"] == "v2"
    assert state["base_digest"] == world.base_digests["v2"]
    assert state["image"] == reference
    assert "soupsieve" not in state["packages"]["amd64"]

    # --check again: up to date.
    again = world.run(
        "rebuild", "--config", str(world.config), "--platform-version", "v2", "--check"
    )
    assert again.returncode == 0, explain(again)
    assert "no changes: up to date" in again.stdout


def test_a_base_that_contradicts_the_extras_fails_before_building(
    world: World, first_build
) -> None:
    assert first_build.result.returncode == 0, "the first build failed"
    sandbox_repo = world.repo(world.sandbox)
    tags_before = registry_tags(world.registry, sandbox_repo)
    report = world.workdir / "sandbox-image" / "report.json"
    before = snapshot(world.template, world.state, world.config, report)
    args = ("rebuild", "--config", str(world.config), "--platform-version", "v3-conflict")

    for extra in (("--check",), ()):
        result = world.run(*args, *extra)
        assert result.returncode == 1, explain(result)
        assert len(result.stderr.strip().splitlines()) == 1, explain(result)
        message = result.stderr.strip()
        assert message.startswith("error: "), message
        assert "beautifulsoup4>=4.13" in message, message
        assert f"beautifulsoup4=={CONFLICT_PIN}" in message, message
        assert f"{world.runtime}:v3-conflict" in message, message
        assert "building" not in result.stdout and "pushed:" not in result.stdout

    assert registry_tags(world.registry, sandbox_repo) == tags_before
    assert snapshot(world.template, world.state, world.config, report) == before


def test_push_without_credentials_fails_cleanly(
    world: World, first_build, docker_client: docker.DockerClient
) -> None:
    assert first_build.result.returncode == 0, "the first build failed"
    target = f"{world.sandbox}-noauth"
    before = snapshot(world.template, world.state, world.config)
    # The image this config builds is the one last pushed (same base, same extras): its blobs.
    pushed = json.loads(world.state.read_text())["image"]
    with registry_get(
        world.registry, f"/v2/{world.repo(world.sandbox)}/manifests/{pushed.split('@')[1]}"
    ) as response:
        manifest = json.load(response)
    blobs = [manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])]

    result = world.run(
        "--config", str(world.config), "--push", target, docker_config=world.no_login
    )

    assert result.returncode == 1, explain(result)
    errors = error_lines(result)
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), explain(result)
    assert "refused access" in errors[0] and f"docker login {world.registry.host}" in errors[0]
    assert "BSI_REGISTRY_USER" in errors[0]
    assert "pushed:" not in result.stdout
    assert registry_tags(world.registry, world.repo(target)) == []  # nothing half-pushed:
    for blob in blobs:  # not even a layer (each is there in the repository pushed before)
        assert blob_status(world.registry, world.repo(world.sandbox), blob) == 200, blob
        assert blob_status(world.registry, world.repo(target), blob) == 404, blob
    assert not [
        t for _, tags in local_images(docker_client) for t in tags if t.startswith(f"{target}:")
    ]
    assert snapshot(world.template, world.state, world.config) == before


def layers_of(world: World, reference: str) -> list[str]:
    repo, digest = reference.split("@", 1)
    with registry_get(world.registry, f"/v2/{world.repo(repo)}/manifests/{digest}") as response:
        return [layer["digest"] for layer in json.load(response)["layers"]]


def test_rebuild_with_unchanged_extras_rebases(world: World, first_build, docker_client) -> None:
    """v2 -> v2.1 (one small base layer): every extras layer is reused by digest."""
    assert first_build.result.returncode == 0, "the first build failed"
    state = json.loads(world.state.read_text())
    if state["platform_version"] != "v2":  # on its own: get to v2 first (a full build)
        moved = world.run("rebuild", "--config", str(world.config), "--platform-version", "v2")
        assert moved.returncode == 0, explain(moved)
        state = json.loads(world.state.read_text())
    old_reference = state["image"]
    old_layers = layers_of(world, old_reference)

    result = world.run("rebuild", "--config", str(world.config), "--platform-version", "v2.1")
    assert result.returncode == 0, explain(result)
    assert "upgrade path: rebase (the resolution is unchanged)" in result.stderr + result.stdout
    assert "building" not in result.stdout
    assert "loaded from local blobs" in result.stdout and "pulling" not in result.stdout
    reference = pushed_reference(result.stdout, world.sandbox)
    assert reference != old_reference
    new_layers = layers_of(world, reference)
    extras = len(old_layers) - len(layers_of(world, f"{world.runtime}@{world.base_digests['v2']}"))
    assert extras >= 1
    assert new_layers[-extras:] == old_layers[-extras:]  # the extras layers, byte for byte
    assert len(new_layers) == len(old_layers) + 1  # the base's one new layer
    base = f"{world.runtime}@{world.base_digests['v2.1']}"
    assert layers_of(world, base) == new_layers[:-extras]
    assert template_image(world.template) == reference
    repo, digest = reference.split("@", 1)
    path = f"/v2/{world.repo(repo)}/manifests/{digest}"
    with registry_get(world.registry, path) as response:
        config_digest = json.load(response)["config"]["digest"]
    assert docker_client.images.get(config_digest).id == config_digest  # verified: that config
    state = json.loads(world.state.read_text())
    assert (state["image"], state["path"], state["platform_version"]) == (
        reference,
        "rebase",
        "v2.1",
    )
    # the rebase's template update warns of the warm pool exactly as the first build's did
    warning = re.compile(r"^.*SandboxWarmPool python-sandbox-pool .*$", re.M)
    assert warning.findall(result.stdout) == warning.findall(first_build.result.stdout) != []
    report = json.loads((world.workdir / "sandbox-image" / "report.json").read_text())
    assert report["image"]["path"] == "rebase" and report["image"]["verification"]["passed"]
    assert set(report["image"]["seconds"]) == {"rebase", "facts", "verify"}
    assert 0 < report["image"]["bytes_pushed"] < 0.05 * report["image"]["image_size"]
    tags = registry_tags(world.registry, world.repo(world.sandbox))
    assert any(re.fullmatch(r"v2\.1-x[0-9a-f]{12}", tag) for tag in tags), tags
