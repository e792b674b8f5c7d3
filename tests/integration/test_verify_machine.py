"""Whether a verified sandbox runs emulated: decided from architectures, never from timing.

The flood check holds a native server to its peak-RSS bound; a loaded machine that starts
Pythons slowly must not pass for an emulated one (tests/verify/test_checks.py runs the check
itself against a slow-starting native server). Here: the decision, and that a hardened
container's Sandbox carries it.
"""

from __future__ import annotations

import json
import platform
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support.sandboxserver import start_server, stop_server

from builder.engines.connection import Engine as RunEngine
from builder.engines.connection import native_arch
from builder.verify.client import LOCAL_PROCESS, Machine, Response, Sandbox, run_check
from builder.verify.container import confirmed, hardened, machine_of
from builder.verify.hardened import hardening


@pytest.mark.parametrize(
    ("engine", "arch", "expected"),
    [
        ("amd64", "amd64", Machine(False, "amd64 image on an amd64 engine")),
        ("amd64", "arm64", Machine(True, "arm64 image on an amd64 engine")),
        ("arm64", "arm64", Machine(False, "arm64 image on an arm64 engine")),
        ("arm64", "amd64", Machine(True, "amd64 image on an arm64 engine")),
        ("amd64", "", Machine(False, "unnamed image, amd64 engine")),
        (None, "arm64", Machine(False, "arm64 image, unnamed engine")),
        # the kernel's names for the same arches are the same machine
        ("amd64", "x86_64", Machine(False, "x86_64 image on an amd64 engine")),
        ("arm64", "aarch64", Machine(False, "aarch64 image on an arm64 engine")),
        ("amd64", "aarch64", Machine(True, "aarch64 image on an amd64 engine")),
    ],
)
def test_emulation_is_a_difference_of_arches(
    engine: str | None, arch: str, expected: Machine
) -> None:
    """An arch either side leaves unnamed counts as native: the native bounds then apply."""
    assert machine_of(engine, arch) == expected


def test_a_sandbox_is_a_native_local_process_unless_told_otherwise() -> None:
    assert Sandbox(1).machine == LOCAL_PROCESS
    assert str(LOCAL_PROCESS) == "native: the server runs as a local process"
    assert str(Machine(True, "arm64 image on an amd64 engine")).startswith("emulated: ")


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


class Kernel(Sandbox):
    """Answers /execute `uname -m` as a sandbox's kernel would; nothing else."""

    def __init__(self, printed: str, exit_code: int = 0) -> None:
        super().__init__(1, machine=Machine(True, "arm64 image on an amd64 engine"))
        self.reply = {"stdout": printed, "stderr": "", "exit_code": exit_code}

    def request(self, method, path, body=None, headers=None, timeout=30.0) -> Response:
        assert json.loads(body)["command"] == ["uname", "-m"]
        return Response(200, json.dumps(self.reply).encode())


@pytest.mark.parametrize(
    ("printed", "exit_code", "emulated"),
    [
        ("aarch64\n", 0, True),
        ("arm64\n", 0, True),
        ("x86_64\n", 0, False),  # the config claims arm64, the binaries are the engine's own
        ("amd64\n", 0, False),
        ("", 127, False),  # no uname: not proven emulated, so the native bounds apply
        ("aarch64\n", 1, False),
    ],
)
def test_an_image_claiming_a_foreign_arch_is_emulated_only_if_its_kernel_says_so(
    printed: str, exit_code: int, emulated: bool
) -> None:
    """An image config may name any arch: a mislabelled native image must not get the lighter
    flood and the unbounded RSS of an emulated one."""
    machine = confirmed("amd64", Kernel(printed, exit_code))
    assert machine.emulated is emulated
    assert machine.why.startswith("arm64 image on an amd64 engine")


def test_a_native_sandbox_is_not_asked_again() -> None:
    sandbox = Kernel("aarch64\n")
    sandbox.machine = Machine(False, "amd64 image on an amd64 engine")
    assert confirmed("amd64", sandbox) == sandbox.machine


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
