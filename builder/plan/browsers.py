"""Debian's Chromium wired so that Playwright and Selenium find it with no arguments.

Neither library looks on PATH. Playwright (>= 1.49) launches the headless shell its own
`playwright install` puts under `PLAYWRIGHT_BROWSERS_PATH` (`~/.cache/ms-playwright` by default),
in a directory named by the revision in the wheel's `driver/package/browsers.json`; that install
downloads from Playwright's CDN, which neither an air-gapped build nor the sandbox reaches.
Selenium (>= 4.6) runs Selenium Manager, which, finding no driver, downloads Chrome for Testing
and chromedriver at run time. So an image whose set holds them gets Debian 13's builds (the
curated programs table installs `chromium-headless-shell` for Playwright, `chromium-driver`,
which depends on `chromium`, for Selenium) and this wiring, decided here from the plan:

- a root-owned registry (PLAYWRIGHT_DIR) laid out as Playwright's registry expects for the
  installed release's revisions, holding symlinks to Debian's binaries (the headless shell, and
  `/usr/bin/chromium` where it is installed, for `channel="chromium"`). The executable's path
  inside a revision's directory changed across releases (`chrome-linux/headless_shell`, then
  Chrome for Testing's `chrome-headless-shell-linux64/chrome-headless-shell`); each is a
  symlink, so every layout Playwright has used for the arch is laid out;
- `SE_CHROMEDRIVER` naming Debian's chromedriver (Selenium >= 4.26 then skips Selenium Manager;
  chromedriver starts `/usr/bin/chromium` by default) and `SE_OFFLINE`, so Selenium Manager, when
  something still runs it (another browser), never downloads;
- a drop-in of Debian's Chromium launcher (`/etc/chromium.d`, which `/usr/bin/chromium` sources)
  adding `--no-sandbox` where Chromium's own sandbox cannot start: it needs user namespaces,
  which a container with every capability dropped and the default seccomp profile refuses (a
  probe with `unshare` decides at each start, so a node that offers them keeps the sandbox).
  Playwright passes `--no-sandbox` itself unless asked for `chromiumSandbox`; Selenium does not.

Firefox and WebKit are not in Debian 13 in a form Playwright accepts (its Firefox is patched,
its WebKit its own build): a plan with Playwright warns so once.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from builder.errors import UserError

PLAYWRIGHT = "playwright"
SELENIUM = "selenium"
PLAYWRIGHT_DIR = "/opt/ms-playwright"  # PLAYWRIGHT_BROWSERS_PATH: root-owned, read-only
BROWSERS_JSON = "playwright/driver/package/browsers.json"
HEADLESS_SHELL = "/usr/lib/chromium/chromium-headless-shell"  # the binary, beside its .pak files
CHROMIUM = "/usr/bin/chromium"  # Debian's launcher: it sources /etc/chromium.d
CHROMEDRIVER = "/usr/bin/chromedriver"
DROP_IN = "/etc/chromium.d/bsi-sandbox"
# The probe: Chromium's namespace sandbox clones a user, PID and network namespace.
DROP_IN_TEXT = (
    "# build-sandbox-image: the Chromium sandbox needs user namespaces; where the container"
    " offers none, it runs without (the container is the sandbox)\n"
    "unshare --user --map-root-user --pid --net --fork true 2>/dev/null"
    ' || export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-sandbox"\n'
)
# Playwright's platform names for Debian 13 (a `revisionOverrides` key) and its layouts: per
# browser of browsers.json, the executable's paths inside the revision's directory.
HOST_PLATFORM = MappingProxyType({"amd64": "debian13-x64", "arm64": "debian13-arm64"})
LAYOUTS: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "amd64": {
            "chromium-headless-shell": (
                "chrome-linux/headless_shell",
                "chrome-headless-shell-linux64/chrome-headless-shell",
            ),
            "chromium": ("chrome-linux/chrome", "chrome-linux64/chrome"),
        },
        "arm64": {
            "chromium-headless-shell": (
                "chrome-linux/headless_shell",
                "chrome-headless-shell-linux-arm64/chrome-headless-shell",
            ),
            "chromium": ("chrome-linux/chrome", "chrome-linux-arm64/chrome"),
        },
    }
)
# browser of browsers.json -> (Debian's executable, the packages that install it)
TARGETS: Mapping[str, tuple[str, frozenset[str]]] = MappingProxyType(
    {
        "chromium-headless-shell": (HEADLESS_SHELL, frozenset({"chromium-headless-shell"})),
        "chromium": (CHROMIUM, frozenset({"chromium", "chromium-driver"})),
    }
)
CHROMIUM_PACKAGES = frozenset({"chromium", "chromium-driver"})  # what installs the launcher
OTHER_ENGINES_WARNING = (
    "warning: playwright: only Chromium is in the image (Debian 13's headless shell);"
    " Firefox and WebKit are not in Debian 13 in a form Playwright launches, so p.firefox and"
    " p.webkit fail there"
)


@dataclass(frozen=True)
class BrowserLink:
    """A symlink the image carries: `path` -> `target`."""

    path: str
    target: str


@dataclass(frozen=True)
class BrowserWiring:
    """What one arch's image gets so that the browser libraries find Debian's Chromium."""

    links: tuple[BrowserLink, ...] = ()
    drop_in: bool = False  # DROP_IN, with DROP_IN_TEXT

    def __bool__(self) -> bool:
        return bool(self.links) or self.drop_in

    def commands(self) -> str:
        """The shell commands (root, after the apt install) that lay it out."""
        steps = []
        if self.links:
            directories = sorted({link.path.rpartition("/")[0] for link in self.links})
            steps.append(f"mkdir -p {' '.join(directories)}")
            steps += [f"ln -s {link.target} {link.path}" for link in self.links]
        if self.drop_in:
            steps.append(f'printf "{_double_quoted(DROP_IN_TEXT)}" > {DROP_IN}')
        return " && ".join(steps)


def _double_quoted(text: str) -> str:
    """`text` inside a shell's double quotes, for printf: `$` and quotes kept literal."""
    for special in ("\\", '"', "$", "`"):
        text = text.replace(special, "\\" + special)
    return text.replace("%", "%%").replace("\n", "\\n")


