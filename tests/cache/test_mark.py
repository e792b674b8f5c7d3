"""The cache touches only a cache, on real directories: a project folder given as `--cache-dir`
survives `cache`, `cache prune`, `cache clean`, a build and `part` (every byte, every mode), each
refused in one line; a marked cache keeps what the tool did not write; an earlier version's
unmarked cache is adopted and marked; `/`, the home and the working directory are refused; uv's
cache lives inside the tool's, counted, pruned (never under a running uv) and cleaned.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.clirun import assert_one_error_line, run
from support.wheelfactory import make_wheel

from builder.cache import BLOB_MEMORY, Cache
from builder.cache.bound import parse_size
from builder.cache.layout import TAG, Kind, entries
from builder.cache.mark import SIGNATURE, opened, refusal
from builder.cache.prune import clean, prune, usage
from builder.errors import UserError, human
from builder.resolve.index import UV, run_uv

DAY = 86_400


def project(root: Path) -> Path:
    """A folder a user keeps: files, a subfolder, a symlink, a read-only file and a `.git`."""
    (root / "project" / ".git").mkdir(parents=True)
    (root / "project" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "project" / "src").mkdir()
    (root / "project" / "src" / "main.py").write_text("print('hi')\n")
    (root / "README.md").write_text("# mine\n")
    (root / "notes.txt").write_bytes(b"x" * 10)
    (root / "readonly.txt").write_text("keep\n")
    (root / "readonly.txt").chmod(0o444)
    (root / "link").symlink_to("notes.txt")
    return root


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every path under `root`: its mode, and its bytes (a symlink: its target)."""
    found: dict[str, tuple[int, bytes | str]] = {}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(top) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[str(path)] = (mode, os.readlink(path))
            else:
                found[str(path)] = (mode, b"" if stat.S_ISDIR(mode) else path.read_bytes())
    return found


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", *args], capture_output=True, text=True, cwd=cwd
    )


@pytest.mark.parametrize(
    "args",
    [
        ("cache",),
        ("cache", "--json"),
        ("cache", "prune", "--keep", "0B"),
        ("cache", "prune", "--older-than", "0"),
        ("cache", "clean"),
        ("-r", "r.txt", "--no-build", "--output", "out"),
        ("part", "plan", "--arch", "amd64", "--push", "127.0.0.1:5000/x/y"),
    ],
)
def test_a_project_folder_given_as_the_cache_is_refused_and_kept_whole(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    folder = project(tmp_path / "mine")
    (tmp_path / "r.txt").write_text("six\n")
    (tmp_path / "plan").mkdir()  # refused before the plan is read
    before = snapshot(folder)
    result = cli(tmp_path, *args, "--cache-dir", str(folder))
    assert_one_error_line(result, f"cache directory {folder}:", "not a build-sandbox-image cache")
    assert snapshot(folder) == before
    assert not (tmp_path / "out").exists()


def test_a_symlink_to_a_project_folder_is_judged_by_what_it_points_at(tmp_path: Path) -> None:
    folder = project(tmp_path / "mine")
    (tmp_path / "to-mine").symlink_to(folder)
    before = snapshot(folder)
    assert_one_error_line(cli(tmp_path, "cache", "clean", "--cache-dir", "to-mine"), "to-mine")
    assert snapshot(folder) == before


def test_a_marked_cache_keeps_what_the_tool_did_not_write(tmp_path: Path) -> None:
    cache = opened(tmp_path / "cache")
    root = cache.root
    cache.put_record("resolution", "ab" * 32, {"pins": []})
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"w" * 100)
    blob, _ = cache.add_blob(wheel, "w-1.0-py3-none-any.whl")
    (root / BLOB_MEMORY).write_text("{}")
    (root / "mine.txt").write_text("not the tool's\n")
    (root / "blobs" / "stray.bin").write_bytes(b"s" * 5)
    (root / "resolution" / "notes.md").write_text("mine\n")
    project(root / "work")
    odd_blob = root / "blobs" / "cd" / ("cd" * 32)
    (odd_blob / "sub").mkdir(parents=True)  # a blob's directory never holds a folder
    (odd_blob / "sub" / "mine.txt").write_text("mine\n")
    strays = {"mine.txt", "blobs/stray.bin", "resolution/notes.md", "work", f"blobs/cd/{'cd' * 32}"}
    kept = {path: snapshot(root / path) for path in strays if (root / path).is_dir()}

    shown = cli(tmp_path, "cache", "--cache-dir", "cache")
    assert shown.returncode == 0, shown.stderr
    assert "unknown" in shown.stdout and "kept 5 unknown entries" in shown.stdout
    result = cli(tmp_path, "cache", "clean", "--cache-dir", "cache")
    assert result.returncode == 0, result.stderr
    assert "kept 5 unknown entries (not written by this tool)" in result.stdout
    assert not blob.exists() and not (root / BLOB_MEMORY).exists()
    assert cache.get_record("resolution", "ab" * 32) is None
    assert all((root / path).exists() for path in strays)
    assert all(snapshot(root / path) == before for path, before in kept.items())
    assert (root / TAG).read_text().startswith(SIGNATURE + "\n")
    assert usage(cache).total == 0 and {str(p) for p in usage(cache).unknown} == strays


