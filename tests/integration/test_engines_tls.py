"""A tcp:// engine with TLS client certificates (DOCKER_CERT_PATH's layout), for real.

The engine is the local one behind a verifying TLS front (tests/support/tlsengine.py): the tool's
client and the docker CLI it runs for BuildKit both reach it with the certificates named by
`?certs=DIR`, and a client certificate of another CA is refused as one line.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.bases import labelled_scratch
from support.tlsengine import make_certs, tls_engine

from builder.engines.connection import EngineURL
from builder.engines.per_arch import connect
from builder.errors import UserError

pytestmark = pytest.mark.usefixtures("docker_client")

RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("tls") / "certs")


@pytest.fixture(scope="module")
def port(certs: Path, test_env: dict) -> Iterator[int]:
    with tls_engine(test_env["docker_host"].removeprefix("unix://"), certs) as port:
        yield port


def test_the_engine_is_reached_and_built_on_over_tls(
    certs: Path, port: int, docker_client: Any, tmp_path: Path
) -> None:
    url = EngineURL.parse(f"tcp://127.0.0.1:{port}?certs={certs}", "--engine arm64")
    engine = connect({"arm64": url}, docker_client).for_arch("arm64")
    assert engine.native == "amd64" and engine.url == url
    assert engine.publish_address == "127.0.0.1"  # the URL's host: where verify publishes
    image_id = labelled_scratch(engine, "org.bsi-h1.tls", RUN, tmp_path)
    try:
        assert engine.client.images.get(image_id).labels == {"org.bsi-h1.tls": RUN}
    finally:
        docker_client.images.remove(image_id, force=True)
    engine.client.close()


def test_a_client_certificate_of_another_ca_is_one_line(
    certs: Path, port: int, docker_client: Any, tmp_path: Path
) -> None:
    rogue = make_certs(tmp_path / "rogue", ca_name="bsi-rogue-ca")
    (rogue / "ca.pem").write_bytes((certs / "ca.pem").read_bytes())  # trusts the engine
    url = EngineURL.parse(f"tcp://127.0.0.1:{port}?certs={rogue}", "--engine arm64")
    with pytest.raises(UserError) as raised:
        connect({"arm64": url}, docker_client)
    message = str(raised.value)
    assert message.startswith(f"engine for arm64 at tcp://127.0.0.1:{port}?certs={rogue} not")
    assert "\n" not in message
