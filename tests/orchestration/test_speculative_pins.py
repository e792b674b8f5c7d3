"""The downloads start from the set as uv first pins it, while the check for newer releases goes
on; a check that changes the pins (it built a fresher pure-Python source) starts the run again.

On a loopback PEP 503 index of test-built files: `bsi-fresh` has a wheel of 1.0 and only a
pure-Python sdist of 2.0, so uv first pins 1.0 and the check then builds 2.0 and pins it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from support.plans import reference_profile
from support.projects import pure_sdist
from support.wheelfactory import make_wheel
from support.wheelindex import OneWheelIndex, serve_wheel

from builder.cache import Cache
from builder.config import RunSettings
from builder.orchestration.prepare import Grounds, prepare
from builder.orchestration.timeline import Timeline
from builder.resolve import uv as resolve_module

WAIT = 60.0  # seconds a held check waits for the download it expects to overlap


OLD_WHEEL = "bsi_fresh-1.0-py3-none-any.whl"


class _OnlyUvGetsTheOldWheel(OneWheelIndex):
    """An index whose 1.0 wheel uv can read (to pin it) but the run's download cannot: a file
    a CDN lost between the two, failing the work on the first pins."""

    def do_GET(self) -> None:
        if self.path.endswith(OLD_WHEEL) and not self.headers.get("User-Agent", "").startswith(
            "uv/"
        ):
            self._answer(404)
            return
        super().do_GET()


def _serve(tmp_path: Path, kind: type[OneWheelIndex]) -> AbstractContextManager[int]:
    files = tmp_path / "index"
    files.mkdir()
    old = make_wheel(
        files, "bsi-fresh", "1.0", "py3-none-any", {"bsi_fresh/__init__.py": b"V = 1\n"}
    )
    new = pure_sdist(files, "bsi-fresh", "2.0", "bsi_fresh", "V = 2\n")
    plain = make_wheel(files, "bsi-plain", "1.0", "py3-none-any", {"bsi_plain.py": b"V = 1\n"})
    return serve_wheel(old, "bsi-fresh", more=(new,), others={"bsi-plain": plain}, kind=kind)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[int]:
    """The loopback index's port."""
    with _serve(tmp_path, OneWheelIndex) as port:
        yield port


@pytest.fixture
def losing_index(tmp_path: Path) -> Iterator[int]:
    """The same index, its 1.0 wheel served to uv only."""
    with _serve(tmp_path, _OnlyUvGetsTheOldWheel) as port:
        yield port


def fetched(tmp_path: Path, name: str) -> bool:
    """Whether the run downloaded the index's file `name` into its cache (uv's own reads of
    it, for its metadata, go to uv's cache, not there)."""
    wheel = tmp_path / "index" / name
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return Cache(tmp_path / "cache").find_blob(sha256, name) is not None


def run(tmp_path: Path, port: int, requirement: str) -> tuple[Any, Timeline]:
    lines = tmp_path / "requirements.txt"
    lines.write_text(f"--index-url http://127.0.0.1:{port}/simple\n{requirement}\n")
    base = reference_profile()
    timeline = Timeline()
    grounds = Grounds(base, ("amd64",), Cache(tmp_path / "cache"), timeline=timeline)
    settings = RunSettings((lines,), base.pinned, output=tmp_path / "out")
    return prepare(settings, grounds), timeline


def test_the_wheels_are_fetched_while_the_check_for_newer_releases_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = resolve_module.index_listings
    overlapped = threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        """The check, held until the wheel's download has been asked for (or WAIT passed)."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and not overlapped.is_set():
            if fetched(tmp_path, "bsi_plain-1.0-py3-none-any.whl"):
                overlapped.set()
            time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(resolve_module, "index_listings", held)
    plan, timeline = run(tmp_path, index, "bsi-plain")
    assert overlapped.is_set(), "the wheel was not fetched until the check had ended"
    assert [(w.name, w.version) for w in plan.arches[0].wheels] == [("bsi-plain", "1.0")]
    resolved, checked = timeline.steps["resolve"], timeline.steps["checked"]
    assert resolved[1] < checked[1], "the resolve step waited for the check"


def test_a_check_that_changes_the_pins_starts_the_run_again_from_them(
    index: int, tmp_path: Path
) -> None:
    plan, timeline = run(tmp_path, index, "bsi-fresh")
    (wheel,) = plan.arches[0].wheels
    assert (wheel.name, wheel.version) == ("bsi-fresh", "2.0")
    assert "bsi-fresh==2.0" in plan.arches[0].built_from_source
    speculated = fetched(tmp_path, OLD_WHEEL)
    assert speculated, "the first pin (1.0) was not fetched before the check ended"
    lock = (tmp_path / "out" / "requirements-amd64.lock").read_text()
    assert "bsi-fresh==2.0" in lock and "bsi-fresh==1.0" not in lock
    shown = timeline.to_dict()
    assert "repinned" in shown["steps"]  # type: ignore[operator]
    wheels = list(shown["wheels"])  # type: ignore[call-overload]
    assert OLD_WHEEL not in wheels and any(name.startswith("bsi_fresh-2.0") for name in wheels)
    began, _ = timeline.steps["resolve"]  # the rerun's would begin after the repin
    assert began < timeline.steps["repinned"][1], "the rerun's resolve step replaced the first"


def test_a_failure_on_the_first_pins_gives_way_to_the_checks_pins(
    losing_index: int, tmp_path: Path
) -> None:
    """The first pins' wheel cannot be downloaded; the checked set does not install it, so
    the run does not fail on it: it starts again from the check's pins."""
    plan, timeline = run(tmp_path, losing_index, "bsi-fresh")
    assert [(w.name, w.version) for w in plan.arches[0].wheels] == [("bsi-fresh", "2.0")]
    assert "repinned" in timeline.steps
