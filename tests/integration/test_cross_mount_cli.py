"""Two templates through the CLI, one tool cache: the second mounts what the first pushed.

Template one is beautifulsoup4 (and soupsieve); template two adds six. Pushed to two
repositories of the local registry, template two's base and shared distribution layers are
mounted from repository one (the cache's blob memory said it holds them): every blob is counted
as uploaded, mounted or already there exactly once, so "mounted = every shared blob's size" means
none of them was uploaded. Then template one is pushed again (its tag, `<version>-x<extras
hash>`, is the same): every blob is already there, and a node holding the image the tag named
has nothing to download or unpack. What a changed image costs a node is tested on images of
known layers in test_cross_mount.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.machine import Registry
from support.registryhelp import registry_get

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

RUN = uuid.uuid4().hex[:8]


def build(
    registry: Registry, work: Path, name: str, requirements: str, target: tuple[str, str]
) -> tuple[dict[str, Any], str]:
    """One CLI build on `target`'s base pushed to its repository; its report.json's image and
    the CLI's output."""
    base, repository = target
    (work / f"{name}.txt").write_text(requirements)
    env = {
        **os.environ,
        "UV_CACHE_DIR": str(work / "uv-cache"),
        "BSI_REGISTRY_USER": registry.user,
        "BSI_REGISTRY_PASSWORD": registry.password,
    }
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(work / f"{name}.txt"),
         "--base-image", base, "--tag", f"bsi-h3-{RUN}/{name}:test", "--output", str(work / name),
         "--cache-dir", str(work / "cache"), "--push", repository, "--no-verify"],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return json.loads((work / name / "report.json").read_text())["image"], result.stdout


def manifest(registry: Registry, pushed: str) -> dict[str, Any]:
    repository, digest = pushed.split("/", 1)[1].split("@")
    with registry_get(registry, f"/v2/{repository}/manifests/{digest}") as response:
        document: dict[str, Any] = json.loads(response.read())
    with registry_get(registry, f"/v2/{repository}/blobs/{document['config']['digest']}") as r:
        document["diff_ids"] = json.loads(r.read())["rootfs"]["diff_ids"]
    return document


def test_a_second_template_mounts_what_the_first_pushed(
    tmp_path: Path, registry: Registry, test_env: dict, reference_image: str
) -> None:
    one, two = (f"{registry.host}/bsi-h3-{RUN}/{name}" for name in ("one", "two"))
    bs4 = "beautifulsoup4==4.12.3\n"
    first, _ = build(registry, tmp_path, "first", bs4, (reference_image, one))
    second, out = build(registry, tmp_path, "second", f"{bs4}six==1.16.0\n", (reference_image, two))
    a, b = manifest(registry, first["pushed"]), manifest(registry, second["pushed"])
    had = {layer["digest"] for layer in a["layers"]}
    shared = [layer for layer in b["layers"] if layer["digest"] in had]
    assert len(shared) >= len(b["layers"]) - 3  # only six's layer and bytecode are new
    assert second["bytes_mounted"] == sum(layer["size"] for layer in shared)
    assert second["bytes_present"] == 0  # a repository never pushed to
    assert second["node_update"]["previous"] is None  # a new tag, and no state
    assert "mounted" in out and "the tag named no image before" in out
    memory = json.loads((tmp_path / "cache" / "registry-blobs.json").read_text())
    assert memory[registry.host][shared[0]["digest"]][:2] == [
        f"bsi-h3-{RUN}/two",
        f"bsi-h3-{RUN}/one",
    ]

    # the first template pushed again: the same tag, every layer already there, nothing to fetch
    again, out = build(registry, tmp_path, "first", bs4, (reference_image, one))
    assert again["tags"] == first["tags"]
    assert again["bytes_mounted"] == 0
    assert again["bytes_present"] >= sum(layer["size"] for layer in a["layers"])
    node = again["node_update"]
    assert node["previous"] == first["pushed"].split("@")[1]
    assert (node["download"], node["download_layers"], node["unpack_layers"]) == (0, 0, 0)
    assert "downloads 0 kB (0 layers), unpacks 0 layers" in out
    subprocess.run(
        [test_env["docker"], "rmi", "-f", *(f"bsi-h3-{RUN}/{n}:test" for n in ("first", "second"))],
        capture_output=True,
        check=False,
    )
