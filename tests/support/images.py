"""Images through the real CLI and the Docker CLI: build, run hardened, inspect.

The CLI builds as a user's would (`python -m builder`, a cache directory of the test's choosing);
the Docker CLI is Debian's (`test_env["docker"]`): a newer one earlier on PATH may demand buildx.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

from docker.errors import APIError, NotFound
from ruamel.yaml import YAML


class Built(NamedTuple):
    """An image the real CLI built and verified, with what it printed and its report.json."""

    tag: str
    result: subprocess.CompletedProcess[str]
    report: dict


HARDENED = [
    "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
    "--user", "65532:65532", "--network", "none", "--tmpfs", "/tmp",
]  # fmt: skip


def build(
    tmp_path: Path, cache_dir: Path, base: str, requirements: str, tag: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    req = tmp_path / "requirements.txt"
    req.write_text(requirements)
    return subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(req), "--base-image", base, "--tag", tag,
         "--output", str(tmp_path / "context"), "--cache-dir", str(cache_dir), *extra],
        capture_output=True,
        text=True,
        timeout=1200,
    )  # fmt: skip


def docker(test_env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [test_env["docker"], *args], capture_output=True, text=True, check=check, timeout=600
    )


def run_hardened(test_env: dict, image: str, code: str) -> subprocess.CompletedProcess[str]:
    return docker(
        test_env, "run", "--rm", *HARDENED, "--entrypoint", "python3", image, "-c", code,
        check=False,
    )  # fmt: skip


def inspect(test_env: dict, image: str) -> dict:
    return json.loads(docker(test_env, "image", "inspect", image).stdout)[0]


def template_image(path: Path) -> str:
    document = YAML(typ="safe").load(path.read_text())
    return document["spec"]["podTemplate"]["spec"]["containers"][0]["image"]


def local_images(client: Any, all_layers: bool = False) -> list[tuple[str, list[str]]]:
    """(id, tags) of the engine's images, from one listing. Not `client.images.list()`: it
    inspects each image after listing them, and another test (or xdist worker) removing one
    meanwhile would fail it with a 404."""
    return [
        (entry["Id"], [tag for tag in entry.get("RepoTags") or [] if tag != "<none>:<none>"])
        for entry in client.api.images(all=all_layers)
    ]


def remove_images(client: Any, namespace: str) -> None:
    """Every local tag in the test's namespace, and the images only those tags kept."""
    for image_id, tags in local_images(client):
        ours = [t for t in tags if f"/{namespace}/" in t]
        if not ours:
            continue
        others = [t for t in tags if t not in ours and not t.startswith("sandbox-extension:")]
        for tag in ours:
            with contextlib.suppress(APIError):  # incl. ImageNotFound
                client.images.remove(tag)
        if not others:
            with contextlib.suppress(APIError):
                client.images.remove(image_id, force=True)


def docker_login(test_env: dict, registry: Any, config_dir: Path) -> Path:
    """`docker login` to the test registry into a Docker config of its own (never ~/.docker),
    as an operator's runner would hold it; the config directory."""
    login = subprocess.run(
        [test_env["docker"], "login", registry.host, "-u", registry.user, "--password-stdin"],
        input=registry.password,
        capture_output=True,
        text=True,
        env={**os.environ, "DOCKER_CONFIG": str(config_dir)},
        timeout=60,
    )
    assert login.returncode == 0, login.stderr
    return config_dir


def provisional_holding(client: Any, layers: list[str]) -> list[str]:
    """The tool's provisional images (an early load's, a load batch's, a probe's) whose layers
    begin `layers`: what a build must have removed once its image holds them."""
    found = []
    for entry in client.api.images(filters={"label": "bsi.provisional"}):
        try:
            held = client.api.inspect_image(entry["Id"])["RootFS"]["Layers"]
        except NotFound:  # another test's, removed meanwhile
            continue
        if held == layers[: len(held)]:
            found.append(entry["Id"])
    return found
