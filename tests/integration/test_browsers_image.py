"""Browsers that work with no arguments: playwright and selenium in one amd64 image, built on
the reference base and verified by the build itself. The image gets Debian's headless shell and
chromedriver (with Chromium), a Playwright registry linking them and Selenium's driver named, so
that Playwright's default `chromium.launch()` and Selenium's `webdriver.Chrome()` with only a
headless option open a page and take a screenshot hardened (uid 65532, read-only, no network):
their use checks in the build's verification, and once more here by hand.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
from support.images import Built, build, docker, inspect, run_hardened
from support.machine import SESSION

from builder.plan.browsers import CHROMEDRIVER, PLAYWRIGHT_DIR

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")

REQUIREMENTS = "playwright\nselenium\n"
TAG = f"bsi-browsers/both-{SESSION}:test"

# What an agent's first call would be: no path, no channel, no download, nothing but a page.
PLAYWRIGHT_CODE = """
import os
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.launch()
    page = browser.new_page()
    page.goto("data:text/html,<p id=t>by hand</p>")
    png = page.screenshot()
    print(os.getuid(), page.inner_text("#t"), browser.version, png[:4] == b"\\x89PNG", sep="|")
    browser.close()
"""
SELENIUM_CODE = """
import os
from selenium import webdriver
options = webdriver.ChromeOptions()
options.add_argument("--headless=new")
driver = webdriver.Chrome(options=options)
driver.get("data:text/html,<p id=t>by hand</p>")
png = driver.get_screenshot_as_png()
print(os.getuid(), driver.find_element("id", "t").text, png[:4] == b"\\x89PNG", sep="|")
driver.quit()
"""


@pytest.fixture(scope="module")
def built(
    reference_image: str, test_env: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Built]:
    """One CLI run: plan, build (Chromium's debs from Debian's archive) and verify, with a cache
    of its own; the image, its context and that cache removed afterwards."""
    tmp_path = tmp_path_factory.mktemp("browsers")
    cache = tmp_path / "cache"
    result = build(tmp_path, cache, reference_image, REQUIREMENTS, TAG, "--arch", "amd64")
    report_path = tmp_path / "context" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    yield Built(TAG, result, report)
    docker(test_env, "rmi", "-f", TAG, check=False)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_build_wires_chromium_and_its_use_checks_pass(built: Built) -> None:
    result = built.result
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    amd64 = built.report["architectures"]["amd64"]
    assert {"chromium-headless-shell", "chromium-driver"} <= set(amd64["apt_packages"])
    links = {link["path"]: link["target"] for link in amd64["browser_links"]}
    shells = [path for path in links if "/chromium_headless_shell-" in path]
    assert shells and all(path.startswith(f"{PLAYWRIGHT_DIR}/") for path in links), links
    checks = {c["name"]: c["status"] for c in built.report["image"]["verification"]["checks"]}
    assert checks.get("use playwright") == "pass" and checks.get("use selenium") == "pass", checks
    assert "Firefox and WebKit are not in Debian 13" in result.stderr


def test_the_image_names_the_browsers(built: Built, test_env: dict) -> None:
    assert built.result.returncode == 0, built.result.stderr
    env = dict(item.split("=", 1) for item in inspect(test_env, TAG)["Config"]["Env"])
    assert env["PLAYWRIGHT_BROWSERS_PATH"] == PLAYWRIGHT_DIR
    assert env["SE_CHROMEDRIVER"] == CHROMEDRIVER and env["SE_OFFLINE"] == "true"


def test_playwright_launches_with_no_arguments_hardened(built: Built, test_env: dict) -> None:
    assert built.result.returncode == 0, built.result.stderr
    result = run_hardened(test_env, TAG, PLAYWRIGHT_CODE)
    assert result.returncode == 0, result.stderr[-3000:]
    uid, text, version, png = result.stdout.strip().split("|")
    assert (uid, text, png) == ("65532", "by hand", "True"), result.stdout
    assert version.split(".")[0].isdigit(), version  # Debian's Chromium answered


def test_selenium_starts_chrome_with_only_a_headless_option_hardened(
    built: Built, test_env: dict
) -> None:
    assert built.result.returncode == 0, built.result.stderr
    result = run_hardened(test_env, TAG, SELENIUM_CODE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().split("|") == ["65532", "by hand", "True"], result.stdout


def test_nothing_was_downloaded_into_the_home(built: Built, test_env: dict) -> None:
    """Selenium Manager's cache and Playwright's default registry stay empty: the run used the
    image's browsers (the home is on the fresh /tmp of each run, so look within one run)."""
    assert built.result.returncode == 0, built.result.stderr
    code = (
        SELENIUM_CODE
        + PLAYWRIGHT_CODE
        + "import os, pathlib\n"
        + "cache = pathlib.Path(os.environ['XDG_CACHE_HOME'])\n"
        + "print(sorted(p.name for p in cache.glob('*')) if cache.exists() else [])\n"
    )
    result = run_hardened(test_env, TAG, code)
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]  # what the home's cache holds after both
    assert "selenium" not in last and "ms-playwright" not in last, last
