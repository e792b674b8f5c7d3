"""Bad input through the real CLI: one `error:` line on stderr, exit 1, no traceback, no secret.

All but the hash test fail before any index traffic; the hash test resolves against PyPI.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from support.clirun import SECRET, assert_one_error_line, requirements, run

from builder.cli.app import reports_errors
from builder.errors import UserError


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        (b"soupsieve\n# caf\xe9\n", ("requirements.txt:2: not UTF-8 text",)),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ("requirements.txt: binary data",)),
        (b"rtdemo; python_version >= 'x'\n", ("requirements.txt:1: invalid marker",)),
        (b"x.whl\n", ("requirements.txt:1: local path 'x.whl' does not exist",)),
        (b"foo (>=1\n", ("requirements.txt:1: invalid requirement 'foo (>=1'",)),
        (b"soupsieve --hashfoo=bar\n", ("requirements.txt:1: per-requirement option --hashfoo",)),
        (b"CI_TOKEN=" + SECRET.encode() + b"\n", ("requirements.txt:1: not a requirement line",)),
        (f"-i https://ci:{SECRET}@x/simple\nx.zip\n".encode(), ("requirements.txt:2:",)),
    ],
)
def test_bad_requirement_files_are_one_line(
    tmp_path: Path, data: bytes, fragments: tuple[str, ...]
) -> None:
    result = run(tmp_path, "-r", requirements(tmp_path, data), "--output", "out")
    assert_one_error_line(result, *fragments)
    assert not (tmp_path / "out").exists()


def test_utf16_file_is_read_and_proc_environ_is_not_echoed(tmp_path: Path) -> None:
    name = requirements(tmp_path, "soupsieve\nx.tar.gz\n".encode("utf-16"))
    assert_one_error_line(run(tmp_path, "-r", name), f"{name}:2: local path 'x.tar.gz' does not")
    result = run(tmp_path, "-r", "/proc/self/environ")
    assert_one_error_line(result, "/proc/self/environ: binary data")


def test_deep_chains_and_symlink_loops_are_one_line(tmp_path: Path) -> None:
    for depth in range(1200):
        requirements(tmp_path, f"-r r{depth + 1}.txt\n".encode(), f"r{depth}.txt")
    assert_one_error_line(run(tmp_path, "-r", "r0.txt"), "r50.txt: -r/-c files nested more")
    (tmp_path / "loop").symlink_to("loop")
    assert_one_error_line(run(tmp_path, "-r", "loop"), "loop: cannot read requirements file")


def test_outputs_that_would_lose_data_or_cannot_work_are_one_line(tmp_path: Path) -> None:
    name = requirements(tmp_path, b"soupsieve\n")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "report.json").write_text("{}")
    (project / "main.py").write_text("x\n")
    line = assert_one_error_line(run(tmp_path, "-r", name, "--output", "proj"), str(project))
    assert "main.py, report.json" in line
    assert (project / "main.py").read_text() == "x\n"
    (tmp_path / "file").write_text("x")
    assert_one_error_line(run(tmp_path, "-r", name, "--output", "file"), "not a directory")
    assert_one_error_line(run(tmp_path, "-r", name, "--output", "file/sub"), "not a directory")
    (tmp_path / "loop").symlink_to("loop")
    assert_one_error_line(run(tmp_path, "-r", name, "--output", "loop"), "is a symbolic link")
    assert_one_error_line(run(tmp_path, "-r", name, "--output", "/sys/bsi/out"), "/sys/bsi")
    assert (tmp_path / "file").read_text() == "x"


def command(failure: BaseException) -> click.Command:
    @click.command()
    @reports_errors
    def failing() -> None:
        raise failure

    return failing


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (UserError("a.txt:1: bad\nsecond line"), "error: a.txt:1: bad second line"),
        (PermissionError(13, "Permission denied", "/root/x"), "error: /root/x: Permission denied"),
        (
            ValueError(f"see https://ci:{SECRET}@host/simple"),
            "error: internal: ValueError: see https://***@host/simple (rerun with BSI_DEBUG=1"
            " for the traceback)",
        ),
        (RecursionError("too deep"), "error: internal: RecursionError: too deep (rerun with"),
    ],
)
def test_reports_errors_prints_one_line(failure: Exception, expected: str) -> None:
    result = CliRunner().invoke(command(failure), env={"BSI_DEBUG": ""})
    assert result.exit_code == 1
    assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1


def test_debug_shows_the_traceback_and_usage_errors_pass() -> None:
    result = CliRunner().invoke(command(KeyError("k")), env={"BSI_DEBUG": "1"})
    assert isinstance(result.exception, KeyError)
    usage = CliRunner().invoke(command(click.UsageError("give -r")))
    assert usage.exit_code == 2 and "give -r" in usage.stderr


@pytest.mark.usefixtures("package_index")
def test_given_hashes_are_honoured(tmp_path: Path) -> None:
    wrong = "0" * 64
    name = requirements(tmp_path, f"soupsieve==2.6 --hash=sha256:{wrong}\n".encode())
    line = assert_one_error_line(run(tmp_path, "-r", name, "--output", "out"), "soupsieve==2.6:")
    digests = re.findall(r"sha256:([0-9a-f]{64})", line)
    assert wrong in digests and len(set(digests)) == 2
    actual = next(d for d in digests if d != wrong)
    requirements(tmp_path, f"soupsieve==2.6 --hash=sha256:{actual}\n".encode(), name)
    result = run(tmp_path, "-r", name, "--output", "out")
    assert result.returncode == 0, result.stderr
    assert f"--hash=sha256:{actual}" in (tmp_path / "out" / "requirements-amd64.lock").read_text()
    requirements(tmp_path, b"--require-hashes\nsoupsieve==2.6\n", name)
    assert_one_error_line(run(tmp_path, "-r", name), f"{name}:2: soupsieve needs an == pin")


def test_version_prints_the_installed_distributions_version_and_exits_0(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "builder", "--version"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"build-sandbox-image {metadata.version('build-sandbox-image')}\n"
    assert result.stderr == ""
