"""`rebuild --shard K/N` without an engine: the slices and the CLI's table as JSON.

The real sharded rebuild (engine, registry, three templates) is in
tests/integration/test_fleet.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

import builder.engines.connection
import builder.orchestration.fleet
from builder.cli.app import main
from builder.errors import UserError
from builder.orchestration.shard import Shard, parse_shard, shard_configs

from .test_fleet import fake_rebuild, pushed, write_configs

THREE = [Path("c/cfg.toml"), Path("a/cfg.toml"), Path("./b/cfg.toml")]


def test_two_shards_of_three_configs_are_disjoint_and_cover_them() -> None:
    first = shard_configs(THREE, Shard(1, 2))
    second = shard_configs(THREE, Shard(2, 2))
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(THREE)
    assert sorted(map(len, (first, second))) == [1, 2]  # sizes differ by one at most


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_each_config_lands_in_the_same_slice_whatever_the_order_given(count: int) -> None:
    configs = [Path(f"team-{n}/cfg.toml") for n in range(11)]
    shuffled = configs.copy()
    random.Random(count).shuffle(shuffled)
    for index in range(1, count + 1):
        shard = Shard(index, count)
        assert set(shard_configs(configs, shard)) == set(shard_configs(shuffled, shard))
    slices = [shard_configs(configs, Shard(i, count)) for i in range(1, count + 1)]
    assert sorted(path for part in slices for path in part) == sorted(configs)
    assert max(map(len, slices)) - min(map(len, slices)) <= 1


def test_more_shards_than_configs_leaves_some_empty() -> None:
    assert shard_configs(THREE, Shard(4, 4)) == []


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "2", "a/b", "1/2/3", "-1/2"])
def test_a_bad_shard_is_one_line_naming_it(text: str) -> None:
    with pytest.raises(UserError, match=rf"^--shard '{text}': "):
        parse_shard(text)


def run_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    monkeypatch.setattr(builder.engines.connection, "engine_client", lambda: object())
    monkeypatch.chdir(tmp_path)
    configs = ["--config", "c/cfg.toml", "--config", "a/cfg.toml", "--config", "b/cfg.toml"]
    return CliRunner().invoke(
        main,
        ["rebuild", *configs, "--platform-version", "2", "--cache-dir", "cache", *args],
    )


def test_each_shard_rebuilds_its_slice_and_writes_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_configs(tmp_path, ["a", "b", "c"])
    outcomes = {name: pushed(f"reg/{name}@sha256:" + "1" * 64) for name in "ab"}
    outcomes["c"] = UserError("c failed")
    monkeypatch.setattr(builder.orchestration.fleet, "rebuild", fake_rebuild(outcomes, []))

    first = run_shard(tmp_path, monkeypatch, "--shard", "1/2")
    second = run_shard(tmp_path, monkeypatch, "--shard", "2/2", "--output-json", "out/two.json")

    assert first.exit_code == 1, first.output  # c failed in the first slice
    assert first.output.strip().splitlines()[-1] == (
        "error: rebuild failed for 1 of 2 templates: c/cfg.toml"
    )
    assert "(shard 1/2 of 3 configs)" in first.stdout
    assert second.exit_code == 0, second.output
    one = json.loads((tmp_path / "rebuild-shard-1-of-2.json").read_text())
    two = json.loads((tmp_path / "out" / "two.json").read_text())
    assert (one["shard"], two["shard"]) == ("1/2", "2/2")
    names = [[row["template"] for row in doc["rows"]] for doc in (one, two)]
    assert names == [["a/cfg.toml", "c/cfg.toml"], ["b/cfg.toml"]]
    assert one["failed"] == ["c/cfg.toml"] and two["failed"] == []
    assert one["rows"][0] == {
        "template": "a/cfg.toml",
        "path": "rebase",
        "detail": "reg/a@sha256:" + "1" * 64,
    }
    for name in "abc":  # each template worked on by its shard's job only
        mine, other = (first, second) if name in "ac" else (second, first)
        assert f"[{name}/cfg.toml] working on {name}" in mine.output
        assert f"[{name}/cfg.toml]" not in other.output


def test_check_is_not_sharded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_configs(tmp_path, ["a", "b", "c"])
    result = run_shard(tmp_path, monkeypatch, "--shard", "1/2", "--check")
    assert result.exit_code == 2, result.output
    assert "--shard: rebuild --check runs as one job" in result.output
    assert not (tmp_path / "rebuild-shard-1-of-2.json").exists()


def test_a_bad_shard_value_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_configs(tmp_path, ["a", "b", "c"])
    monkeypatch.setattr(builder.orchestration.fleet, "rebuild", fake_rebuild({}, []))
    result = run_shard(tmp_path, monkeypatch, "--shard", "3/2")
    assert result.exit_code == 1, result.output
    assert result.output.strip() == "error: --shard '3/2': K must be 1 to N, and N at least 1"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ci"


def test_the_github_example_spreads_the_fleet_over_its_matrix() -> None:
    document = YAML(typ="safe").load((EXAMPLES / "github-actions.yml").read_text())
    job = document["jobs"]["rebuild"]
    shards = int(job["env"]["SHARDS"])
    assert job["strategy"]["matrix"]["shard"] == list(range(1, shards + 1))  # every slice, once
    runs = [step.get("run", "") for step in job["steps"]]
    rebuild = next(run for run in runs if '--platform-version "$VERSION"' in run)
    assert '--shard "${{ matrix.shard }}/$SHARDS"' in rebuild
    check = next(run for run in runs if "--check" in run)
    assert "--shard" not in check  # --check stays one job
    assert document["jobs"]["commit"]["needs"] == "rebuild"
    parse_shard(f"{shards}/{shards}")


def test_the_gitlab_example_spreads_the_fleet_over_its_parallel_jobs() -> None:
    document = YAML(typ="safe").load((EXAMPLES / "gitlab-ci.yml").read_text())
    job = document["rebuild"]
    assert job["parallel"] >= 2
    script = " ".join(job["script"])
    assert '--shard "$CI_NODE_INDEX/$CI_NODE_TOTAL"' in script  # GitLab's 1-based index
    assert "--shard" not in " ".join(document["drift-check"]["script"])
    assert document["commit"]["needs"] == ["rebuild"]


def test_an_empty_slice_is_an_empty_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_configs(tmp_path, ["a", "b", "c"])
    monkeypatch.setattr(builder.orchestration.fleet, "rebuild", fake_rebuild({}, []))
    result = run_shard(tmp_path, monkeypatch, "--shard", "4/4")
    assert result.exit_code == 0, result.output
    assert "fleet: 0 templates rebuilt onto 2 (shard 4/4 of 3 configs)" in result.stdout
    table = json.loads((tmp_path / "rebuild-shard-4-of-4.json").read_text())
    assert (table["rows"], table["failed"], table["shard"]) == ([], [], "4/4")
