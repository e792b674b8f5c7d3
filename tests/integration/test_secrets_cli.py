"""No secret in output, through the real CLI (plan only): a CI runner's variable (`CI_TOKEN`)
that a team's requirements file names never reaches stdout, stderr, the build context or the
cache, whether it stands where credentials go (substituted, masked) or anywhere else
(refused, by name). A wrong password is said to be one, naming the host; a FIFO is refused
without waiting on it.

The index is a loopback PEP 503 server behind Basic auth (tests/support/wheelindex.py) whose
password is the secret itself, so any echo of what was sent shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clirun import SECRET, assert_one_error_line, requirements
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

PRIVATE, OTHER = "bsi-private", "bsi-other"
TIMEOUT = 300  # seconds a plan-only run may take; a FIFO read that blocks fails, never hangs


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A loopback index whose password is the secret, listing bsi-private, serving bsi-other."""
    wheels = tmp_path / "wheels"
    private = make_wheel(wheels, PRIVATE, "1.0", "py3-none-any", {"bsi_private/__init__.py": b""})
    other = make_wheel(wheels, OTHER, "1.0", "py3-none-any", {"bsi_other/__init__.py": b""})
    with serve_wheel(private, PRIVATE, credentials=f"ci:{SECRET}", others={OTHER: other}) as port:
        yield port, other


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, plan only, with the secret in its environment as CI_TOKEN (absolute paths: the
    run's own directory is the test's), and uv's cache in the test's directory too (where the
    tool does not put it inside its own)."""
    return subprocess.run(
        [sys.executable, "-m", "builder", "--no-build", "--arch", "amd64",
         "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "out"), *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=TIMEOUT,
        env={**os.environ, "CI_TOKEN": SECRET, "BSI_DEBUG": "", "UV_HTTP_RETRIES": "0",
             "UV_CACHE_DIR": str(tmp_path / "uv-cache")},
    )  # fmt: skip


def _assert_nowhere(tmp_path: Path, result: subprocess.CompletedProcess[str]) -> None:
    """The secret, as written or percent-encoded, in no output and no file the run wrote."""
    forms = {SECRET, urllib.parse.quote(SECRET, safe="")}
    for form in forms:
        assert form not in result.stdout + result.stderr
    for place in (tmp_path / "out", tmp_path / "cache", tmp_path / "uv-cache"):
        for path in (p for p in place.rglob("*") if p.is_file() and not p.is_symlink()):
            data = path.read_bytes()
            assert not any(form.encode() in data for form in forms), path


def test_a_secret_substituted_where_credentials_go_is_written_nowhere(
    tmp_path: Path, index: tuple[int, Path]
) -> None:
    port, other = index
    at = f"http://ci:${{CI_TOKEN}}@127.0.0.1:{port}"
    name = requirements(
        tmp_path,
        f"--index-url {at}/simple\n--find-links {at}/simple/{PRIVATE}/\n{PRIVATE}==1.0\n"
        f"{OTHER} @ {at}/files/{other.name}\n".encode(),
    )
    result = _run(tmp_path, "-r", name)
    assert result.returncode == 0, result.stderr
    assert f" {PRIVATE} " in result.stdout and f" {OTHER} " in result.stdout  # the plan's table
    assert (tmp_path / "out" / "report.json").is_file()
    assert any((tmp_path / "cache").rglob("*.whl"))  # the cache holds what was fetched
    _assert_nowhere(tmp_path, result)


@pytest.mark.parametrize(
    "line",
    [
        "./vendor/${CI_TOKEN}/acme-1.0-py3-none-any.whl",  # a path: it would be echoed
        "acme @ https://${CI_TOKEN}.files.example/acme-1.0-py3-none-any.whl",  # a host: sent
        "acme @ https://files.example/${CI_TOKEN}/acme-1.0-py3-none-any.whl",  # a URL's path
        "-r ${CI_TOKEN}.txt",
        "--extra-index-url https://pypi.example/${CI_TOKEN}/simple",
        "--find-links ./${CI_TOKEN}",
    ],
)
def test_a_secret_anywhere_else_is_refused_by_the_variables_name(tmp_path: Path, line: str) -> None:
    name = requirements(tmp_path, f"requests\n{line}\n".encode())
    result = _run(tmp_path, "-r", name)
    assert_one_error_line(result, f"{name}:2: ${{CI_TOKEN}} is substituted only in the")
    assert not (tmp_path / "out").exists()
    _assert_nowhere(tmp_path, result)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (f"AWS_SECRET_ACCESS_KEY=wJalr/{SECRET}\n", "secret.env:1: not a requirement line"),
        (f"ci:{SECRET}@files.example/acme-1.0-py3-none-any.whl\n", "secret.env:1: "),
        (f"aws_secret: {SECRET}/x\n", "secret.env:1: local path 'aws_secret: ***'"),
    ],
)
def test_a_secret_file_given_as_requirements_is_not_echoed(
    tmp_path: Path, data: str, said: str
) -> None:
    name = requirements(tmp_path, data.encode(), "secret.env")
    result = _run(tmp_path, "-r", name)
    assert_one_error_line(result, said)
    _assert_nowhere(tmp_path, result)


@pytest.mark.parametrize(
    "route",
    [
        "--index-url {at}/simple\n{project}==1.0\n",
        "--extra-index-url {at}/simple\n{project}==1.0\n",
        "--no-index\n--find-links {at}/simple/{project}/\n{project}==1.0\n",
        "{other} @ {at}/files/{wheel}\n",
    ],
)
def test_a_wrong_password_is_an_authentication_failure_naming_the_host(
    tmp_path: Path, index: tuple[int, Path], route: str
) -> None:
    port, other = index
    at = f"http://ci:${{WRONG_TOKEN}}@127.0.0.1:{port}"
    text = route.format(at=at, project=PRIVATE, other=OTHER, wheel=other.name)
    name = requirements(tmp_path, text.encode())
    os.environ["WRONG_TOKEN"] = "not-" + SECRET[::-1]
    try:
        result = _run(tmp_path, "-r", name)
    finally:
        del os.environ["WRONG_TOKEN"]
    line = assert_one_error_line(result, f"authentication failed at 127.0.0.1:{port} (")
    assert "401 Unauthorized" in line
    assert "no such distribution" not in line
    assert SECRET[::-1] not in result.stdout + result.stderr


def test_a_fifo_is_refused_in_one_line_as_a_file_an_include_or_an_override(
    tmp_path: Path,
) -> None:
    """Nothing ever writes to the FIFO: a run that opened it to read would wait forever (the
    subprocess' timeout fails the test instead)."""
    os.mkfifo(tmp_path / "fifo.txt")
    plain = requirements(tmp_path, b"requests\n")
    nested = requirements(tmp_path, b"requests\n-r fifo.txt\n", "nested.txt")
    for args, said in [
        (("-r", "fifo.txt"), "fifo.txt: a FIFO, not a requirements file"),
        (("-r", nested), "fifo.txt: a FIFO, not a requirements file"),
        (("-r", plain, "-c", "fifo.txt"), "fifo.txt: a FIFO, not a requirements file"),
        (("-r", plain, "--override", "fifo.txt"), "fifo.txt: a FIFO, not a uv override file"),
    ]:
        assert_one_error_line(_run(tmp_path, *args), said)
