"""Inspection as downloads arrive: each wheel goes to a worker the moment it is ready."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from support.waiting import wait_for
from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.errors import UserError
from builder.files import sha256_of
from builder.inspect import wheel_reader as wheels
from builder.inspect.wheel_reader import inspect_as_ready, inspect_wheel
from builder.inspect.wheels import RECORD_KIND, WheelInspection


def wheel(tmp_path: Path, name: str) -> tuple[Path, str]:
    path = make_wheel(tmp_path / "w", name, "1.0", "py3-none-any", {f"{name}/__init__.py": b""})
    return path, sha256_of(path)


def test_the_first_wheel_is_inspected_before_the_last_arrives(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    first, second = wheel(tmp_path, "early"), wheel(tmp_path, "late")

    def arriving() -> Iterator[tuple[Path, str]]:
        yield first
        wait_for(  # the "download" of the second wheel takes this long; fails the test if never
            lambda: cache.get_record(RECORD_KIND, first[1]) is not None,
            deadline_s=120,
            what="the first wheel inspected before the second arrives",
        )
        yield second
        yield first  # a wheel two arches share arrives once per arch: inspected once

    found = inspect_as_ready(arriving(), cache, workers=2)
    assert sorted(found) == sorted([first[1], second[1]])
    assert found[second[1]] == inspect_wheel(*second, cache)
    assert [found[first[1]].name, found[second[1]].name] == ["early", "late"]


def test_cached_wheels_start_no_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Not even the pool: its semaphores start multiprocessing's resource tracker, a process.
    cache = Cache(tmp_path / "cache")
    ready = [wheel(tmp_path, "a"), wheel(tmp_path, "b")]
    expected = {sha: inspect_wheel(path, sha, cache) for path, sha in ready}

    def no_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker pool was started")

    monkeypatch.setattr(wheels, "ProcessPoolExecutor", no_pool)
    assert inspect_as_ready(iter(ready), cache) == expected


def test_workers_come_from_a_forkserver_not_a_fork_of_this_process() -> None:
    assert wheels._WORKERS.get_start_method() == "forkserver"


def test_the_largest_waiting_wheel_is_inspected_first(tmp_path: Path) -> None:
    """A set's downloads end close together: the largest waiting wheel goes to the next free
    worker, so the slowest inspections do not start last (`done` tells the order they end)."""
    cache = Cache(tmp_path / "cache")
    first = wheel(tmp_path, "first")  # the worker's first job: the others wait behind it
    small = wheel(tmp_path, "small")
    members = {"large/__init__.py": b"", "large/data.bin": os.urandom(1 << 20)}
    large = make_wheel(tmp_path / "w", "large", "1.0", "py3-none-any", members)
    ended: list[str] = []
    names = {first[1]: "first", small[1]: "small", sha256_of(large): "large"}
    found = inspect_as_ready(
        [first, small, (large, sha256_of(large))],
        cache,
        workers=1,
        done=lambda sha: ended.append(names[sha]),
    )
    assert ended == ["first", "large", "small"]
    assert len(found) == 3


def test_a_wheel_that_cannot_be_read_fails_the_inspection_without_a_hang(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    broken = tmp_path / "broken-1.0-py3-none-any.whl"
    broken.write_bytes(b"not a zip" * 1000)
    others = [wheel(tmp_path, "a"), wheel(tmp_path, "b")]
    with pytest.raises(UserError, match=r"broken-1\.0-py3-none-any\.whl: not a readable wheel"):
        inspect_as_ready([(broken, sha256_of(broken)), *others], cache, workers=1)


class _BreakingPool:
    """A pool whose first job waits for the test and whose next submit fails, as a
    ProcessPoolExecutor does once a worker died (BrokenProcessPool)."""

    def __init__(self) -> None:
        self.first: Future[WheelInspection] = Future()
        self.submits = 0

    def submit(self, *args: object) -> Future[WheelInspection]:
        self.submits += 1
        if self.submits > 1:
            raise RuntimeError("a child process terminated abruptly")
        return self.first


def test_wheels_still_waiting_when_the_pool_breaks_fail_rather_than_hang(tmp_path: Path) -> None:
    pool = _BreakingPool()
    queue = wheels._LargestFirst(pool, 1, Cache(tmp_path / "cache"), None)  # type: ignore[arg-type]
    first, second, third = (wheel(tmp_path, name) for name in ("first", "second", "third"))
    for path, sha in (first, second, third):
        queue.add(path, sha)
    assert pool.submits == 1  # one worker: the others wait
    done = inspect_wheel(*first, Cache(tmp_path / "other"))
    pool.first.set_result(done)  # its end starts the next: the pool is broken by then
    assert queue.results[first[1]].result(timeout=60) == done
    for _, sha in (second, third):
        assert "terminated abruptly" in str(queue.results[sha].exception(timeout=60))
