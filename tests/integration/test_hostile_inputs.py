"""Hostile requirements through the real CLI (issue 59): a project linking to a host file, a
console script named out of bin/, a zip bomb. Each is one `error:` line naming its culprit, in
seconds, and nothing of it reaches the cache, the output or uv's cache: a plan (`--no-build`)
writes the layers, so a plan that stops proves no layer holds it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from support.clirun import assert_one_error_line, run
from support.projects import pure_project
from support.wheelfactory import make_wheel, zip_bomb

BOMB = 1 << 30  # zeros: a wheel of about 1 MB


@pytest.fixture(autouse=True)
def uv_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv's cache under the test's directory, so that what uv unpacks is counted too."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


def _bytes_under(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def test_a_host_file_behind_a_link_in_a_local_project_reaches_no_layer(tmp_path: Path) -> None:
    secret = f"host-{uuid.uuid4().hex}"
    host_file = tmp_path / "host" / "credentials.json"
    host_file.parent.mkdir()
    host_file.write_text(f'{{"token": "{secret}"}}\n')
    project = pure_project(tmp_path / "proj", "bsi-linked", "1.0", "bsi_linked", "V = 1\n")
    (project / "bsi_linked" / "config.py").symlink_to(host_file)
    (tmp_path / "requirements.txt").write_text("--no-index\n./proj\n")
    result = run(tmp_path, "-r", "requirements.txt", "--output", "out")
    assert_one_error_line(
        result, "requirements.txt:2: ", "'bsi_linked/config.py' links outside the project"
    )
    assert not (tmp_path / "out").exists()
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    assert [p for p in written if secret.encode() in p.read_bytes()] == [host_file]


def test_a_console_script_out_of_bin_is_refused_naming_its_distribution(tmp_path: Path) -> None:
    entry_points = b"[console_scripts]\n../../../etc/cron.d/x = bsi_scripted:main\n"
    wheel = make_wheel(
        tmp_path / "vendor",
        "bsi-scripted",
        "1.0",
        "py3-none-any",
        {
            "bsi_scripted/__init__.py": b"",
            "bsi_scripted-1.0.dist-info/entry_points.txt": entry_points,
        },
    )
    (tmp_path / "requirements.txt").write_text("--no-index\n-f vendor\nbsi-scripted\n")
    result = run(tmp_path, "-r", "requirements.txt", "--output", "out")
    assert_one_error_line(
        result, f"{wheel.name}: console script '../../../etc/cron.d/x' is not a plain file name"
    )
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zip_bomb(tmp_path_factory.mktemp("bomb"), "bsi-bomb", BOMB)


@pytest.mark.parametrize(
    ("lines", "flags"),
    [
        ("{bomb}\n", ("--wheel-max", "64MiB")),  # a direct requirement: uv would unpack it
        ("-f {house}\nbsi-bomb\n", ("--wheel-max", "64MiB")),  # in a local wheelhouse: so too
        ("{bomb}\n", ()),  # the default: past 1 GiB, a thousand times its size
    ],
)
def test_a_zip_bomb_is_refused_in_seconds_leaving_the_disk_as_it_was(
    tmp_path: Path, bomb: Path, lines: str, flags: tuple[str, ...]
) -> None:
    text = "--no-index\n" + lines.format(bomb=bomb, house=bomb.parent)
    (tmp_path / "requirements.txt").write_text(text)
    started = time.monotonic()
    result = run(tmp_path, "-r", "requirements.txt", "--output", "out", *flags)
    elapsed = time.monotonic() - started
    bound = "the bound of 67.1 MB" if flags else "100 times its size"
    line = assert_one_error_line(
        result, f"{bomb.name}: unpacks to 1.1 GB from 1.0 MB, more than {bound}", "--wheel-max"
    )
    if "-f" not in lines:  # a direct requirement's: its line named too
        assert line.startswith("error: requirements.txt:2: ")
    assert elapsed < 30, elapsed
    assert _bytes_under(tmp_path) < 3 * bomb.stat().st_size  # its copy in the cache at most


def test_a_bad_wheel_max_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("six\n")
    result = run(tmp_path, "-r", "requirements.txt", "--wheel-max", "lots")
    assert result.returncode != 0 and "--wheel-max: 'lots' is not a size" in result.stderr


@pytest.mark.parametrize("where", ["direct", "wheelhouse"])
def test_a_fifo_named_as_a_wheel_is_refused_without_waiting(tmp_path: Path, where: str) -> None:
    """A wheel path, or a wheelhouse entry, that is a FIFO would be read (hashed, or opened by
    the resolver) forever: refused in one line, at once."""
    import os

    (tmp_path / "vendor").mkdir()
    os.mkfifo(tmp_path / "vendor" / "bsi_fifo-1.0-py3-none-any.whl")
    line = "./vendor/bsi_fifo-1.0-py3-none-any.whl" if where == "direct" else "-f vendor\nbsi-fifo"
    (tmp_path / "requirements.txt").write_text(f"--no-index\n{line}\n")
    started = time.monotonic()
    result = run(tmp_path, "-r", "requirements.txt", "--output", "out")
    assert_one_error_line(
        result,
        "bsi_fifo-1.0-py3-none-any.whl",
        "FIFO" if where == "direct" else "not a regular file",
    )
    assert time.monotonic() - started < 30
    assert not (tmp_path / "out").exists()
