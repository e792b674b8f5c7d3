"""An ssh:// engine for real: the tool's client, the docker CLI's BuildKit build and a hardened
verification through an `ssh -N -L` forward, all over real ssh (tests/support/sshengine.py) to this
machine's engine, as to an arm64 build host."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.bases import labelled_scratch
from support.machine import unavailable
from support.sshengine import SshEngine

from builder.engines.connection import EngineURL
from builder.engines.per_arch import connect
from builder.verify.container import hardened

pytestmark = pytest.mark.usefixtures("docker_client")

RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def ssh_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshEngine]:
    engine = SshEngine(tmp_path_factory.mktemp("ssh") / "sshd")
    try:
        engine.start()
    except (RuntimeError, OSError) as error:
        unavailable(f"ssh engine: {error}")
    yield engine
    engine.stop()


@pytest.fixture
def on_ssh(ssh_engine: SshEngine, monkeypatch: pytest.MonkeyPatch, docker_client: Any) -> Any:
    monkeypatch.setenv("PATH", ssh_engine.ssh_on_path())
    url = EngineURL.parse(ssh_engine.url, "--engine arm64")
    engine = connect({"arm64": url}, docker_client).for_arch("arm64")
    yield engine
    engine.client.close()


def test_the_engine_answers_and_builds_over_ssh(
    on_ssh: Any, docker_client: Any, tmp_path: Path
) -> None:
    assert on_ssh.native == "amd64" and on_ssh.url.scheme == "ssh"
    image_id = labelled_scratch(on_ssh, "org.bsi-h1.ssh", RUN, tmp_path)
    try:
        assert on_ssh.client.images.get(image_id).labels == {"org.bsi-h1.ssh": RUN}
    finally:
        docker_client.images.remove(image_id, force=True)


def test_a_sandbox_is_reached_through_an_ssh_forward(on_ssh: Any, reference_image: str) -> None:
    with hardened(on_ssh, reference_image) as running:
        published = running.container.attrs["NetworkSettings"]["Ports"]
        port = int(next(iter(published.values()))[0]["HostPort"])
        assert running.sandbox.host == "127.0.0.1" and running.sandbox.port != port
        assert running.sandbox.health().status == 200
        assert running.health.startswith("GET / -> 200 after ")
