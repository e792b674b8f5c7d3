"""Docker credential helpers written by tests: a real program on PATH, run as Docker runs it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def install_helper(
    bin_dir: Path, name: str, answers: dict[str, tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> Path:
    """`docker-credential-<name>` answering `get` for each server in `answers`, else exit 1.

    It appends every server URL it is asked about to the returned log file.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = bin_dir / f"{name}.log"
    cases = "".join(
        f"  '{server}') echo '{json.dumps({'ServerURL': server, 'Username': u, 'Secret': s})}' ;;\n"
        for server, (u, s) in answers.items()
    )
    script = bin_dir / f"docker-credential-{name}"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = get ] || exit 2\n'
        "read -r server\n"
        f'echo "$server" >> "{log}"\n'
        'case "$server" in\n'
        f"{cases}"
        "  *) echo 'credentials not found in native keychain'; exit 1 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def write_docker_config(directory: Path, config: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
