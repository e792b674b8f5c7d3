"""builder.reporter's masking: every secret a run read, and every URL's credentials, replaced
by `***` in what the tool prints and writes (a requirements file is hostile input read on CI
runners that hold logins)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from builder.cli.errors import error_line, reports_errors
from builder.context.render import add_to_output
from builder.errors import UserError
from builder.reporter import (
    Reporter,
    excerpt,
    mask,
    redact_credentials,
    remember,
    remember_credentials,
)

TOKEN = "ghp_9f8e7d6c5b4a3f2e1d0c"


def test_a_remembered_value_is_masked_wherever_it_stands() -> None:
    assert mask(f"local path './{TOKEN}/x.whl' does not exist") == (
        f"local path './{TOKEN}/x.whl' does not exist"
    )  # not remembered yet: nothing says it is a secret
    remember(TOKEN)
    assert mask(f"local path './{TOKEN}/x.whl' does not exist") == (
        "local path './***/x.whl' does not exist"
    )
    assert TOKEN not in mask(f"x{TOKEN}y, {TOKEN}")


def test_a_value_is_masked_as_a_url_percent_encodes_it_too() -> None:
    remember("p@ss/w0rd!")
    assert mask("https://127.0.0.1/?p%40ss%2Fw0rd%21") == "https://127.0.0.1/?***"


def test_a_short_value_is_not_masked_in_free_text() -> None:
    """A short value ("ci-user") would mangle every line it is part of; a URL's user part is
    masked anyway."""
    remember("ci-user")
    assert mask("ci-users of ci-user") == "ci-users of ci-user"
    assert mask("https://ci-user@host/simple") == "https://***@host/simple"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("https://ci:Pass@host/x.whl", "https://***@host/x.whl"),
        ("git+https://tok@git.example/r", "git+https://***@git.example/r"),
        ("local path 'ci:Pass1@host/x.whl' is gone", "local path '***@host/x.whl' is gone"),
        # an image reference's tag and digest are no credentials
        ("python:3.13-slim@sha256:0123abcd", "python:3.13-slim@sha256:0123abcd"),
        ("127.0.0.1:5000/lib/python:3.13@sha256:ab", "127.0.0.1:5000/lib/python:3.13@sha256:ab"),
        ("pkg:pypi/requests@2.32.0", "pkg:pypi/requests@2.32.0"),
    ],
)
def test_url_credentials_are_masked_with_or_without_a_scheme(text: str, masked: str) -> None:
    assert redact_credentials(text) == masked
    assert mask(text) == masked


def test_an_excerpt_of_an_environment_files_line_keeps_no_value() -> None:
    remember(TOKEN)
    assert excerpt(f"AWS_SECRET_ACCESS_KEY=abc/{TOKEN}") == "'AWS_SECRET_ACCESS_KEY=***'"
    assert "Pass" not in excerpt("ci:Pass@host/x.whl")
    assert excerpt("password: hunter2/x") == "'password: ***'"
    assert excerpt('"token": "ab/cd"') == """'"token": ***'"""


def test_the_reporter_masks_every_line_prefixed_ones_too() -> None:
    lines: list[str] = []
    reporter = Reporter(lines.append)
    remember(TOKEN)
    reporter.say(f"fetching {TOKEN}")
    reporter.note(f"https://ci:{TOKEN}@host/simple")
    reporter.prefixed("team-a").warn(f"token {TOKEN}")
    assert lines == [
        "fetching ***",
        "note: https://***@host/simple",
        "[team-a] warning: token ***",
    ]


def test_the_cli_error_line_is_masked() -> None:
    remember(TOKEN)

    @click.command()
    @reports_errors
    def failing() -> None:
        raise UserError(f"r.txt:1: local path './{TOKEN}' does not exist")

    result = CliRunner().invoke(failing, [])
    assert result.exit_code == 1
    assert result.stderr == "error: r.txt:1: local path './***' does not exist\n"
    assert error_line(f"cause: {TOKEN}\n  more") == "error: cause: *** more"


def test_a_file_written_beside_the_report_holds_no_remembered_secret(tmp_path: Path) -> None:
    remember(TOKEN)
    add_to_output(tmp_path, "sbom.json", f'{{"purl": "pkg:pypi/x@1", "note": "{TOKEN}"}}'.encode())
    assert (tmp_path / "sbom.json").read_text() == '{"purl": "pkg:pypi/x@1", "note": "***"}'


def test_a_urls_password_or_token_is_remembered_and_an_ssh_login_is_not() -> None:
    remember_credentials("https://ci:written-password@host/simple")
    remember_credentials("git+https://ghp_token_alone_1234@github.com/acme/tools")
    remember_credentials("git+ssh://deployment@git.example/acme/tools")
    remember_credentials("https://ci:${STILL_A_VARIABLE}@host/simple")
    said = mask("written-password ghp_token_alone_1234 deployment ${STILL_A_VARIABLE}")
    assert said == "*** *** deployment ${STILL_A_VARIABLE}"
