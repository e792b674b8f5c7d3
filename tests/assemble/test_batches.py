"""A docker load's archive is copied whole to the engine's disk first: layers travel in batches."""

from __future__ import annotations

import pytest

from builder.assemble.assemble import batch_ends


@pytest.mark.parametrize(
    ("sizes", "limit", "ends"),
    [
        ([], 10, [0]),  # nothing to send: one empty load (the config alone)
        ([3, 3, 3], 10, [3]),
        ([4, 4, 4], 10, [2, 3]),
        ([4, 6, 1], 10, [2, 3]),  # exactly the limit fits
        ([20, 1, 1], 10, [1, 3]),  # a larger layer goes alone
        ([1, 20, 1], 10, [1, 2, 3]),
        ([10, 10], 10, [1, 2]),
    ],
)
def test_batches_stay_under_the_limit_but_for_a_larger_layer_alone(
    sizes: list[int], limit: int, ends: list[int]
) -> None:
    assert batch_ends(sizes, limit) == ends
    runs = [sizes[start:end] for start, end in zip([0, *ends], ends, strict=False)]
    assert [size for run in runs for size in run] == sizes
    assert all(sum(run) <= limit or len(run) == 1 for run in runs)
