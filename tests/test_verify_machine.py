"""Whether a verified sandbox runs emulated: decided from architectures, never from timing.

The flood check holds a native server to its peak-RSS bound; a loaded machine that starts
Pythons slowly must not pass for an emulated one (tests/test_verify_checks.py runs the check
itself against a slow-starting native server). Here: the decision, and that a hardened
container's Sandbox carries it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from builder.verify import hardening
from builder.verify.client import LOCAL_PROCESS, Machine, Sandbox
from builder.verify.container import hardened, machine_of
from builder.verify.report import run_check


class Engine:
    """What `docker version` says of the engine's own arch, and nothing else."""

    def __init__(self, version: dict[str, Any]) -> None:
        self._version = version

    def version(self) -> dict[str, Any]:
        return self._version


@pytest.mark.parametrize(
    ("engine", "arch", "expected"),
    [
        ({"Arch": "amd64"}, "amd64", Machine(False, "amd64 image on an amd64 engine")),
        ({"Arch": "amd64"}, "arm64", Machine(True, "arm64 image on an amd64 engine")),
        ({"Arch": "arm64"}, "arm64", Machine(False, "arm64 image on an arm64 engine")),
        ({"Arch": "arm64"}, "amd64", Machine(True, "amd64 image on an arm64 engine")),
        ({"Arch": "amd64"}, "", Machine(False, "unnamed image, amd64 engine")),
        ({}, "arm64", Machine(False, "arm64 image, unnamed engine")),
        # the kernel's names for the same arches are the same machine
        ({"Arch": "amd64"}, "x86_64", Machine(False, "x86_64 image on an amd64 engine")),
        ({"Arch": "arm64"}, "aarch64", Machine(False, "aarch64 image on an arm64 engine")),
        ({"Arch": "amd64"}, "aarch64", Machine(True, "aarch64 image on an amd64 engine")),
    ],
)
def test_emulation_is_a_difference_of_arches(
    engine: dict[str, Any], arch: str, expected: Machine
) -> None:
    """An arch either side leaves unnamed counts as native: the native bounds then apply."""
    assert machine_of(Engine(engine), arch) == expected  # type: ignore[arg-type]


def test_a_sandbox_is_a_native_local_process_unless_told_otherwise() -> None:
    assert Sandbox(1).machine == LOCAL_PROCESS
    assert str(LOCAL_PROCESS) == "native: the server runs as a local process"
    assert str(Machine(True, "arm64 image on an amd64 engine")).startswith("emulated: ")


@pytest.mark.engine
def test_the_stand_ins_are_native_and_emulated_on_this_engine(
    docker_client: Any, test_env: dict[str, str]
) -> None:
    """This machine's engine is amd64 with qemu for arm64 (tests/test_infra.py)."""
    arches = {
        name: docker_client.images.get(test_env[name]).attrs["Architecture"]
        for name in ("base_image", "base_image_arm64")
    }
    assert machine_of(docker_client, arches["base_image"]).emulated is False
    assert machine_of(docker_client, arches["base_image_arm64"]) == Machine(
        True, "arm64 image on an amd64 engine"
    )


@pytest.mark.engine
def test_a_hardened_native_container_is_flooded_and_held_to_the_rss_bound(
    reference_image: str, docker_client: Any
) -> None:
    """The Sandbox `hardened` yields carries the machine, and the flood names it and bounds it."""
    with hardened(docker_client, reference_image) as running:
        assert running.sandbox.machine == Machine(False, "amd64 image on an amd64 engine")
        result = run_check("flood", partial(hardening.check_flood, running.sandbox))
    assert result.passed, result.detail
    assert result.detail.startswith("2 x 2 x 10 MiB of 0xff: ")
    assert result.detail.endswith(" (limit 256 MiB); native: amd64 image on an amd64 engine")
