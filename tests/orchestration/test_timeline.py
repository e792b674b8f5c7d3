"""A run's timeline: steps and each wheel's stages, in seconds from the run's start."""

from __future__ import annotations

import threading

import pytest

from builder.orchestration.timeline import Timeline


def test_steps_and_wheel_stages_in_the_order_they_happened() -> None:
    timeline = Timeline(started=100.0)
    clock = iter([101.0, 103.5, 104.0, 104.5, 106.25, 107.0])
    timeline.now = lambda: next(clock) - timeline.started  # type: ignore[method-assign]
    with timeline.step("resolve"):  # 1.0 .. 3.5
        pass
    timeline.name({"aa": "a-1.0-py3-none-any.whl"})
    timeline.marker("arrived")("bb")  # 4.0
    timeline.marker("arrived")("aa")  # 4.5
    timeline.marker("inspected")("aa")  # 6.25
    timeline.marker("inspected")("aa")  # a second arch's mark of the same wheel: the first counts
    assert timeline.to_dict() == {
        "steps": {"resolve": [1.0, 3.5]},
        "wheels": {
            "bb": {"arrived": 4.0},  # no name given: its sha256
            "a-1.0-py3-none-any.whl": {"arrived": 4.5, "inspected": 6.25},
        },
    }


def test_a_failed_step_still_ends() -> None:
    timeline = Timeline()
    with pytest.raises(RuntimeError), timeline.step("resolve"):
        raise RuntimeError("uv failed")
    began, ended = timeline.to_dict()["steps"]["resolve"]  # type: ignore[index]
    assert 0 <= began <= ended


def test_marks_from_many_threads_are_all_kept() -> None:
    timeline = Timeline()
    mark = timeline.marker("inspected")
    threads = [threading.Thread(target=mark, args=(f"{n:064x}",)) for n in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(timeline.to_dict()["wheels"]) == 50  # type: ignore[arg-type]
