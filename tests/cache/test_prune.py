"""Seeing and trimming the cache on a real directory: sizes by kind, least recently used first,
never an entry a running run used, bad sizes refused before anything is removed.

The entries are written through the cache's own API and aged with `os.utime` (no sleeping);
tests/integration/test_cache_bounds.py does the same on a cache a real build made.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest
from support.clirun import assert_one_error_line, run

from builder.cache import RUNS, Cache
from builder.cache.bound import Bounded, bounded_use, default_bound, parse_size
from builder.cache.layout import Kind, entries
from builder.cache.prune import Pruned, prune, usage
from builder.config import load_config
from builder.errors import UserError

DAY = 86_400


def blob(cache: Cache, data: bytes, filename: str, age_days: float) -> Path:
    """A blob written through the cache, last used `age_days` ago."""
    source = cache.root.parent / f"source-{filename}"
    source.write_bytes(data)
    path, _ = cache.add_blob(source, filename)
    used = time.time() - age_days * DAY
    os.utime(path, (used, used))
    return path


def filled(tmp_path: Path) -> tuple[Cache, dict[str, Path]]:
    cache = Cache(tmp_path / "cache")
    paths = {
        "old-wheel": blob(cache, b"w" * 4000, "old-1.0-py3-none-any.whl", 30),
        "layer": blob(cache, b"l" * 3000, "layer.tar", 10),
        "bytecode": blob(cache, b"b" * 2000, "bytecode.tar.gz", 5),
        "new-wheel": blob(cache, b"n" * 1000, "new-1.0-py3-none-any.whl", 1),
    }
    cache.put_record("resolution", "ab" * 32, {"pins": ["new==1.0"]})
    return cache, paths


def test_usage_says_each_kind_and_the_location(tmp_path: Path) -> None:
    cache, _ = filled(tmp_path)
    found = usage(cache)
    assert found.sizes[Kind.WHEELS] == 5000
    assert found.sizes[Kind.LAYERS] == 3000
    assert found.sizes[Kind.BYTECODE] == 2000
    assert found.counts[Kind.RECORDS] == 1
    assert found.to_dict()["location"] == str(cache.root.absolute())
    assert usage(Cache(tmp_path / "none")).total == 0


def test_prune_removes_least_recently_used_first_until_it_fits(tmp_path: Path) -> None:
    cache, paths = filled(tmp_path)
    pruned = prune(cache, keep=5500)
    assert not paths["old-wheel"].exists() and not paths["layer"].exists()
    assert paths["bytecode"].exists() and paths["new-wheel"].exists()
    assert pruned.removed == 2 and pruned.freed == 7000
    assert pruned.left == usage(cache).total <= 5500


def test_older_than_removes_what_was_unused_that_long(tmp_path: Path) -> None:
    cache, paths = filled(tmp_path)
    prune(cache, keep=None, older_than=7 * DAY)
    assert [name for name, path in paths.items() if path.exists()] == ["bytecode", "new-wheel"]


def test_a_found_entry_is_used_again_and_goes_last(tmp_path: Path) -> None:
    cache, paths = filled(tmp_path)
    sha = paths["old-wheel"].parent.name
    assert cache.find_blob(sha, paths["old-wheel"].name) == paths["old-wheel"]
    prune(cache, keep=1000 + 4000 + 200)  # room for two blobs and the record
    assert paths["old-wheel"].exists() and paths["new-wheel"].exists()
    assert not paths["layer"].exists()


def test_nothing_a_running_run_used_is_removed(tmp_path: Path) -> None:
    cache, paths = filled(tmp_path)
    with cache.in_use():
        sha = paths["layer"].parent.name
        assert cache.find_blob(sha, "layer.tar") is not None  # the run uses it
        assert cache.get_record("resolution", "ab" * 32) is not None
        written = blob(cache, b"x" * 500, "layer.tar.gz", 0)  # and writes one
        os.utime(written)
        pruned = prune(cache, keep=0)
        assert paths["layer"].exists() and written.exists()
        assert cache.get_record("resolution", "ab" * 32) is not None
        assert not paths["old-wheel"].exists() and not paths["bytecode"].exists()
        assert pruned.held == 3 and pruned.running == 1
    assert prune(cache, keep=0).removed == 3  # once the run ended
    assert usage(cache).sizes[Kind.LAYERS] == 0


def test_a_dead_runs_file_holds_nothing(tmp_path: Path) -> None:
    cache, paths = filled(tmp_path)
    runs = cache.root / RUNS
    runs.mkdir()
    (runs / "12345-dead").write_text("0")  # a run that died: its file, no lock
    pruned = prune(cache, keep=0)
    assert pruned.running == 0 and not any(path.exists() for path in paths.values())
    assert not (runs / "12345-dead").exists()


def test_a_live_run_with_an_unreadable_start_holds_everything(tmp_path: Path) -> None:
    cache, paths = filled(tmp_path)
    runs = cache.root / RUNS
    runs.mkdir()
    with (runs / "1-odd").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert prune(cache, keep=0).held == 5
    assert all(path.exists() for path in paths.values())


def test_an_unfinished_write_of_an_ended_run_goes_one_in_progress_stays(tmp_path: Path) -> None:
    cache, _ = filled(tmp_path)
    stale, live = cache.root / ".partial-stale", cache.root / ".gzip-live"
    stale.write_bytes(b"s" * 100)
    os.utime(stale, (time.time() - DAY, time.time() - DAY))
    with cache.in_use():
        live.write_bytes(b"l" * 100)
        prune(cache, keep=None)
    assert not stale.exists() and live.exists()
    assert [e.kind for e in entries(cache.root) if e.path == live] == [Kind.UNFINISHED]


def test_a_bounded_run_prunes_after_it_ends(tmp_path: Path) -> None:
    cache, paths = filled(tmp_path)
    with bounded_use(cache, 1500) as bound:
        assert cache.find_blob(paths["layer"].parent.name, "layer.tar")  # used by this run
        assert bound.pruned is None
    assert bound.pruned is not None and bound.pruned.left <= 1500
    assert not paths["layer"].exists()
    assert "to its bound of 1.5 kB" in str(bound.summary())
    with bounded_use(cache, 0) as unbounded:
        pass
    assert unbounded.pruned is None and "unbounded" in str(unbounded.summary())
    assert Bounded(10, Pruned(0, 0, 5)).summary() is None  # nothing to do: silent


def test_the_default_bound_is_the_smaller_of_20_gb_and_a_tenth_of_the_disk(tmp_path: Path) -> None:
    stats = os.statvfs(tmp_path)
    tenth = stats.f_blocks * stats.f_frsize // 10
    assert default_bound(tmp_path / "not" / "yet") == min(20 * 10**9, tenth)


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("1500", 1500), ("20GB", 20 * 10**9), ("2G", 2 << 30), ("1.5 MiB", 3 << 19)],
)
def test_sizes_as_an_operator_writes_them(text: str, size: int) -> None:
    assert parse_size(text, "--cache-max") == size


@pytest.mark.parametrize(
    ("text", "why"), [("lots", "e.g. 20GB"), ("-5GB", "negative"), ("5 parsecs", "e.g.")]
)
def test_a_bad_size_is_named(text: str, why: str) -> None:
    with pytest.raises(UserError, match=why):
        parse_size(text, "--cache-max")


@pytest.mark.parametrize("value", ['"lots"', "-1", "true"])
def test_the_configs_cache_max_is_checked(tmp_path: Path, value: str) -> None:
    config = tmp_path / "build-sandbox-image.toml"
    config.write_text(
        f'requirements = ["r.txt"]\nbase-repository = "x/y"\nplatform-version = "1"\n'
        f"cache-max = {value}\n"
    )
    with pytest.raises(UserError, match="'cache-max'"):
        load_config(config)
    config.write_text(config.read_text().replace(f"cache-max = {value}", 'cache-max = "2GB"'))
    assert load_config(config).cache_max == 2 * 10**9


def _snapshot(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (("-r", "r.txt", "--cache-max", "lots"), "--cache-max: 'lots'"),
        (("-r", "r.txt", "--cache-max", "-1GB"), "negative"),
        (("cache", "prune", "--keep", "-5"), "--keep: '-5'"),
        (("cache", "prune", "--keep", "lots"), "--keep: 'lots'"),
        (("cache", "prune", "--older-than", "-1"), "--older-than: '-1'"),
        (("cache", "prune", "--older-than", "a week"), "--older-than: 'a week'"),
    ],
)
def test_bad_input_is_one_error_line_and_removes_nothing(
    tmp_path: Path, args: tuple[str, ...], culprit: str
) -> None:
    cache, _ = filled(tmp_path)
    (tmp_path / "r.txt").write_text("six\n")
    before = _snapshot(cache.root)
    assert_one_error_line(run(tmp_path, *args), culprit)
    assert _snapshot(cache.root) == before


def test_the_cache_command_reads_the_cache_it_is_given(tmp_path: Path) -> None:
    cache, _ = filled(tmp_path)
    result = run(tmp_path, "cache", "--json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["location"] == str(cache.root) and shown["total"] == usage(cache).total
    assert shown["kinds"]["wheels"] == {"size": 5000, "entries": 2}


def test_a_closing_prune_that_fails_warns_and_leaves_the_runs_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, paths = filled(tmp_path)

    def broken(*_: object, **__: object) -> Pruned:
        raise PermissionError(13, "Permission denied", str(cache.root / "blobs"))

    monkeypatch.setattr("builder.cache.bound.prune", broken)
    with pytest.raises(KeyError), bounded_use(cache, 1) as bound:
        raise KeyError("the run's own failure")  # still what the caller sees
    assert (
        bound.summary()
        == f"warning: cache: not pruned to its bound (Permission denied: {cache.root / 'blobs'})"
    )
    assert all(path.exists() for path in paths.values())
