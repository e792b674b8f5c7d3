"""Native or emulated: the decision from architectures (never from timing), a kernel's word on
an image that claims a foreign arch, and the startup timeout the machine picks.

The engine's side (the stand-ins on this engine, a hardened container carrying its machine, an
arm64 image verified with the emulated timeout) is tests/integration/test_verify_machine.py and
tests/integration/test_verify_startup.py.
"""

from __future__ import annotations

import json

import pytest

from builder.verify.client import LOCAL_PROCESS, Machine, Response, Sandbox
from builder.verify.container import (
    EMULATED_STARTUP_TIMEOUT,
    STARTUP_TIMEOUT,
    confirmed,
    machine_of,
    startup_timeout_for,
)

EMULATED = Machine(True, "arm64 image on an amd64 engine")
NATIVE = Machine(False, "amd64 image on an amd64 engine")


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


def test_the_machine_picks_the_startup_timeout_unless_the_caller_gave_one() -> None:
    assert STARTUP_TIMEOUT < EMULATED_STARTUP_TIMEOUT
    assert startup_timeout_for(NATIVE) == STARTUP_TIMEOUT
    assert startup_timeout_for(EMULATED) == EMULATED_STARTUP_TIMEOUT
    assert startup_timeout_for(EMULATED, 5.0) == 5.0
    assert startup_timeout_for(NATIVE, 500.0) == 500.0
