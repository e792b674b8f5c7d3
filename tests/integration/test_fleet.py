"""Fleet rebuilds end to end: three templates onto new platform versions in one run.

Three configs (a, b, c: `six` shared, one distribution of their own each) in directories of
their own, each pushing to its own repository and pointing its own template. The platform's
base: `runtime:v1` (the reference image), `v2` and `v3` (each one small layer above the one
before: the rebase path). In order:

1. `rebuild --config a --config b --config c --platform-version v1`: nothing recorded yet, so
   each takes the build path; three pushed digests, three templates pointed.
2. `--check` onto v2: exit 3 naming the three; nothing touched.
3. onto v2 (in this process, to count the probes): every template rebased and pointed, the
   configs name v2, the new base probed once for the three.
4. c's requirements name a distribution no index has; onto v3: a and b rebased, c failed,
   exit 1, the table and the error line name c, and c's config, state and template are as
   they were.
5. `--shard 1/2` and `--shard 2/2` onto v3, as two CI jobs: a and c in the first slice, b in
   the second, each job's table printed and written as JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.bases import patched_base
from support.images import docker_login, remove_images, template_image
from support.registryhelp import CREDENTIAL_VARS, push, registry_tags

import builder.base.discover
from builder.cli.app import main
from builder.oci.name import ImageRef

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEMPLATES = {"a": "idna", "b": "attrs", "c": "iniconfig"}  # each with six, shared
CONFIGS = [f"{name}/cfg.toml" for name in TEMPLATES]
MISSING = "bsi-h2-no-such-distribution-anywhere"
CLI_TIMEOUT = 600
DIGEST = r"sha256:[0-9a-f]{64}"


@dataclass
class Fleet:
    workdir: Path
    registry: Any
    runtime: str
    sandbox: Callable[[str], str]  # template name -> its repository
    env: dict[str, str]
    cache: Path

    def files(self, name: str) -> tuple[Path, Path, Path]:
        """The config, state and template of one template."""
        here = self.workdir / name
        return here / "cfg.toml", here / "cfg.state.json", here / "sandbox-template.yaml"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [
            sys.executable,
            "-m",
            "builder",
            "rebuild",
            *args,
            "--cache-dir",
            str(self.cache),
        ]
        return subprocess.run(
            command,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            env=self.env,
        )


def explain(result: Any) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def rows(stdout: str) -> dict[str, tuple[str, str]]:
    """The table's rows: config -> (path, detail)."""
    found = {}
    for line in stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) == 3 and parts[0] in CONFIGS:
            found[parts[0]] = (parts[1], parts[2])
    return found


def snapshot(paths: list[Path]) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in paths}


@pytest.fixture(scope="module")
def fleet(reference_image, docker_client, registry, test_env, tmp_path_factory, shared_cache):
    namespace = f"bsi-h2-fleet-{uuid.uuid4().hex[:8]}"
    try:
        yield make_fleet(
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


def make_fleet(
    namespace, reference_image, docker_client, registry, test_env, tmp_path_factory, cache
):
    runtime = f"{registry.host}/{namespace}/runtime"
    scratch = tmp_path_factory.mktemp("fleet-bases")
    docker_client.api.tag(reference_image, runtime, "v1")
    patched_base(f"{runtime}:v1", f"{runtime}:v2", scratch)
    patched_base(f"{runtime}:v2", f"{runtime}:v3", scratch)
    for version in ("v1", "v2", "v3"):
        push(docker_client, registry, f"{runtime}:{version}")

    logged_in = docker_login(test_env, registry, tmp_path_factory.mktemp("fleet-docker-config"))
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS}
    env |= {"DOCKER_CONFIG": str(logged_in), "DOCKER_HOST": test_env["docker_host"]}

    workdir = tmp_path_factory.mktemp("fleet")
    for name, own in TEMPLATES.items():
        here = workdir / name
        here.mkdir()
        (here / "requirements.txt").write_text(f"six\n{own}\n")
        shutil.copy(EXAMPLES / "sandbox-template.yaml", here / "sandbox-template.yaml")
        (here / "cfg.toml").write_text(
            'requirements = ["requirements.txt"]\n'
            f'base-repository = "{runtime}"\n'
            'platform-version = "v1"\n'
            'architectures = ["amd64"]\n'
            f'repository = "{registry.host}/{namespace}/sandbox-{name}"\n'
            'template = "sandbox-template.yaml"\n'
            "bytecode = false\n"
        )
    return Fleet(
        workdir,
        registry,
        runtime,
        lambda name: f"{registry.host}/{namespace}/sandbox-{name}",
        env,
        cache,
    )


@pytest.fixture(scope="module")
def first(fleet: Fleet) -> subprocess.CompletedProcess[str]:
    """The fleet's first run: no state recorded, so every template takes the build path."""
    return fleet.run(*(a for c in CONFIGS for a in ("--config", c)), "--platform-version", "v1")


def config_args() -> list[str]:
    return [a for c in CONFIGS for a in ("--config", c)]


def test_a_fleet_without_state_builds_and_points_every_template(fleet: Fleet, first) -> None:
    assert first.returncode == 0, explain(first)
    table = rows(first.stdout)
    assert set(table) == set(CONFIGS), first.stdout
    for name, config in zip(TEMPLATES, CONFIGS, strict=True):
        path, reference = table[config]
        assert path == "build", first.stdout
        assert re.fullmatch(rf"{re.escape(fleet.sandbox(name))}@{DIGEST}", reference)
        _, state, template = fleet.files(name)
        assert template_image(template) == reference
        assert json.loads(state.read_text())["image"] == reference
        assert f"[{config}] upgrade path: build" in first.stdout  # its lines carry its name


