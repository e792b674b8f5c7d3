"""Plan-only (--no-build) against the real package index: playwright and selenium on amd64 and
arm64 get Debian's headless shell and chromedriver, a registry named by the revisions in each
arch's own Playwright wheel with that arch's layout, one warning that only Chromium is there,
and the environment that names them (the amd64 image is built in test_browsers_image.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.cache import Cache
from builder.plan.browsers import (
    BROWSERS_JSON,
    CHROMIUM,
    HEADLESS_SHELL,
    OTHER_ENGINES_WARNING,
    PLAYWRIGHT_DIR,
)

pytestmark = pytest.mark.usefixtures("package_index")

LAYOUT = {"amd64": "chrome-headless-shell-linux64", "arm64": "chrome-headless-shell-linux-arm64"}


def test_each_arch_links_its_own_wheels_revisions_in_its_own_layout(
    shared_cache: Path, tmp_path: Path
) -> None:
    (tmp_path / "requirements.txt").write_text("playwright\nselenium\n")
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(tmp_path / "requirements.txt"),
         "--output", str(tmp_path / "context"), "--cache-dir", str(shared_cache), "--no-build",
         "--arch", "amd64", "--arch", "arm64"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(OTHER_ENGINES_WARNING) == 1, result.stderr
    report = json.loads((tmp_path / "context" / "report.json").read_text())
    dockerfile = (tmp_path / "context" / "Dockerfile").read_text()
    for arch, record in report["architectures"].items():
        assert {"chromium-headless-shell", "chromium-driver"} <= set(record["apt_packages"])
        (wheel,) = [w for w in record["wheels"] if w["name"] == "playwright"]
        path = Cache(shared_cache).find_blob(wheel["sha256"], wheel["filename"])
        assert path is not None
        with zipfile.ZipFile(path) as archive:
            browsers = json.loads(archive.read(BROWSERS_JSON))["browsers"]
        revision = next(b["revision"] for b in browsers if b["name"] == "chromium-headless-shell")
        links = {link["path"]: link["target"] for link in record["browser_links"]}
        shell = f"{PLAYWRIGHT_DIR}/chromium_headless_shell-{revision}/{LAYOUT[arch]}"
        assert links[f"{shell}/chrome-headless-shell"] == HEADLESS_SHELL, links
        assert CHROMIUM in links.values()  # chromedriver's Chromium, for channel="chromium"
        (branch,) = [
            line for line in dockerfile.splitlines() if line.startswith(f"        {arch}) mkdir")
        ]
        assert f"{shell}/chrome-headless-shell" in branch and "/etc/chromium.d/" in branch
    other = {"amd64": "arm64", "arm64": "amd64"}
    for arch in LAYOUT:
        paths = report["architectures"][arch]["browser_links"]
        assert not [link for link in paths if LAYOUT[other[arch]] in link["path"]]
    assert f"PLAYWRIGHT_BROWSERS_PATH={PLAYWRIGHT_DIR}" in dockerfile
    assert "SE_CHROMEDRIVER=/usr/bin/chromedriver" in dockerfile
