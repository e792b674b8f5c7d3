"""How long verify waits for a server to start: the machine decides unless the caller does.

Under qemu a Python starts several times slower, so an emulated image is allowed
EMULATED_STARTUP_TIMEOUT and a native one STARTUP_TIMEOUT, by `verify_image` itself: the CLI's
`verify`, multiarch and the rebase path all get it without knowing the image's arch. An
explicit timeout still wins (the choice itself: tests/verify/test_machine.py). The engine
tests verify a minimal arm64 sandbox (the arm64 stand-in, the stdlib-only server and one module
in /app/deps, built from COPY steps only, so nothing runs emulated while building) on this
amd64 engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from builder.engines.connection import Engine
from builder.runtime import copy_server
from builder.verify.client import Machine
from builder.verify.container import (
    EMULATED_STARTUP_TIMEOUT,
    STARTUP_TIMEOUT,
    hardened,
)
from builder.verify.run import verify_image

NATIVE = Machine(False, "amd64 image on an amd64 engine")
PROBE = "bsi_startup_probe"


@pytest.fixture(scope="module")
def arm64_sandbox(
    docker_client: Any, test_env: dict[str, str], tmp_path_factory: Any, arm64_standin: str
) -> Iterator[str]:
    """A minimal arm64 sandbox image: the runtime server as the platform's base runs it."""
    context = tmp_path_factory.mktemp("arm64-sandbox")
    (context / "deps").mkdir()
    (context / "deps" / f"{PROBE}.py").write_text("import platform\nMACHINE = platform.machine()\n")
    copy_server(context / "server")
    (context / "Dockerfile").write_text(
        f"FROM {test_env['base_image_arm64']}\n"
        "COPY deps/ /app/deps/\n"
        "COPY server/ /opt/sandbox/server/\n"
        "ENV PYTHONPATH=/app/deps\n"
        "WORKDIR /workspace\n"
        "USER 65532:65532\n"
        'ENTRYPOINT ["python3", "-I", "/opt/sandbox/server"]\n'
    )
    tag = f"bsi-verify-startup-{uuid.uuid4().hex[:8]}:arm64"
    image, _ = docker_client.images.build(path=str(context), tag=tag, rm=True)
    assert image.attrs["Architecture"] == "arm64"
    try:
        yield tag
    finally:
        docker_client.images.remove(tag, force=True)


@pytest.mark.usefixtures("docker_client")
def test_an_emulated_image_is_verified_with_the_emulated_startup_timeout(
    arm64_sandbox: str, docker_client: Any
) -> None:
    """No timeout given: the arm64 image gets 240 s and every check passes under qemu."""
    snippet = f"import {PROBE}; assert {PROBE}.MACHINE == 'aarch64', {PROBE}.MACHINE"
    report = verify_image(
        arm64_sandbox,
        modules=[PROBE],
        checks=[snippet],
        engine=Engine.local(docker_client),
        sdk=False,
    )
    assert report.passed, report.table()
    health = next(check for check in report.checks if check.name == "health")
    assert health.detail.endswith(
        f"(limit {EMULATED_STARTUP_TIMEOUT:g}s; emulated: arm64 image on an amd64 engine)"
    )
    flood = next(check for check in report.checks if check.name == "flood")
    assert flood.detail.endswith("; emulated: arm64 image on an amd64 engine")


@pytest.mark.usefixtures("docker_client")
def test_an_explicit_startup_timeout_still_bounds_an_emulated_image(
    arm64_sandbox: str, docker_client: Any
) -> None:
    """Half a second is less than an emulated server needs to start: health fails naming it."""
    report = verify_image(
        arm64_sandbox, engine=Engine.local(docker_client), startup_timeout=0.5, sdk=False
    )
    assert not report.passed
    assert [check.name for check in report.checks] == ["image-user", "health"]
    health = report.checks[1]
    assert not health.passed
    assert "within 0.5s" in health.detail or "was not published" in health.detail, health.detail


@pytest.mark.usefixtures("docker_client")
def test_a_native_image_keeps_the_native_startup_timeout(
    reference_image: str, docker_client: Any
) -> None:
    with hardened(Engine.local(docker_client), reference_image) as running:
        assert running.sandbox.machine == NATIVE
        assert running.health.endswith(
            f"(limit {STARTUP_TIMEOUT:g}s; native: amd64 image on an amd64 engine)"
        )
