"""A credential helper's answer is read bounded: a broken or hostile helper cannot fill memory."""

from __future__ import annotations

import os

import pytest
from support.credhelp import write_docker_config
from support.registryhelp import forget_credentials

from builder.credentials import HELPER_OUTPUT_LIMIT, lookup
from builder.errors import UserError

ANSWER = '{"Username": "u", "Secret": "s"}'


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    forget_credentials(monkeypatch, tmp_path / "home")


def _helper(tmp_path, monkeypatch, name: str, body: str) -> None:
    """`docker-credential-<name>` running the shell `body`, named as the config's credsStore."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / f"docker-credential-{name}"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    write_docker_config(tmp_path / "cfg", {"credsStore": name}, monkeypatch)


def _padded(total: int) -> str:
    """Shell printing ANSWER, then spaces up to `total` bytes: valid JSON of that size."""
    return f"printf '{ANSWER}'; head -c {total - len(ANSWER)} /dev/zero | tr '\\0' ' '"


def test_helper_printing_more_than_the_limit_is_one_error_naming_it(monkeypatch, tmp_path):
    """Valid JSON padded past the limit: refused, not read whole and parsed."""
    _helper(tmp_path, monkeypatch, "chatty", _padded(HELPER_OUTPUT_LIMIT + 1))
    with pytest.raises(UserError) as caught:
        lookup("reg.example")
    message = str(caught.value)
    assert "docker-credential-chatty" in message and "1 MiB" in message
    assert "\n" not in message


def test_helper_printing_without_end_is_stopped(monkeypatch, tmp_path):
    """`yes` never exits: the read stops at the limit instead of at the timeout (or never)."""
    _helper(tmp_path, monkeypatch, "endless", 'exec yes \'{"Username": "u"}\'')
    with pytest.raises(UserError, match="docker-credential-endless: printed more than 1 MiB"):
        lookup("reg.example")


def test_answer_of_exactly_the_limit_is_read(monkeypatch, tmp_path):
    """The bound is on size only: a padded login of exactly the limit still counts."""
    _helper(tmp_path, monkeypatch, "padded", _padded(HELPER_OUTPUT_LIMIT))
    found = lookup("reg.example")
    assert found is not None and (found.username, found.secret) == ("u", "s")
    assert found.source == "docker-credential-padded"


def test_helper_exiting_without_reading_its_input_means_none(monkeypatch, tmp_path):
    _helper(tmp_path, monkeypatch, "mute", "exec 0<&-; exit 1")
    assert lookup("reg.example") is None


def test_hanging_helper_times_out_to_none(monkeypatch, tmp_path):
    monkeypatch.setattr("builder.credentials.HELPER_TIMEOUT", 0.5)
    _helper(tmp_path, monkeypatch, "stuck", "exec sleep 30")
    assert lookup("reg.example") is None