def test_a_new_or_empty_directory_becomes_a_marked_cache(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "new" / "nested", tmp_path / "empty"):
        opened(root)
        assert (root / TAG).read_text().splitlines()[0] == SIGNATURE
        assert "build-sandbox-image" in (root / TAG).read_text()
    assert not opened(tmp_path / "missing", create=False).root.exists()  # `cache` only reads


def test_an_earlier_versions_unmarked_cache_is_adopted_and_marked(tmp_path: Path) -> None:
    old = Cache(tmp_path / "cache")  # written through the API, as an earlier version did
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"w" * 100)
    path, _ = old.add_blob(wheel, "w-1.0-py3-none-any.whl")
    old.put_record("inspect", "cd" * 32, {"schema": 1})
    (old.root / "layer-gzip" / "ef").mkdir(parents=True)
    (old.root / "layer-gzip" / "ef" / f"{'ef' * 32}.lock").touch()  # an older tool's lock
    (old.root / ".partial-abc").write_bytes(b"p")
    (old.root / BLOB_MEMORY).write_text("{}")
    with old.in_use():
        pass
    assert not (old.root / TAG).exists()
    assert not any(entry.kind is Kind.UNKNOWN for entry in entries(old.root))
    result = cli(tmp_path, "cache", "--cache-dir", "cache")
    assert result.returncode == 0, result.stderr
    assert (old.root / TAG).read_text().startswith(SIGNATURE)
    assert path.exists() and "wheels" in result.stdout


@pytest.mark.parametrize("place", ["/", "home", "cwd", "parent of cwd"])
def test_the_root_the_home_and_the_working_directory_are_refused(
    tmp_path: Path, place: str
) -> None:
    marked = opened(tmp_path / "work").root  # even a marked one
    given = {"/": "/", "home": str(Path.home()), "cwd": ".", "parent of cwd": ".."}[place]
    before = snapshot(marked)
    for args in (("cache", "clean"), ("-r", "r.txt", "--no-build")):
        result = cli(marked, *args, "--cache-dir", given)
        assert_one_error_line(result, f"cache directory {given}:")
    assert snapshot(marked) == before


def test_a_parent_of_the_output_is_refused(tmp_path: Path) -> None:
    opened(tmp_path / "cache")
    (tmp_path / "r.txt").write_text("six\n")
    output = tmp_path / "cache" / "context"
    result = run(tmp_path, "-r", "r.txt", "--output", str(output))  # clirun: --cache-dir ./cache
    assert_one_error_line(result, "cache directory", "holds the output directory")
    assert not output.exists()


def test_where_no_cache_may_be() -> None:
    home, cwd = Path("/home/u"), Path("/home/u/proj")
    assert refusal(Path("/"), home, cwd) == "is the file system's root"
    assert refusal(home, home, cwd) == "is your home directory"
    assert refusal(Path("/home"), home, cwd) == "holds your home directory (/home/u)"
    assert refusal(cwd, home, cwd) == "is the working directory"
    out = ("the output directory", Path("/srv/build/context"))
    assert refusal(Path("/srv/build"), home, cwd, (out,)) == (
        "holds the output directory (/srv/build/context)"
    )
    assert refusal(Path("/home/u/.cache/build-sandbox-image"), home, cwd, (out,)) is None
    assert refusal(Path("/home/u/proj/.bsi-cache"), home, cwd, (out,)) is None


def test_another_programs_tag_is_not_ours(tmp_path: Path) -> None:
    (tmp_path / "uv").mkdir()
    (tmp_path / "uv" / TAG).write_text(f"{SIGNATURE}\n# created by uv\n")
    with pytest.raises(UserError, match="another program's"):
        opened(tmp_path / "uv")


