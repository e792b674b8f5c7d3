"""How distributions are grouped into layers (builder.plan.layering)."""

from __future__ import annotations

import pytest

from builder.plan.layering import BUCKETS, LayerGroup, Member, bucket_of, group_layers

MB = 1_000_000


def _set(count: int) -> list[Member]:
    """`count` distributions of distinct sizes: dist-000 is the largest."""
    return [Member(f"dist-{i:03d}", (count - i) * MB) for i in range(count)]


def test_within_the_budget_every_distribution_has_its_own_layer_largest_lowest() -> None:
    members = [Member("six", 50_000), Member("scipy", 90 * MB), Member("numpy", 60 * MB)]
    groups = group_layers(members, budget=48)
    assert [g.names for g in groups] == [("scipy",), ("numpy",), ("six",)]
    assert all(g.bucket is None for g in groups)
    assert groups[0].label == "scipy"


def test_beyond_the_budget_the_smallest_share_buckets_and_the_budget_holds() -> None:
    members = _set(60)
    groups = group_layers(members, budget=20)
    assert len(groups) <= 20
    own = [g for g in groups if g.bucket is None]
    assert [g.names[0] for g in own] == [f"dist-{i:03d}" for i in range(20 - BUCKETS)]
    bucketed = [name for g in groups if g.bucket is not None for name in g.names]
    assert sorted(bucketed) == [f"dist-{i:03d}" for i in range(20 - BUCKETS, 60)]
    assert all(g.bucket is not None for g in groups[len(own) :]), "buckets on top"
    assert sum(g.size for g in groups) == sum(m.size for m in members)


def test_a_small_distributions_change_rewrites_only_its_bucket() -> None:
    before = group_layers(_set(60), budget=20)
    changed = [m if m.name != "dist-050" else Member("dist-050", m.size + 1234) for m in _set(60)]
    added = [*_set(60), Member("tiny-new", 10_000)]
    for after in (group_layers(changed, budget=20), group_layers(added, budget=20)):
        differ = set(before) ^ set(after)
        touched = {g.bucket for g in differ}
        assert len(touched) == 1 and None not in touched, differ


def test_the_bucket_depends_on_the_name_alone() -> None:
    assert bucket_of("six") == bucket_of("six")
    assert {bucket_of(f"name-{i}") for i in range(200)} == set(range(BUCKETS))


def test_a_budget_without_room_for_the_buckets_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        group_layers(_set(10), budget=BUCKETS)


def test_groups_are_values() -> None:
    assert LayerGroup(("a",), 1) == LayerGroup(("a",), 1)
