"""The server makes the sandbox user's home and seeds it from the image's caches at start.

The server process runs with a HOME, XDG and matplotlib directories inside it, and a seed
directory standing for the image's /opt/sandbox/home; its commands must find the seed's files
in their home, writable. A file already there (a container restarted on a kept /tmp) stays as
it is, and a HOME that cannot be made is said in the log without stopping the server.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from support.sandboxserver import ServerProcess

from builder.verify.client import Sandbox

SEEDED = {".config/matplotlib/fontlist-v390.json": '{"_version": 390}', ".cache/x/y.txt": "y"}


def seed_dir(root: Path) -> Path:
    seed = root / "seed"
    for name, text in SEEDED.items():
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_text(text)
        (seed / name).chmod(0o444)  # root-owned and read-only in an image
    return seed


def home_env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_CACHE_HOME": f"{home}/.cache",
        "XDG_CONFIG_HOME": f"{home}/.config",
        "MPLCONFIGDIR": f"{home}/.config/matplotlib",
    }


def started(tmp_path: Path, home: Path, seed: Path, fallback: str = "") -> ServerProcess:
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    flags = ("--home-seed", str(seed), "--home-fallback", fallback)
    return ServerProcess(workspace, *flags, env=home_env(home))


LOOK = """
import json, os
home = os.environ["HOME"]
found = {}
for root, dirs, names in os.walk(home):
    for name in names:
        path = os.path.join(root, name)
        found[os.path.relpath(path, home)] = open(path).read()
dirs = ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")
print(json.dumps({"files": found, "writable": {d: os.access(os.environ[d], os.W_OK) for d in dirs},
                  "mode": oct(os.stat(home).st_mode & 0o777)}))
"""


def test_the_home_is_made_and_seeded_before_the_first_command(tmp_path: Path) -> None:
    home = tmp_path / "tmp" / "home"
    process = started(tmp_path, home, seed_dir(tmp_path))
    try:
        result = Sandbox(process.port, workspace=str(process.workspace)).python(LOOK)
    finally:
        process.stop()
    assert result["exit_code"] == 0, result["stderr"]
    seen = json.loads(result["stdout"])
    assert seen["files"] == SEEDED
    assert seen["writable"] == dict.fromkeys(
        ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"), True
    )
    assert seen["mode"] == "0o700"
    assert f"home: {home}, 2 files seeded from " in process.log.read_text()
    assert list(process.workspace.iterdir()) == []  # nothing lands in the workspace


def test_a_file_already_in_the_home_is_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kept = home / ".config" / "matplotlib" / "fontlist-v390.json"
    kept.parent.mkdir(parents=True)
    kept.write_text("the user's own")
    process = started(tmp_path, home, seed_dir(tmp_path))
    process.stop()
    assert kept.read_text() == "the user's own"
    assert (home / ".cache" / "x" / "y.txt").read_text() == "y"
    assert f"home: {home}, 1 files seeded from " in process.log.read_text()


def test_a_home_that_cannot_be_made_is_said_and_the_server_still_serves(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    process = started(tmp_path, blocked / "home", seed_dir(tmp_path))
    try:
        result = Sandbox(process.port, workspace=str(process.workspace)).execute("echo served")
    finally:
        process.stop()
    assert result["stdout"] == "served\n"
    told = process.log.read_text()
    assert f"home: {blocked / 'home'} cannot be made (Not a directory); libraries" in told


def test_without_a_writable_home_commands_get_the_fallback_seeded(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    fallback = tmp_path / "shm" / "home"
    process = started(tmp_path, blocked / "home", seed_dir(tmp_path), str(fallback))
    try:
        result = Sandbox(process.port, workspace=str(process.workspace)).python(LOOK)
        env = Sandbox(process.port, workspace=str(process.workspace)).python(
            "import json, os; print(json.dumps(dict(os.environ)))"
        )
    finally:
        process.stop()
    assert result["exit_code"] == 0, result["stderr"]
    assert json.loads(result["stdout"])["files"] == SEEDED
    seen = json.loads(env["stdout"])
    assert seen["HOME"] == str(fallback)
    assert seen["MPLCONFIGDIR"] == f"{fallback}/.config/matplotlib"
    assert seen["XDG_CACHE_HOME"] == f"{fallback}/.cache"
    told = process.log.read_text()
    assert f"cannot be made (Not a directory); commands get HOME={fallback}, 2 files" in told
    assert list(process.workspace.iterdir()) == []
