"""The second engine the scale-out tests build on is a real engine of its own."""

from __future__ import annotations

import docker.errors
import pytest

pytestmark = pytest.mark.usefixtures("docker_client")

ONLY_HERE = "bsi-engine2-only:test"


def test_the_second_engine_is_its_own_engine(
    second_engine, docker_client, test_env, standin_index
) -> None:
    client = second_engine.client()
    try:
        info = client.info()
        assert info["DockerRootDir"] != docker_client.info()["DockerRootDir"]
        login = {"username": test_env["registry_user"], "password": test_env["registry_password"]}
        image = client.images.pull(standin_index, auth_config=login)
        image.tag(ONLY_HERE)
        output = client.containers.run(ONLY_HERE, ["python3", "-c", "print(6 * 7)"], remove=True)
        assert output.strip() == b"42"
    finally:
        client.close()
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(ONLY_HERE)
