"""Playwright and Selenium wired to Debian's Chromium (builder.plan.browsers): the packages the
curated entries install, the registry laid out for the wheel's own revisions on each arch, the
environment, and the build step that lays them out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support.plans import plan_for, reference_profile
from support.wheelfactory import make_wheel

from builder.context.render import dockerfile
from builder.inspect.wheel_reader import member_bytes
from builder.orchestration.runners.document import _decode, _encode
from builder.plan.browsers import (
    BROWSERS_JSON,
    CHROMEDRIVER,
    CHROMIUM,
    DROP_IN,
    DROP_IN_TEXT,
    HEADLESS_SHELL,
    OTHER_ENGINES_WARNING,
    PLAYWRIGHT_DIR,
    BrowserWiring,
    browser_env,
    playwright_directories,
    wiring,
)
from builder.plan.plan import ArchPlan, Plan

PURE = "py3-none-any"


def playwright(tmp_path: Path, revision: str = "1255", overrides: dict | None = None) -> Path:
    """A Playwright wheel with its browsers.json (the real one's shape, without the driver)."""
    browsers = [
        {"name": "chromium", "revision": revision, "installByDefault": True},
        {"name": "chromium-headless-shell", "revision": revision, "installByDefault": True},
        {"name": "webkit", "revision": "2388", "revisionOverrides": overrides or {}},
    ]
    files = {
        "playwright/__init__.py": b"",
        BROWSERS_JSON: json.dumps({"browsers": browsers}).encode(),
    }
    return make_wheel(tmp_path / "w", "playwright", "1.65.3", PURE, files)


def selenium(tmp_path: Path) -> Path:
    return make_wheel(tmp_path / "w", "selenium", "4.51.0", PURE, {"selenium/__init__.py": b""})


def links(plan: ArchPlan) -> dict[str, str]:
    return {link.path: link.target for link in plan.browsers.links}


def test_playwright_gets_the_headless_shell_in_a_registry_of_its_own_revision(
    tmp_path: Path,
) -> None:
    plan = plan_for(tmp_path, [playwright(tmp_path, "1234")])
    assert "chromium-headless-shell" in plan.apt_packages
    assert "chromium" not in plan.apt_packages and "chromium-driver" not in plan.apt_packages
    shell = f"{PLAYWRIGHT_DIR}/chromium_headless_shell-1234"
    assert links(plan) == {  # the layout of Chrome for Testing's builds, and the older one
        f"{shell}/chrome-headless-shell-linux64/chrome-headless-shell": HEADLESS_SHELL,
        f"{shell}/chrome-linux/headless_shell": HEADLESS_SHELL,
    }
    assert not plan.browsers.drop_in  # no Chromium launcher: nothing to tell it
    assert OTHER_ENGINES_WARNING in plan.warnings
    env = browser_env({"playwright"}, plan.apt_packages, [plan.browsers])
    assert env == {"PLAYWRIGHT_BROWSERS_PATH": PLAYWRIGHT_DIR}


def test_selenium_gets_chromedriver_and_chromium_with_both_the_registry_links_it(
    tmp_path: Path,
) -> None:
    plan = plan_for(tmp_path, [playwright(tmp_path), selenium(tmp_path)])
    assert {"chromium-headless-shell", "chromium-driver"} <= set(plan.apt_packages)
    found = links(plan)
    assert found[f"{PLAYWRIGHT_DIR}/chromium-1255/chrome-linux64/chrome"] == CHROMIUM
    assert plan.browsers.drop_in
    env = browser_env({"playwright", "selenium"}, plan.apt_packages, [plan.browsers])
    assert env["SE_CHROMEDRIVER"] == CHROMEDRIVER and env["SE_OFFLINE"] == "true"
    programs = {need.program: need for need in plan.programs}
    assert programs["chromedriver"].package == "chromium-driver"
    assert not programs["chromedriver"].optional and "curated" in programs["chromedriver"].why


def test_left_out_the_browser_wires_nothing(tmp_path: Path) -> None:
    wheels = [playwright(tmp_path), selenium(tmp_path)]
    without = frozenset({"chromium-headless-shell", "chromedriver"})
    plan = plan_for(tmp_path, wheels, without=without)
    assert not plan.browsers
    assert browser_env({"playwright", "selenium"}, plan.apt_packages, [plan.browsers]) == {}


def test_arm64_has_its_own_layout_and_a_platform_override_its_own_directory(
    tmp_path: Path,
) -> None:
    wheel = playwright(tmp_path, overrides={"debian13-arm64": "2000"})
    listing = member_bytes(wheel, BROWSERS_JSON)
    assert playwright_directories(listing, "amd64", wheel.name)["webkit"] == "webkit-2388"
    arm = playwright_directories(listing, "arm64", wheel.name)
    assert arm["webkit"] == "webkit_debian13_arm64_special-2000"
    found = wiring("arm64", {"playwright"}, {"chromium-headless-shell"}, arm)
    paths = {link.path for link in found.links}
    shell = f"{PLAYWRIGHT_DIR}/chromium_headless_shell-1255"
    assert f"{shell}/chrome-headless-shell-linux-arm64/chrome-headless-shell" in paths
    assert not any("linux64" in path for path in paths)


def test_the_commands_lay_out_the_links_and_the_drop_in(tmp_path: Path) -> None:
    """The step's commands run by a shell, under a scratch root: each link and the launcher's
    drop-in, byte for byte."""
    root = tmp_path / "root"
    directories = {"chromium-headless-shell": "chromium_headless_shell-7", "chromium": "chromium-7"}
    found = wiring("amd64", {"playwright"}, {"chromium-headless-shell", "chromium"}, directories)
    commands = found.commands().replace(PLAYWRIGHT_DIR, f"{root}{PLAYWRIGHT_DIR}")
    commands = commands.replace(DROP_IN, f"{root}/drop-in")
    subprocess.run(["sh", "-ec", commands], check=True)
    for link in found.links:
        assert (root / link.path.lstrip("/")).readlink() == Path(link.target)
    assert (root / "drop-in").read_text() == DROP_IN_TEXT
    assert "--no-sandbox" in DROP_IN_TEXT and "unshare --user" in DROP_IN_TEXT


def test_the_dockerfile_lays_them_out_after_the_install_and_sets_the_env(tmp_path: Path) -> None:
    arch = plan_for(tmp_path, [playwright(tmp_path), selenium(tmp_path)])
    plan = Plan(reference_profile(), "python-runtime:1", (arch,), (), ())
    text = dockerfile(plan)
    install = text.index("chromium-headless-shell \\")
    assert text.index('case "${TARGETARCH}" in') > install
    assert "ARG TARGETARCH" in text
    assert f"amd64) mkdir -p {PLAYWRIGHT_DIR}/" in text and f"> {DROP_IN} ;;" in text
    assert f"PLAYWRIGHT_BROWSERS_PATH={PLAYWRIGHT_DIR}" in text
    assert f"SE_CHROMEDRIVER={CHROMEDRIVER}" in text
    assert plan.to_dict()["architectures"]["amd64"]["browser_links"]


def test_an_image_without_browsers_has_no_wiring() -> None:
    assert not BrowserWiring() and BrowserWiring().commands() == ""
    assert browser_env({"requests"}, {"chromium"}, [BrowserWiring((), True)]) == {}


def test_the_wiring_survives_plan_json(tmp_path: Path) -> None:
    """A runner builds from plan.json alone (builder.orchestration.runners.document): the
    wiring read back is the planned one, and so are the image's variables."""
    arch = plan_for(tmp_path, [playwright(tmp_path), selenium(tmp_path)])
    plan = Plan(reference_profile(), "python-runtime:1", (arch,), (), ())
    back = _decode(Plan, json.loads(json.dumps(_encode(plan))))
    assert back.arches[0].browsers == arch.browsers and arch.browsers.links
    assert back.browser_env == plan.browser_env and "SE_CHROMEDRIVER" in plan.browser_env
