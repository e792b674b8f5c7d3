"""Credentials in an index or link location reach uv through its environment, never its
command line, which every user of a runner can read (`ps`, /proc/PID/cmdline); what uv reads
back from the environment is the same list in the same order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from builder.resolve.index import credentials_off_command

SECRET = "s3cr3t-t0ken-value"
PRIVATE = f"https://ci:{SECRET}@artifacts.example/simple"


def test_a_location_with_credentials_leaves_the_command_line() -> None:
    argv, env = credentials_off_command(
        ["uv", "pip", "compile", "in.txt", "--index-url", PRIVATE, "--quiet"]
    )
    assert argv == ["uv", "pip", "compile", "in.txt", "--quiet"]
    assert env == {"UV_INDEX_URL": PRIVATE}


def test_a_kind_moves_whole_so_uv_keeps_its_order() -> None:
    public = "https://pypi.org/simple"
    argv, env = credentials_off_command(
        ["uv", "--extra-index-url", public, "--extra-index-url", PRIVATE, "--find-links", "w"]
    )
    assert argv == ["uv", "--find-links", "w"]  # no credentials among the links: left as given
    assert env == {"UV_EXTRA_INDEX_URL": f"{public} {PRIVATE}"}


def test_links_are_joined_by_commas_and_one_holding_a_comma_stays() -> None:
    argv, env = credentials_off_command(["uv", "--find-links", "wheels", "--find-links", PRIVATE])
    assert argv == ["uv"] and env == {"UV_FIND_LINKS": f"wheels,{PRIVATE}"}
    odd = f"{PRIVATE}/a,b"
    argv, env = credentials_off_command(["uv", "--find-links", odd])
    assert argv == ["uv", "--find-links", odd] and env == {}


def test_no_credentials_changes_nothing() -> None:
    command = ["uv", "pip", "compile", "--index-url", "https://pypi.org/simple", "x.in"]
    assert credentials_off_command(command) == (command, {})


def test_the_process_table_never_shows_the_secret(tmp_path: Path) -> None:
    """A real child process given what run_uv gives uv: its /proc cmdline lacks the secret,
    its environment holds it."""
    argv, env = credentials_off_command(
        [
            sys.executable,
            "-c",
            "import sys; print(open('/proc/self/cmdline').read())",
            "--index-url",
            PRIVATE,
        ]
    )
    assert argv[3:] == []
    shown = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **env}, check=True
    ).stdout
    assert SECRET not in shown and "cmdline" in shown
