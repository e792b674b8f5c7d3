"""Which images seed a run's cache (builder.orchestration.prepare.cache_sources)."""

from __future__ import annotations

import json
from pathlib import Path

from builder.config import RunSettings
from builder.oci.name import ImageRef
from builder.orchestration.prepare import cache_sources

BASE = ImageRef.parse("registry.example/team/runtime:1.0")
PUSHED = "registry.example/team/sandbox@sha256:" + "a" * 64
STATE = {
    "platform_version": "1.0",
    "base_image": str(BASE),
    "base_digest": None,
    "python_version": "3.13.5",
    "packages": {},
    "apt_packages": {},
    "image": PUSHED,
}


def settings(tmp_path: Path, **given: object) -> RunSettings:
    return RunSettings((tmp_path / "requirements.txt",), BASE, **given)  # type: ignore[arg-type]


def test_the_flags_win_and_the_state_s_last_push_is_the_default(tmp_path: Path) -> None:
    state = tmp_path / "sandbox.state.json"
    state.write_text(json.dumps(STATE))
    assert cache_sources(settings(tmp_path, state=state)) == (ImageRef.parse(PUSHED),)
    named = (ImageRef.parse("registry.example/team/sandbox:warm"),)
    assert cache_sources(settings(tmp_path, state=state, cache_from=named)) == named


def test_no_state_no_push_or_an_unreadable_state_seeds_nothing(tmp_path: Path) -> None:
    assert cache_sources(settings(tmp_path)) == ()
    state = tmp_path / "sandbox.state.json"
    assert cache_sources(settings(tmp_path, state=state)) == ()  # none recorded yet
    state.write_text(json.dumps({**STATE, "image": None}))
    assert cache_sources(settings(tmp_path, state=state)) == ()  # a rebuild that pushed nothing
    state.write_text("not json")
    assert cache_sources(settings(tmp_path, state=state)) == ()  # said where the state is read
