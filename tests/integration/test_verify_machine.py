"""Whether a verified sandbox runs emulated: decided from architectures, never from timing.

The flood check holds a native server to its peak-RSS bound; a loaded machine that starts
Pythons slowly must not pass for an emulated one (tests/verify/test_checks.py runs the check
itself against a slow-starting native server; tests/verify/test_machine.py the decision
itself). Here: the engine's stand-ins as it decides them, and that a hardened container's
Sandbox carries it.
"""

from __future__ import annotations

import platform
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support.sandboxserver import start_server, stop_server

from builder.engines.connection import Engine as RunEngine
from builder.engines.connection import native_arch
from builder.verify.client import Machine, Sandbox, run_check
from builder.verify.container import confirmed, hardened, machine_of
from builder.verify.hardened import hardening


@pytest.mark.usefixtures("docker_client")
def test_the_stand_ins_are_native_and_emulated_on_this_engine(
    docker_client: Any, test_env: dict[str, str], arm64_standin: str
) -> None:
    """This machine's engine is amd64 with qemu for arm64 (tests/integration/test_infra.py)."""
    arches = {
        name: docker_client.images.get(test_env[name]).attrs["Architecture"]
        for name in ("base_image", "base_image_arm64")
    }
    assert machine_of(native_arch(docker_client), arches["base_image"]).emulated is False
    assert machine_of(native_arch(docker_client), arches["base_image_arm64"]) == Machine(
        True, "arm64 image on an amd64 engine"
    )


@pytest.mark.usefixtures("docker_client")
def test_a_hardened_native_container_is_flooded_and_held_to_the_rss_bound(
    reference_image: str, docker_client: Any
) -> None:
    """The Sandbox `hardened` yields carries the machine, and the flood names it and bounds it."""
    with hardened(RunEngine.local(docker_client), reference_image) as running:
        assert running.sandbox.machine == Machine(False, "amd64 image on an amd64 engine")
        result = run_check("flood", partial(hardening.check_flood, running.sandbox))
    assert result.passed, result.detail
    assert result.detail.startswith("2 x 2 x 10 MiB of 0xff: ")
    assert result.detail.endswith(" (limit 256 MiB); native: amd64 image on an amd64 engine")


def test_a_mislabelled_native_server_keeps_the_native_bounds(tmp_path: Path) -> None:
    """The process-mode server (this machine's arch) under a config that claims the other."""
    process = start_server(tmp_path / "workspace")
    try:
        claimed = "arm64" if platform.machine() == "x86_64" else "amd64"
        engine = "amd64" if claimed == "arm64" else "arm64"
        sandbox = Sandbox(process.port, workspace=str(process.workspace))
        sandbox.machine = machine_of(engine, claimed)
        assert sandbox.machine.emulated
        machine = confirmed(engine, sandbox)
    finally:
        stop_server(process)
    assert machine == Machine(
        False, f"{claimed} image on an {engine} engine, but its kernel runs {platform.machine()}"
    )
