"""The cache commands and the bound on a real cache: the example's set built with the real CLI on
the real engine, into cache directories of the tests' own (never the user's).

What the issue asks to see: `cache`, `cache prune --keep 0` and `cache clean` on the cache a build
made, a rebuild after `clean`; a build with a small `--cache-max` ending within it, image built;
two builds sharing a small-bounded cache at once both succeeding; nothing removed on bad input.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clirun import assert_one_error_line
from support.images import build, docker, run_hardened

from builder.cache import Cache
from builder.cache.layout import Kind
from builder.cache.prune import usage

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "requirements.txt").read_text()
SMALL = 40 * 10**6  # bytes: well under the example's cache (about 300 MB)
KINDS = (Kind.WHEELS, Kind.LAYERS, Kind.BYTECODE, Kind.RECORDS)


def cache_cli(cache_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", "cache", *args, "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def shown(cache_dir: Path) -> dict:
    result = cache_cli(cache_dir, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def tags(test_env: dict) -> Iterator[list[str]]:
    """Unique image names a test builds, removed after it."""
    made: list[str] = []
    yield made
    for tag in made:
        docker(test_env, "rmi", "-f", tag, check=False)


def new_tag(tags: list[str]) -> str:
    tags.append(f"bsi-cache-{uuid.uuid4().hex[:10]}:test")
    return tags[-1]


@pytest.fixture(scope="module")
def example_cache(tmp_path_factory: pytest.TempPathFactory, test_env: dict) -> Path:
    """The cache one unbounded build of the example's set leaves."""
    work = tmp_path_factory.mktemp("example")
    cache_dir = work / "cache"
    tag = f"bsi-cache-{uuid.uuid4().hex[:10]}:example"
    try:
        result = build(
            work, cache_dir, test_env["base_image"], EXAMPLE, tag, "--cache-max", "0",
            "--no-verify",
        )  # fmt: skip
    finally:
        docker(test_env, "rmi", "-f", tag, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert result.stdout.count("cache: unbounded") == 1  # said once
    return cache_dir


def copy_of(example_cache: Path, tmp_path: Path) -> Path:
    """A test's own copy of the example's cache (hard links: the blobs are never written to)."""
    return Path(shutil.copytree(example_cache, tmp_path / "cache", copy_function=os.link))


def test_cache_shows_each_kind_of_the_examples_cache(example_cache: Path) -> None:
    found = shown(example_cache)
    assert found["location"] == str(example_cache)
    for kind in KINDS:
        assert found["kinds"][kind.value]["size"] > 0, kind
    assert found["total"] == usage(Cache(example_cache)).total
    text = cache_cli(example_cache)
    assert str(example_cache) in text.stdout and "layers" in text.stdout


def test_prune_keep_0_then_clean_empty_it_and_a_rebuild_succeeds(
    example_cache: Path, tmp_path: Path, test_env: dict, tags: list[str]
) -> None:
    cache_dir = copy_of(example_cache, tmp_path)
    before = shown(cache_dir)["total"]
    half = cache_cli(cache_dir, "prune", "--keep", str(before // 2))
    assert half.returncode == 0, half.stderr
    assert 0 < shown(cache_dir)["total"] <= before // 2
    pruned = cache_cli(cache_dir, "prune", "--keep", "0")
    assert pruned.returncode == 0 and "removed" in pruned.stdout, pruned.stderr
    found = shown(cache_dir)
    assert all(found["kinds"][kind.value]["size"] == 0 for kind in KINDS), found
    cleaned = cache_cli(cache_dir, "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert shown(cache_dir)["total"] == 0
    tag = new_tag(tags)
    rebuilt = build(tmp_path, cache_dir, test_env["base_image"], EXAMPLE, tag, "--no-verify")
    assert rebuilt.returncode == 0, rebuilt.stdout[-3000:] + rebuilt.stderr
    assert run_hardened(test_env, tag, "import bs4, lightgbm, magic").returncode == 0
    assert shown(cache_dir)["kinds"]["wheels"]["size"] > 0  # filled again


def test_a_small_cache_max_ends_within_it_with_the_image_built(
    example_cache: Path, tmp_path: Path, test_env: dict, tags: list[str]
) -> None:
    cache_dir = copy_of(example_cache, tmp_path)
    assert shown(cache_dir)["total"] > SMALL  # the set needs more than the bound
    tag = new_tag(tags)
    result = build(
        tmp_path, cache_dir, test_env["base_image"], EXAMPLE, tag,
        "--cache-max", str(SMALL), "--no-verify",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "to its bound of 40.0 MB" in result.stdout
    assert shown(cache_dir)["total"] <= SMALL
    assert run_hardened(test_env, tag, "import lightgbm").returncode == 0


def test_two_builds_sharing_a_small_bounded_cache_both_succeed(
    tmp_path: Path, test_env: dict, tags: list[str]
) -> None:
    cache_dir = tmp_path / "shared"
    runs = []
    for name in ("one", "two"):
        work = tmp_path / name
        work.mkdir()
        (work / "requirements.txt").write_text(EXAMPLE)
        command = [
            sys.executable, "-m", "builder", "-r", str(work / "requirements.txt"),
            "--base-image", test_env["base_image"], "--tag", new_tag(tags),
            "--output", str(work / "context"), "--cache-dir", str(cache_dir),
            "--cache-max", str(SMALL), "--no-verify",
        ]  # fmt: skip
        runs.append(
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    for run in runs:
        out, err = run.communicate(timeout=1200)
        assert run.returncode == 0, out[-3000:] + err
    for tag in tags:
        assert run_hardened(test_env, tag, "import bs4").returncode == 0
    found = shown(cache_dir)
    assert found["total"] <= SMALL and found["running"] == 0


def test_a_bad_bound_is_refused_and_the_real_cache_keeps_everything(
    example_cache: Path, tmp_path: Path, test_env: dict
) -> None:
    cache_dir = copy_of(example_cache, tmp_path)
    before = shown(cache_dir)
    for bad in ("lots", "-1GB"):
        result = build(
            tmp_path, cache_dir, test_env["base_image"], EXAMPLE, "bsi-cache-never:test",
            "--cache-max", bad,
        )  # fmt: skip
        assert_one_error_line(result, "--cache-max")
        assert_one_error_line(cache_cli(cache_dir, "prune", "--keep", bad), "--keep")
    assert shown(cache_dir) == before
