"""Pipeline config and the rebuild diff, without an engine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ruamel.yaml import YAML
from support.plans import StandInProducer, run_settings

from builder.cache import Cache
from builder.config import load_config, set_platform_version
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.orchestration import delivery
from builder.publish import publisher
from builder.publish.state import (
    BuildState,
    changes,
    load_state,
    rebase_blocker,
    save_state,
)
from builder.reporter import QUIET

REPO = Path(__file__).resolve().parents[2]


def state(**overrides: object) -> BuildState:
    values: dict = {
        "platform_version": "1.0",
        "base_image": "reg/runtime:1.0",
        "base_digest": "sha256:aaa",
        "python_version": "3.13.5",
        "packages": {"amd64": {"lightgbm": "4.6.0", "scipy": "1.16.0", "soupsieve": "2.7"}},
        "apt_packages": {"amd64": ("libgomp1",)},
        "image": "reg/sandbox@sha256:111",
    }
    values.update(overrides)
    return BuildState(**values)


def test_the_example_config_loads_with_paths_relative_to_it() -> None:
    config = load_config(REPO / "examples" / "build-sandbox-image.toml")
    assert config.requirements == (REPO / "examples" / "requirements.txt",)
    assert config.requirements[0].exists()
    assert config.template is not None and config.template.exists()
    written = f"{config.base_repository.as_written}:{config.platform_version}"
    assert config.base_image.as_written == written
    assert config.base_image_for("2.0").as_written.endswith(":2.0")
    assert config.state.name == "build-sandbox-image.state.json"


def test_config_errors_name_the_file_and_setting(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('requirements = ["r.txt"]\nbase-repository = "x"\n')
    with pytest.raises(UserError, match=r"c.toml: missing setting 'platform-version'"):
        load_config(path)
    path.write_text(
        'requirements = ["r.txt"]\nbase-repository = "x"\nplatform-version = "1"\nbogus = 1\n'
    )
    with pytest.raises(UserError, match="unknown setting"):
        load_config(path)
    path.write_text("requirements = [\n")
    with pytest.raises(UserError, match="not valid TOML"):
        load_config(path)


def test_set_platform_version_changes_only_that_value(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    text = (
        '# keep me\nrequirements = ["r.txt"]  # and me\nbase-repository = "x"\n'
        'platform-version = "1.4.2"   # the deployed one\n'
    )
    path.write_text(text)
    set_platform_version(load_config(path), "1.5.0")
    assert path.read_text() == text.replace('"1.4.2"', '"1.5.0"')
    assert load_config(path).platform_version == "1.5.0"


def test_changes_lists_digest_python_versions_and_apt() -> None:
    new = state(
        platform_version="1.1",
        base_digest="sha256:bbb",
        python_version="3.13.7",
        packages={"amd64": {"lightgbm": "4.7.0", "scipy": "1.16.0", "narwhals": "2.0"}},
        apt_packages={"amd64": ("libgomp1", "libmagic1t64")},
    )
    assert changes(state(), new) == [
        "platform version: 1.0 -> 1.1",
        "base digest: sha256:aaa -> sha256:bbb",
        "python: 3.13.5 -> 3.13.7",
        "amd64: lightgbm 4.6.0 -> 4.7.0",
        "amd64: narwhals 2.0 added",
        "amd64: soupsieve 2.7 removed",
        "amd64: apt +libmagic1t64",
    ]
    assert changes(state(), state(image=None)) == []
    assert changes(None, state()) == ["no previous build recorded"]


def test_state_round_trip_and_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert load_state(path) is None
    save_state(path, state())
    assert load_state(path) == state()
    path.write_text("{}")
    with pytest.raises(UserError, match="unreadable build state"):
        load_state(path)


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml"])
def test_ci_examples_run_the_fleet_rebuild_on_the_example_config(name: str) -> None:
    path = REPO / "examples" / "ci" / name
    document = YAML(typ="safe").load(path.read_text())
    assert isinstance(document, dict)
    text = path.read_text()
    assert 'rebuild $FLEET --platform-version "$' in text
    assert "--jobs 2" in text and "--check" in text
    assert (REPO / "examples" / "build-sandbox-image.toml").exists()
    assert "CONFIG: examples/build-sandbox-image.toml" in text
    fleet = document["variables" if "variables" in document else "jobs"]
    fleet = fleet["FLEET"] if "FLEET" in fleet else fleet["rebuild"]["env"]["FLEET"]
    assert fleet.split()[:2] == ["--config", "examples/build-sandbox-image.toml"]
    assert fleet.split().count("--config") >= 2  # a fleet: several templates in one run


def test_rebase_only_when_the_locks_are_unchanged() -> None:
    old = state(image="r/s@sha256:" + "a" * 64, locks={"amd64": "h1"})
    new = state(base_digest="sha256:" + "b" * 64, locks={"amd64": "h1"})
    assert rebase_blocker(old, new) is None
    assert rebase_blocker(old, state(locks={"amd64": "h2"})) == "the resolution changed"
    assert rebase_blocker(None, new) == "no previous pushed image recorded"
    unpushed = state(image=None, locks={"amd64": "h1"})
    assert rebase_blocker(unpushed, new) == "no previous pushed image recorded"
    assert rebase_blocker(state(image="r@x"), new) == "the previous state records no lock hashes"
    assert BuildState.from_dict(old.to_dict()) == old  # locks and path survive the file


def test_a_new_bytecode_interpreter_takes_the_build_path_and_says_why() -> None:
    old = state(image="r/s@sha256:" + "a" * 64, locks={"amd64": "h1"}, bytecode="b" * 64)
    same = state(base_digest="sha256:" + "b" * 64, locks={"amd64": "h1"}, bytecode="b" * 64)
    assert rebase_blocker(old, same) is None  # the bytecode layers are reused by digest
    other = state(locks={"amd64": "h1"}, bytecode="c" * 64)
    assert rebase_blocker(old, other) == (
        f"the extras' bytecode interpreter changed ({'b' * 12} -> {'c' * 12})"
    )
    before = state(image="r/s@sha256:" + "a" * 64, locks={"amd64": "h1"})  # no bytecode
    assert "(none -> " in (rebase_blocker(before, same) or "")
    assert BuildState.from_dict(old.to_dict()) == old


def test_a_delivery_records_the_state_only_when_asked_and_pushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `build --config` run records only a pushed image; a rebuild records its plan anyway."""

    def state_of(plan: object, version: str, image: str | None, path: str) -> BuildState:
        return state(platform_version=version, image=image, path=path)

    monkeypatch.setattr(publisher, "state_of", state_of)
    plan: Any = SimpleNamespace(arches=(SimpleNamespace(arch="amd64"),))
    client: Any = SimpleNamespace(info=lambda: {"Architecture": "x86_64"})
    (tmp_path / "report.json").write_text("{}")
    run = delivery.Run(Engines.local(client), Cache(tmp_path / "cache"), QUIET)
    where = tmp_path / "state.json"
    asked = delivery.Delivery(
        run_settings(verify=False, output=tmp_path), state=publisher.StateRecord(where, "2.0")
    )
    outcome = delivery.deliver(StandInProducer(), plan, asked, run)
    assert outcome.succeeded and outcome.pushed is None and not where.exists()
    rebuild = replace(asked, state=publisher.StateRecord(where, "2.0", unpushed_too=True))
    delivery.deliver(StandInProducer(), plan, rebuild, run)
    assert load_state(where) == state(platform_version="2.0", image=None, path="build")
    report = json.loads((tmp_path / "report.json").read_text())["image"]
    assert report["path"] == "build" and report["arches"]["amd64"] == {"id": "x"}