def test_check_names_every_template_that_needs_a_rebuild(fleet: Fleet, first) -> None:
    assert first.returncode == 0, "the first fleet run failed"
    watched = [path for name in TEMPLATES for path in fleet.files(name)]
    before = snapshot(watched)
    tags = {
        name: registry_tags(fleet.registry, fleet.sandbox(name).split("/", 1)[1])
        for name in TEMPLATES
    }
    check = fleet.run(*config_args(), "--platform-version", "v2", "--check")
    assert check.returncode == 3, explain(check)
    assert f"rebuild needed: {', '.join(CONFIGS)}" in check.stdout
    assert all(path == "needs rebuild" for path, _ in rows(check.stdout).values()), check.stdout
    assert snapshot(watched) == before
    for name in TEMPLATES:
        assert registry_tags(fleet.registry, fleet.sandbox(name).split("/", 1)[1]) == tags[name]


def test_a_fleet_rebases_every_template_probing_the_base_once(
    fleet: Fleet, first, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert first.returncode == 0, "the first fleet run failed"
    old = {name: template_image(fleet.files(name)[2]) for name in TEMPLATES}
    probed: list[str] = []
    real = builder.base.discover.probe_base

    def spy(image: ImageRef, *args: Any) -> Any:
        probed.append(image.as_written)
        return real(image, *args)

    monkeypatch.setattr(builder.base.discover, "probe_base", spy)
    monkeypatch.chdir(fleet.workdir)
    args = [*config_args(), "--platform-version", "v2", "--jobs", "3"]
    result = CliRunner(env=fleet.env).invoke(
        main, ["rebuild", *args, "--cache-dir", str(fleet.cache)]
    )
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert probed == [f"{fleet.runtime}:v2"]  # one probe for the three templates
    assert result.stdout.count(f"probing base {fleet.runtime}:v2 (once, for 3 template(s))") == 1
    table = rows(result.stdout)
    for name, config in zip(TEMPLATES, CONFIGS, strict=True):
        path, reference = table[config]
        assert path == "rebase", result.stdout
        assert reference != old[name] and reference.startswith(f"{fleet.sandbox(name)}@")
        config_file, state, template = fleet.files(name)
        assert template_image(template) == reference
        assert 'platform-version = "v2"' in config_file.read_text()
        assert json.loads(state.read_text())["platform_version"] == "v2"


def test_one_failed_template_neither_stops_nor_undoes_the_others(fleet: Fleet, first) -> None:
    assert first.returncode == 0, "the first fleet run failed"
    config_c, state_c, template_c = fleet.files("c")
    if 'platform-version = "v2"' not in config_c.read_text():
        pytest.skip("needs the rebase onto v2 (the test before) to have run")
    (config_c.parent / "requirements.txt").write_text(f"six\n{MISSING}\n")
    before_c = snapshot([config_c, state_c, template_c])
    old = {name: template_image(fleet.files(name)[2]) for name in ("a", "b")}

    result = fleet.run(*config_args(), "--platform-version", "v3")

    assert result.returncode == 1, explain(result)
    assert result.stderr.strip() == "error: rebuild failed for 1 of 3 templates: c/cfg.toml"
    table = rows(result.stdout)
    path, reason = table["c/cfg.toml"]
    assert path == "failed" and MISSING in reason, result.stdout
    assert snapshot([config_c, state_c, template_c]) == before_c
    for name, config in (("a", CONFIGS[0]), ("b", CONFIGS[1])):
        path, reference = table[config]
        assert path == "rebase", result.stdout
        assert reference != old[name] and template_image(fleet.files(name)[2]) == reference
        assert 'platform-version = "v3"' in fleet.files(name)[0].read_text()


def test_two_shards_rebuild_disjoint_slices_that_cover_the_fleet(fleet: Fleet, first) -> None:
    """`--shard 1/2` and `2/2`, as two CI jobs would run them: sorted, a and c go to the first
    slice, b to the second; each job prints its own table and writes it as JSON."""
    assert first.returncode == 0, "the first fleet run failed"
    if 'platform-version = "v3"' not in fleet.files("a")[0].read_text():
        pytest.skip("needs the run onto v3 (the test before) to have run")
    config_c, state_c, template_c = fleet.files("c")
    before_c = snapshot([config_c, state_c, template_c])

    one = fleet.run(*config_args(), "--platform-version", "v3", "--shard", "1/2")
    two = fleet.run(*config_args(), "--platform-version", "v3", "--shard", "2/2")

    assert one.returncode == 1, explain(one)  # c still names a distribution no index has
    assert one.stderr.strip().splitlines()[-1] == (
        "error: rebuild failed for 1 of 2 templates: c/cfg.toml"
    )
    assert two.returncode == 0, explain(two)
    tables = [
        json.loads((fleet.workdir / f"rebuild-shard-{k}-of-2.json").read_text()) for k in (1, 2)
    ]
    slices = [[row["template"] for row in table["rows"]] for table in tables]
    assert slices == [["a/cfg.toml", "c/cfg.toml"], ["b/cfg.toml"]]
    assert set(rows(one.stdout)) == set(slices[0]) and set(rows(two.stdout)) == set(slices[1])
    by_name = {row["template"]: row for table in tables for row in table["rows"]}
    for name in ("a", "b"):  # already on v3: recorded, nothing pushed again
        row = by_name[f"{name}/cfg.toml"]
        assert row["path"] == "unchanged", row
        assert row["detail"] == template_image(fleet.files(name)[2])
    assert by_name["c/cfg.toml"]["path"] == "failed" and MISSING in by_name["c/cfg.toml"]["detail"]
    assert snapshot([config_c, state_c, template_c]) == before_c
