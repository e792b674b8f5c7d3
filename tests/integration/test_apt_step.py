"""The apt step: the Debian packages land in the layer, apt's scratch never does.

The binary cache, the downloaded .debs and the tool's apt config live in a tmpfs for the RUN
(builder.context.render.apt_steps); a real one-step build on the stand-in base shows the layer.
"""

from __future__ import annotations

import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from builder.assemble.apt import build_apt_image, saved_layer
from builder.assemble.build import BuildSpec, build_image
from builder.cache import Cache
from builder.context.render import APT_CONFIG, APT_RETRIES, APT_SETUP, Secrets, apt_steps
from builder.engines.connection import Engine

pytestmark = pytest.mark.usefixtures("docker_client")


def test_the_apt_layer_holds_the_package_and_none_of_apt_s_scratch(
    docker_client: Any, test_env: dict, tmp_path: Path
) -> None:
    built = build_apt_image(
        test_env["base_image"], ["libgomp1"], "amd64", Engine.local(docker_client)
    )
    try:
        assert APT_SETUP in built.created_by
        assert f"-o Acquire::Retries={APT_RETRIES}" in built.created_by  # a mirror's blip
        layer = saved_layer(built, Cache(tmp_path / "cache"), docker_client)
        with tarfile.open(layer.path) as archive:
            files = [member.name for member in archive if not member.isdir()]
        assert any(name.endswith("libgomp.so.1") for name in files)
        assert any(name.startswith("var/lib/dpkg/info/libgomp1") for name in files)
        # no binary cache, no .deb, no config of the tool's, no package lists
        kept = [n for n in files if n.startswith(("var/cache/apt/", "var/lib/apt/lists/"))]
        assert kept == []
        assert not any(name.endswith(Path(APT_CONFIG).name) for name in files)
    finally:
        docker_client.images.remove(built.image_id, force=True)


def test_every_apt_download_is_retried_with_or_without_secrets() -> None:
    for secrets in (Secrets(), Secrets(apt_ca=True, apt_auth=True)):
        _, (_, update, install) = apt_steps(secrets)
        for command in (update, install):
            assert f" -o Acquire::Retries={APT_RETRIES} " in command
    assert APT_RETRIES > 3  # more than apt's own default


def _derived_base(docker_client: Any, test_env: dict, tmp_path: Path, lines: str) -> str:
    """The stand-in base with `lines` run as root: a base of another make."""
    context = tmp_path / "base"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {test_env['base_image']}\nUSER 0:0\nRUN {lines}\n"
        f"RUN echo {uuid.uuid4().hex} > /etc/bsi-base-id\n"
    )
    with open(context / "build.log", "w") as log:
        image_id = build_image(context, BuildSpec(platform="linux/amd64"), log)
    tag = f"bsi-apt-base-{uuid.uuid4().hex[:8]}:test"
    docker_client.images.get(image_id).tag(tag)
    return tag


def _layer_files(built: Any, cache: Cache, docker_client: Any) -> list[str]:
    with tarfile.open(saved_layer(built, cache, docker_client).path) as archive:
        return [member.name for member in archive if not member.isdir()]


def test_a_base_s_own_pre_install_hook_still_runs(
    docker_client: Any, test_env: dict, tmp_path: Path
) -> None:
    """Only debconf's preconfiguration is skipped: a base's policy hook on the .debs is kept."""
    hook = 'DPkg::Pre-Install-Pkgs {"cat > /etc/bsi-hook-saw; true";};'
    base = _derived_base(
        docker_client, test_env, tmp_path, f"echo '{hook}' > /etc/apt/apt.conf.d/50bsi-hook"
    )
    built = build_apt_image(base, ["libgomp1"], "amd64", Engine.local(docker_client))
    try:
        files = _layer_files(built, Cache(tmp_path / "cache"), docker_client)
        assert "etc/bsi-hook-saw" in files  # the hook ran, and was given the .debs
    finally:
        docker_client.images.remove(built.image_id, force=True)
        docker_client.images.remove(base, force=True)


def test_a_base_without_docker_clean_keeps_apt_s_scratch_out_too(
    docker_client: Any, test_env: dict, tmp_path: Path
) -> None:
    base = _derived_base(docker_client, test_env, tmp_path, "rm /etc/apt/apt.conf.d/docker-clean")
    built = build_apt_image(base, ["libgomp1"], "amd64", Engine.local(docker_client))
    try:
        files = _layer_files(built, Cache(tmp_path / "cache"), docker_client)
        assert any(name.endswith("libgomp.so.1") for name in files)
        assert [n for n in files if n.startswith(("var/cache/apt/", "var/lib/apt/lists/"))] == []
    finally:
        docker_client.images.remove(built.image_id, force=True)
        docker_client.images.remove(base, force=True)


def test_on_a_debian_base_debconf_s_preconfiguration_alone_is_cleared(
    docker_client: Any, test_env: dict
) -> None:
    """The stand-in base has debconf's hook only: the setup clears it (the emulated 20 s)."""
    written = docker_client.containers.run(
        test_env["base_image"], ["sh", "-c", f"{APT_SETUP} && cat {APT_CONFIG}"],
        user="0:0", remove=True,
    ).decode()  # fmt: skip
    assert written.splitlines() == [
        'Dir::Cache::pkgcache "pkgcache.bin";',
        "#clear DPkg::Pre-Install-Pkgs;",
    ]