def test_a_tag_that_only_mentions_the_tool_is_another_programs(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / TAG).write_text(f"{SIGNATURE}\n# ccache's; not build-sandbox-image's\n")
    with pytest.raises(UserError, match="another program's"):
        opened(tmp_path / "c")


@pytest.mark.parametrize(
    "layout",
    [
        {"uv/mine/file": "precious\n", "runs/notes.txt": "1\n"},  # no earlier version wrote uv/
        {"data/ab/abc.json": "{}\n"},  # a record's shape, but no blob: not a cache of ours
        {"locks/x.lock": ""},
    ],
)
@pytest.mark.parametrize("command", [("cache",), ("cache", "clean"), ("cache", "prune")])
def test_an_unmarked_folder_of_the_layouts_shape_without_a_blob_is_not_adopted(
    tmp_path: Path, layout: dict[str, str], command: tuple[str, ...]
) -> None:
    """An earlier version's cache always held blobs; a folder that only looks like parts of the
    layout is someone's, refused and kept byte for byte (no mark written either)."""
    folder = tmp_path / "c"
    for name, text in layout.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    before = snapshot(folder)
    result = cli(tmp_path, *command, "--cache-dir", str(folder))
    assert_one_error_line(result, f"cache directory {folder}:", "not a build-sandbox-image cache")
    assert snapshot(folder) == before


@pytest.mark.parametrize("text", ["0.5", "0.4B", "0.0009KB", ".1"])
def test_a_size_below_one_byte_is_refused(text: str) -> None:
    with pytest.raises(UserError, match=f"--cache-max: '{text}' is below one byte"):
        parse_size(text, "--cache-max")
    assert parse_size("0", "--cache-max") == 0 and parse_size("0.5KB", "--cache-max") == 500


def test_a_cache_max_below_one_byte_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("six\n")
    assert_one_error_line(run(tmp_path, "-r", "r.txt", "--cache-max", "0.5"), "'0.5'", "byte")
    config = tmp_path / "build-sandbox-image.toml"
    config.write_text(
        'requirements = ["r.txt"]\nbase-repository = "x/y"\nplatform-version = "1"\n'
        'cache-max = "0.4B"\n'
    )
    result = run(tmp_path, "--config", str(config))
    assert_one_error_line(result, "'cache-max'", "'0.4B' is below one byte")


def _uv_compile(cache: Cache, links: Path, requirements: Path) -> subprocess.CompletedProcess[str]:
    command = [UV, "pip", "compile", str(requirements), "--no-index", "--find-links", str(links)]
    return run_uv([*command, "--quiet", "--no-header", "--no-annotate"], cache)


def test_uv_keeps_its_cache_inside_the_tools_counted_pruned_and_cleaned(tmp_path: Path) -> None:
    links = tmp_path / "links"
    make_wheel(links, "bsi-a", "1.0", "py3-none-any", {"bsi_a/__init__.py": b"x = 1\n" * 500})
    (tmp_path / "requirements.in").write_text("bsi-a\n")
    cache = opened(tmp_path / "cache")
    result = _uv_compile(cache, links, tmp_path / "requirements.in")
    assert result.returncode == 0 and result.stdout.strip() == "bsi-a==1.0", result.stderr
    assert (cache.root / "uv").is_dir()
    found = usage(cache)
    assert found.counts[Kind.UV] == 1 and found.sizes[Kind.UV] > 0
    shown = cli(tmp_path, "cache", "--cache-dir", "cache")
    assert [line.split()[1:2] for line in shown.stdout.splitlines() if line.startswith("  uv")] == [
        human(found.sizes[Kind.UV]).split()[:1]
    ]

    lock = cache.root / "locks" / "uv.lock"
    os.utime(lock, (time.time() - DAY, time.time() - DAY))  # last used a day ago
    with cache.uv_cache():  # a uv of another run is using it now
        os.utime(lock, (time.time() - DAY, time.time() - DAY))
        pruned = prune(cache, keep=0)
        assert (cache.root / "uv").is_dir() and pruned.held == 1
    pruned = prune(cache, keep=0)  # the lock's last use (a day ago) is before now
    assert not (cache.root / "uv").exists() and pruned.kinds[Kind.UV] > 0

    assert _uv_compile(cache, links, tmp_path / "requirements.in").returncode == 0
    assert clean(cache).kinds[Kind.UV] > 0 and not (cache.root / "uv").exists()
    assert (cache.root / TAG).exists()
