"""Rebuilds treat direct origins like index pins (issue 45): the state a pipeline commits
records what pins each one, so a branch that moved is a change and the same commit is none."""

from __future__ import annotations

from dataclasses import replace

from support.plans import reference_profile

from builder.plan.plan import ArchPlan, Plan, PlannedWheel
from builder.publish.state import changes, rebase_blocker, state_of
from builder.resolve.resolution import Source, SourceKind

COMMIT, MOVED = "1" * 40, "2" * 40
VCS = Source(SourceKind.VCS, "git+https://git.example/acme/tools", "", COMMIT, "main")


def _state(*wheels: PlannedWheel, image: str = "r/x@sha256:" + "0" * 64):
    plan = Plan(reference_profile(), "base:1", (ArchPlan("amd64", wheels, (), (), (), ()),), (), ())
    return state_of(plan, "1.0", image=image)


def _wheel(source: Source | None, sha256: str = "a" * 64, name: str = "acme-tools") -> PlannedWheel:
    return PlannedWheel(
        name, "1.4.0", f"{name.replace('-', '_')}-1.4.0-py3-none-any.whl", sha256,
        "py3-none-any", "", ("acme_tools",), source=source,
    )  # fmt: skip


def test_a_branch_that_moved_is_a_change_the_same_commit_is_none() -> None:
    before = _state(_wheel(VCS))
    assert changes(before, _state(_wheel(VCS))) == []
    moved = _state(_wheel(replace(VCS, commit=MOVED), sha256="b" * 64))
    assert changes(before, moved) == [
        f"amd64: acme-tools 1.4.0 (commit {COMMIT[:12]}) -> 1.4.0 (commit {MOVED[:12]})"
    ]
    assert rebase_blocker(before, moved) == "the resolution changed"


def test_a_file_replaced_under_the_same_version_is_a_change_a_wheelhouse_is_an_index() -> None:
    url = Source(SourceKind.URL, "https://artifacts.example/acme_tools-1.4.0.whl", "a" * 64)
    before = _state(_wheel(url))
    after = _state(_wheel(replace(url, sha256="c" * 64), sha256="c" * 64))
    assert changes(before, after) == [
        f"amd64: acme-tools 1.4.0 (sha256:{'a' * 12}) -> 1.4.0 (sha256:{'c' * 12})"
    ]
    house = _wheel(Source(SourceKind.FIND_LINKS, "/srv/wheels"))
    assert _state(house).packages["amd64"] == {"acme-tools": "1.4.0"}
    index = _wheel(None)
    assert changes(_state(house), _state(index)) == []  # the same version, as from an index