def playwright_directories(listing: bytes | None, arch: str, wheel: str) -> dict[str, str]:
    """Each browser of the wheel's browsers.json (`listing`, read by the caller:
    inspect.wheel_reader.member_bytes) (name -> its revision's directory) as Playwright names
    it on `arch`'s Debian 13 (a platform's `revisionOverrides` entry gets a directory of its
    own); `{}` for a wheel without one. `wheel` (its file name) names it in an error."""
    if listing is None:
        return {}
    try:
        data = json.loads(listing)
        return {str(b["name"]): _directory(b, HOST_PLATFORM[arch]) for b in data["browsers"]}
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{wheel}: cannot read {BROWSERS_JSON} ({error})") from None


def _directory(browser: Mapping[str, object], platform: str) -> str:
    """`chromium_headless_shell-1255`: the name with `_` for `-`, then the revision."""
    name, overrides = str(browser["name"]), browser.get("revisionOverrides") or {}
    if not isinstance(overrides, dict):
        raise TypeError(f"revisionOverrides of {name} is not a table")
    if platform in overrides:
        return f"{name}_{platform}_special".replace("-", "_") + f"-{overrides[platform]}"
    return f"{name.replace('-', '_')}-{browser['revision']}"


def wiring(
    arch: str,
    names: Collection[str],
    installed: Collection[str],
    directories: Mapping[str, str],
) -> BrowserWiring:
    """One arch's wiring: its distributions' `names` (normalized), the Debian packages it
    `installed`, and the Playwright wheel's browser directories (playwright_directories)."""
    links = []
    if PLAYWRIGHT in names:
        for browser, (target, packages) in TARGETS.items():
            if browser not in directories or not packages & set(installed):
                continue
            directory = f"{PLAYWRIGHT_DIR}/{directories[browser]}"
            links += [BrowserLink(f"{directory}/{path}", target) for path in LAYOUTS[arch][browser]]
    drop_in = bool(CHROMIUM_PACKAGES & set(installed))
    return BrowserWiring(tuple(links), drop_in)


def browser_env(
    names: Collection[str], installed: Collection[str], wirings: Collection[BrowserWiring]
) -> dict[str, str]:
    """The image's environment, from every arch's distributions' `names`, the packages some
    arch `installed` and the arches' wirings: Playwright's registry where some arch links it,
    Selenium's driver and offline mode where some arch installs chromedriver."""
    env = {}
    if PLAYWRIGHT in names and any(w.links for w in wirings):
        env["PLAYWRIGHT_BROWSERS_PATH"] = PLAYWRIGHT_DIR
    if SELENIUM in names and "chromium-driver" in installed:
        env["SE_CHROMEDRIVER"] = CHROMEDRIVER
        env["SE_OFFLINE"] = "true"
    return env
