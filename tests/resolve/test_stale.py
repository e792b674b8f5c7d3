"""Stale picks on a synthetic index: a wheel-less newest release warns; a newest release with a
usable wheel that another distribution holds back gets a note naming it, from uv's `# via`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from packaging.version import Version

from builder.cache import Cache
from builder.errors import UserError
from builder.resolve import stale
from builder.resolve import uv as resolve_module
from builder.resolve.requirements import read_requirements
from builder.resolve.resolution import LockedPackage, RemoteFile
from builder.resolve.stale import (
    HeldBack,
    index_listings,
    parse_via,
    requested_held_notes,
    stale_picks,
)
from builder.resolve.target import ARCHES, Target, shipped_facts

AMD64 = ARCHES["amd64"]
TARGET = Target(shipped_facts(), (AMD64,))
WHEEL = "cp313-cp313-manylinux_2_17_x86_64"

# `uv pip compile --annotation-style line` output, as uv prints it
UV_OUTPUT = """\
cloudpickle==3.1.3        # via joblib
joblib==1.6.0             # via scikit-learn
numpy==2.3.5              # via scikit-learn, scipy, -r requirements.in
oldlib==1.4.0             # via pinner
scikit-learn==1.9.1       # via -r requirements.in
typing-extensions==4.15.0 # via Pydantic-Core[extra], -c constraints.txt
"""


def remote(filename: str, uploaded: str = "2025-01-02T00:00:00Z") -> RemoteFile:
    return RemoteFile(filename, f"https://index.invalid/{filename}", "0" * 64, 1, uploaded)


INDEX: Mapping[str, list[RemoteFile]] = {
    "oldlib": [
        remote(f"oldlib-1.4.0-{WHEEL}.whl", "2023-05-01T00:00:00Z"),
        remote(f"oldlib-2.0.0-{WHEEL}.whl", "2025-03-01T00:00:00Z"),
        remote("oldlib-2.1.0rc1-py3-none-any.whl"),  # a prerelease is never "newest"
    ],
    "wheelless": [
        remote("wheelless-1.0-py3-none-any.whl", "2020-01-01T00:00:00Z"),
        remote("wheelless-3.0-cp313-cp313-win_amd64.whl", "2025-06-01T00:00:00Z"),
    ],
    "current": [remote("current-1.0-py3-none-any.whl")],
    # the index lists it under the project, but the name parses as `lister-2-0-dev` 9429
    "lister": [remote("lister-4.1-py3-none-any.whl"), remote("lister-2.0-dev-9429.tar.gz")],
    "unbuildable": [remote("unbuildable-1.0-py3-none-any.whl"), remote("unbuildable-2.0.tar.gz")],
}


@pytest.fixture
def synthetic_index(monkeypatch: pytest.MonkeyPatch) -> None:
    def files(indexes: Sequence[str], name: str, retries: object = None) -> list[RemoteFile]:
        return INDEX.get(name, [])

    monkeypatch.setattr(stale, "index_files", files)


def test_parse_via_keeps_distributions_and_drops_files() -> None:
    via = parse_via(UV_OUTPUT)
    assert via["numpy"] == ("scikit-learn", "scipy")
    assert via["oldlib"] == ("pinner",)
    assert via["scikit-learn"] == ()
    assert via["typing-extensions"] == ("pydantic-core",)


def test_held_back_note_names_who_requires_it() -> None:
    via = parse_via(UV_OUTPUT)
    one = HeldBack("oldlib", "1.4.0", "2.0.0").message(via)
    assert one == (
        "note: oldlib==1.4.0 chosen, not the newest 2.0.0 (which has a usable wheel):"
        " held back by pinner's requirement"
    )
    several = HeldBack("numpy", "2.3.5", "2.5.5").message(via)
    assert several is not None and several.endswith("one of scikit-learn, scipy")
    assert HeldBack("scikit-learn", "1.9.1", "2.0").message(via) is None  # uv cannot tell


def test_a_requested_distribution_nothing_else_holds_back_gets_a_note_of_its_own() -> None:
    """dbt-core 1.12.6 asks for a parser that has only source releases: 1.12.0 is chosen, and
    nothing in the set requires dbt-core, so uv's `# via` cannot name who holds it back."""
    via = parse_via(UV_OUTPUT)
    held = [HeldBack("scikit-learn", "1.9.1", "2.0"), HeldBack("oldlib", "1.4.0", "2.0.0")]
    assert requested_held_notes(held, via, ["scikit-learn", "oldlib"]) == [
        "note: scikit-learn==1.9.1 chosen, not the newest 2.0 (which has a usable wheel): what"
        " 2.0 requires cannot be met with wheels for the target and the base's pins (resolve"
        " scikit-learn==2.0 to see why)"
    ]  # oldlib: pinner's requirement holds it back, which the family note says
    assert requested_held_notes(held, via, ["numpy"]) == []


