"""The apt step: the Debian packages land in the layer, apt's scratch never does.

The binary cache, the downloaded .debs and the tool's apt config live in a tmpfs for the RUN
(builder.image.render.apt_steps); a real one-step build on the stand-in base shows the layer.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest

from builder.cache import Cache
from builder.image.apt import build_apt_image, saved_layer
from builder.image.render import APT_CONFIG, APT_SETUP

pytestmark = pytest.mark.engine


def test_the_apt_layer_holds_the_package_and_none_of_apt_s_scratch(
    docker_client: Any, test_env: dict, tmp_path: Path
) -> None:
    built = build_apt_image(test_env["base_image"], ["libgomp1"], "amd64", docker_client)
    try:
        assert APT_SETUP in built.created_by
        layer = saved_layer(built, Cache(tmp_path / "cache"), docker_client)
        with tarfile.open(layer.path) as archive:
            files = [member.name for member in archive if not member.isdir()]
        assert any(name.endswith("libgomp.so.1") for name in files)
        assert any(name.startswith("var/lib/dpkg/info/libgomp1") for name in files)
        # no binary cache, no .deb, no config of the tool's, no package lists
        kept = [n for n in files if n.startswith(("var/cache/apt/", "var/lib/apt/lists/"))]
        assert kept == []
        assert not any(name.endswith(Path(APT_CONFIG).name) for name in files)
    finally:
        docker_client.images.remove(built.image_id, force=True)
