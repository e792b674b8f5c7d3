"""A fleet's parts without an engine: the shared cache's per-key lock, the base probed once,
each template's failure kept to its row, the table and the CLI's exit codes.

The real fleet (engine, registry, three templates rebuilt) is tests/integration/test_fleet.py.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

import builder.engines.connection
import builder.orchestration.fleet
import builder.resolve.index as index
from builder.cache import Cache
from builder.cli.app import main
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.orchestration.commands import Rebuild
from builder.orchestration.fleet import Fleet, Shared, SharedBases, rebuild_fleet
from builder.reporter import Reporter
from builder.resolve.index import download
from builder.resolve.resolution import RemoteFile
from builder.verify.report import Check, VerifyReport

WAIT = 30  # seconds a thread may take to get where the test waits for it (never reached)


def test_two_downloads_of_one_wheel_fetch_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "six-1.0-py3-none-any.whl"
    source.write_bytes(b"a wheel's bytes")
    sha256 = hashlib.sha256(source.read_bytes()).hexdigest()
    wheel = RemoteFile(source.name, source.as_uri(), sha256)
    cache = Cache(tmp_path / "cache")
    fetched, entered, release, second_waits = [], threading.Event(), threading.Event(), []
    real_fetch, real_exclusive = index._fetch, Cache.exclusive

    def slow_fetch(*args: Any) -> Path:
        fetched.append(threading.current_thread().name)
        entered.set()
        release.wait(WAIT)  # held until the second download waits for the lock
        return real_fetch(*args)

    waiting = threading.Event()

    @contextmanager
    def exclusive(self: Cache, kind: str, key: str) -> Iterator[None]:
        second_waits.append(key)
        if len(second_waits) == 2:
            waiting.set()
        with real_exclusive(self, kind, key):
            yield

    monkeypatch.setattr(index, "_fetch", slow_fetch)
    monkeypatch.setattr(Cache, "exclusive", exclusive)
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(download(wheel, cache)))
    first.start()
    assert entered.wait(WAIT)
    second = threading.Thread(target=lambda: results.append(download(wheel, cache)))
    second.start()
    assert waiting.wait(WAIT)  # the second is at the lock while the first fetches
    release.set()
    first.join(WAIT)
    second.join(WAIT)
    assert len(fetched) == 1
    assert len(results) == 2 and results[0] == results[1] == cache.blob_path(sha256, source.name)
    assert results[0].read_bytes() == b"a wheel's bytes"


def test_the_base_is_probed_once_for_every_template_that_needs_it() -> None:
    said: list[str] = []
    bases = SharedBases(Reporter(said.append), {"reg/runtime:2": 5})
    probes: list[str] = []
    gate = threading.Event()

    def probe() -> Any:
        probes.append("probe")
        gate.wait(WAIT)
        return SimpleNamespace(image="reg/runtime:2")

    found: list[Any] = []
    threads = [
        threading.Thread(target=lambda: found.append(bases(ImageRef.parse("reg/runtime:2"), probe)))
        for _ in range(5)
    ]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(WAIT)
    assert probes == ["probe"]
    assert len(found) == 5 and all(one is found[0] for one in found)
    assert said == ["probing base reg/runtime:2 (once, for 5 template(s)) ..."]


def test_a_failed_probe_is_every_waiting_templates_failure() -> None:
    bases = SharedBases(Reporter(lambda line: None), {})

    def probe() -> Any:
        raise UserError("base image reg/runtime:2: not found")

    for _ in range(2):
        with pytest.raises(UserError, match="not found"):
            bases(ImageRef.parse("reg/runtime:2"), probe)


def write_configs(tmp_path: Path, names: list[str], output: str | None = None) -> list[Path]:
    paths = []
    for name in names:
        here = tmp_path / name
        here.mkdir()
        (here / "requirements.txt").write_text("six\n")
        text = 'requirements = ["requirements.txt"]\nbase-repository = "reg/runtime"\n'
        text += 'platform-version = "1"\n'
        if output:
            text += f'output = "{output}"\n'
        (here / "cfg.toml").write_text(text)
        paths.append(here / "cfg.toml")
    return paths


def fake_rebuild(outcomes: dict[str, Any], said: list[str]) -> Any:
    """A `rebuild` that says one line and then does what `outcomes` names for its config."""

    def rebuild(config: Any, version: str, client: Any, cache: Any, reporter: Reporter, **kw: Any):
        reporter.say(f"working on {config.path.parent.name}")
        what = outcomes[config.path.parent.name]
        if isinstance(what, Exception):
            raise what
        return what

    return rebuild


def pushed(reference: str) -> Rebuild:
    outcome = SimpleNamespace(
        verification=None,
        notes=[],
        pushed=SimpleNamespace(reference=reference),
        template_change=None,
    )
    return Rebuild(plan=Any, changes=["platform version: 1 -> 2"], outcome=outcome, path="rebase")  # type: ignore[arg-type]


def test_each_templates_failure_stays_in_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_configs(tmp_path, ["a", "b", "c", "d"])
    (tmp_path / "e.toml").write_text("not = [valid")
    said: list[str] = []
    outcomes = {
        "a": pushed("reg/a@sha256:" + "1" * 64),
        "b": UserError("b/requirements.txt: no-such-dist\nhas no wheel"),
        "c": RuntimeError("boom"),
        "d": Rebuild(plan=Any, changes=[]),  # type: ignore[arg-type]
    }
    monkeypatch.setattr(builder.orchestration.fleet, "rebuild", fake_rebuild(outcomes, said))
    fleet = Fleet([*paths, tmp_path / "e.toml"], "2", jobs=2)
    result = rebuild_fleet(fleet, Shared(Any, Cache(tmp_path), Reporter(said.append)))  # type: ignore[arg-type]
    got = {
        Path(row.name).parent.name if row.name.endswith("cfg.toml") else "e": row
        for row in result.rows
    }
    assert [row.name for row in result.rows] == [str(p) for p in fleet.configs]  # order given
    assert (got["a"].path, got["a"].detail) == ("rebase", "reg/a@sha256:" + "1" * 64)
    assert (got["b"].path, got["b"].detail) == (
        "failed",
        "b/requirements.txt: no-such-dist has no wheel",
    )
    assert (got["c"].path, got["c"].detail) == (
        "failed",
        "internal: RuntimeError: boom (rerun with BSI_DEBUG=1 for the traceback)",
    )
    assert (got["d"].path, got["d"].detail) == ("unchanged", "up to date")
    assert got["e"].path == "failed" and "not valid TOML" in got["e"].detail
    assert result.failed == [str(paths[1]), str(paths[2]), str(tmp_path / "e.toml")]
    assert f"[{paths[0]}] working on a" in said  # each line names its template
    assert f"[{paths[1]}] failed: b/requirements.txt: no-such-dist has no wheel" in said
    table = result.table().splitlines()
    assert table[0].split() == ["TEMPLATE", "PATH", "NEW", "DIGEST", "OR", "REASON"]
    assert len(table) == 6 and table[2].split()[:2] == [str(paths[1]), "failed"]


def test_templates_that_would_write_the_same_output_are_refused(tmp_path: Path) -> None:
    paths = write_configs(tmp_path, ["a", "b"], output="../shared-context")
    fleet = Fleet(paths, "2")
    with pytest.raises(UserError, match=r"both write .*shared-context"):
        rebuild_fleet(fleet, Shared(Any, Cache(tmp_path), Reporter(print)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("outcomes", "check", "code", "last"),
    [
        ({"a": "ok", "b": "ok"}, False, 0, None),
        (
            {"a": "ok", "b": "fail"},
            False,
            1,
            "error: rebuild failed for 1 of 2 templates: b/cfg.toml",
        ),
        ({"a": "changes", "b": "none"}, True, 3, "rebuild needed: a/cfg.toml"),
        ({"a": "none", "b": "none"}, True, 0, None),
    ],
)
def test_the_fleets_exit_code(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    outcomes: dict[str, str],
    check: bool,
    code: int,
    last: str | None,
) -> None:
    write_configs(tmp_path, ["a", "b"])
    made = {
        "ok": pushed("reg/x@sha256:" + "2" * 64),
        "fail": UserError("it failed"),
        "changes": Rebuild(plan=Any, changes=["platform version: 1 -> 2"]),  # type: ignore[arg-type]
        "none": Rebuild(plan=Any, changes=[]),  # type: ignore[arg-type]
    }
    monkeypatch.setattr(
        builder.orchestration.fleet,
        "rebuild",
        fake_rebuild({k: made[v] for k, v in outcomes.items()}, []),
    )
    monkeypatch.setattr(builder.engines.connection, "engine_client", lambda: object())
    monkeypatch.chdir(tmp_path)
    args = [
        "rebuild",
        "--config",
        "a/cfg.toml",
        "--config",
        "b/cfg.toml",
        "--platform-version",
        "2",
    ]
    result = CliRunner().invoke(
        main, [*args, "--cache-dir", str(tmp_path / "cache"), *(["--check"] if check else [])]
    )
    assert result.exit_code == code, result.output
    assert "fleet: 2 templates" in result.stdout
    if last is not None:
        assert result.output.strip().splitlines()[-1] == last


def test_a_failed_verification_is_the_templates_failure_with_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_configs(tmp_path, ["a"])
    report = VerifyReport(
        "reg/a", [Check("imports", False, "numpy"), Check("hardening", False, "uid 0")]
    )
    outcome = SimpleNamespace(verification=report, label="reg/a", pushed=None, notes=[])
    made = Rebuild(plan=Any, changes=["base digest: x -> y"], outcome=outcome, path="rebase")  # type: ignore[arg-type]
    said: list[str] = []
    monkeypatch.setattr(builder.orchestration.fleet, "rebuild", fake_rebuild({"a": made}, said))
    result = rebuild_fleet(
        Fleet(paths, "2"),
        Shared(Any, Cache(tmp_path), Reporter(said.append)),  # type: ignore[arg-type]
    )
    (row,) = result.rows
    assert (row.path, row.detail) == ("failed", "verification of reg/a failed: imports, hardening")
    assert f"[{paths[0]}] FAIL  hardening  uid 0" in said
    assert result.failed == [str(paths[0])]