def test_stale_picks_split_wheelless_from_held_back(synthetic_index: None) -> None:
    locked = {"oldlib": "1.4.0", "wheelless": "1.0", "current": "1.0"}
    listings = index_listings(locked, ["https://index.invalid/simple"])
    picks, held = stale_picks(locked, {}, listings, TARGET, AMD64)
    assert held == [HeldBack("oldlib", "1.4.0", "2.0.0")]
    (pick,) = picks
    assert (pick.name, pick.chosen, pick.newest) == ("wheelless", "1.0", "3.0")
    assert "has no wheel for CPython" in pick.message()


def test_resolution_notes_come_only_with_a_held_back_version(
    synthetic_index: None, tmp_path: Path
) -> None:
    requirements_file = tmp_path / "requirements.txt"
    requirements_file.write_text("oldlib\ncurrent\n")
    requirements = read_requirements((requirements_file,), ())
    asked = []

    def annotations() -> str:  # uv's annotated output, asked for only when needed
        asked.append(True)
        return UV_OUTPUT

    def fresher(packages: list[LockedPackage]) -> list[str]:
        warnings, rebuilt = resolve_module._fresher_sources(
            packages,
            requirements,
            TARGET,
            AMD64,
            Cache(tmp_path / "c"),
            tmp_path,
            annotations,
            None,
        )
        assert rebuilt == []
        return warnings

    assert fresher([LockedPackage("current", "1.0", ())]) == []
    assert asked == []  # nothing held back: uv is not asked again
    notes = fresher([LockedPackage("oldlib", "1.4.0", ()), LockedPackage("current", "1.0", ())])
    assert notes == [
        "note: oldlib==1.4.0 chosen, not the newest 2.0.0 (which has a usable wheel):"
        " held back by pinner's requirement"
    ]
    assert asked == [True]


def test_a_file_named_for_another_project_is_no_release(synthetic_index: None) -> None:
    """As pip and uv read an index: `lister-2.0-dev-9429.tar.gz` is no newer lister release."""
    assert list(stale.releases("lister", INDEX["lister"])) == [Version("4.1")]
    listings = index_listings(["lister"], ["https://index.invalid/simple"])
    assert stale_picks({"lister": "4.1"}, {}, listings, TARGET, AMD64) == ([], [])


def test_the_check_for_newer_releases_never_fails_a_plan(
    synthetic_index: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer source that cannot be fetched or built, or an index that cannot be listed, is
    said; the resolution the resolver made stands."""
    requirements_file = tmp_path / "requirements.txt"
    requirements_file.write_text("unbuildable\n")
    requirements = read_requirements((requirements_file,), ())

    def download(*args: object) -> Path:
        raise UserError("unbuildable-2.0.tar.gz: building a wheel from source failed")

    monkeypatch.setattr(resolve_module, "download", download)
    packages = [LockedPackage("unbuildable", "1.0", ())]
    warnings, rebuilt = resolve_module._fresher_sources(
        packages, requirements, TARGET, AMD64, Cache(tmp_path / "c"), tmp_path, dict, None
    )
    assert rebuilt == []
    (warning,) = warnings
    assert warning.startswith("warning: unbuildable==1.0 (2025-01-02) chosen, but the newest")
    assert warning.endswith("its source was not built: unbuildable-2.0.tar.gz: building a wheel"
                            " from source failed")  # fmt: skip

    def unreachable(indexes: Sequence[str], name: str, retries: object = None) -> list:
        raise UserError(f"{name}: index https://index.invalid/simple unreachable (timed out)")

    monkeypatch.setattr(stale, "index_files", unreachable)
    warnings, rebuilt = resolve_module._fresher_sources(
        packages, requirements, TARGET, AMD64, Cache(tmp_path / "c"), tmp_path, dict, None
    )
    assert (warnings, rebuilt) == (
        ["note: newer releases not checked: unbuildable: index https://index.invalid/simple"
         " unreachable (timed out)"], [],
    )  # fmt: skip


def test_a_fresher_source_built_is_taken_only_when_the_second_pin_takes_it() -> None:
    """After a stale pick's newer pure-Python source is built and the set pinned again: the
    pick the resolver now takes is built on the host (and said so); one it still passes over
    keeps its warning."""
    source = remote("fresh-2.0.tar.gz")
    taken = stale.StalePick(
        "fresh", "1.0", "2024-01-01", "2.0", "2025-01-02", "has no wheel", source
    )
    passed = stale.StalePick(
        "kept", "1.0", "2024-01-01", "3.0", "2025-01-02", "has no wheel", source
    )
    pinned = [LockedPackage("fresh", "2.0", ()), LockedPackage("kept", "1.0", ())]
    built, warnings = resolve_module._rebuilt_notes(pinned, [taken, passed])
    assert built == ["fresh==2.0"]
    assert warnings == [
        "note: fresh==2.0 (2025-01-02) has only a pure-Python source release: built on the host"
        " instead of the old wheel 1.0 (2024-01-01)",
        passed.message(),
    ]
