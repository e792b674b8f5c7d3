"""When a run's steps began and ended, and when each wheel reached each stage: report.json's
`timeline` (docs/report.md), in seconds from the run's start.

A cold build is a pipeline: each wheel is inspected, laid out and compiled as soon as its
download ends, beside the others. Which step is the critical path, and which resource it
waits on, shows only in when things happened, not in how long each took alone; the
benchmarks print this (benchmarks/speed_targets.py) so the next bottleneck is visible.
The lower layers never see this class: they take a plain callback per stage (`marker`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

# The stages a wheel goes through, in the order report.json lists them.
WHEEL_STAGES = ("arrived", "inspected", "laid_out", "compiled")


@dataclass
class Timeline:
    """The run's clock (from `started`) and what happened when; safe to mark from threads."""

    started: float = field(default_factory=time.monotonic)
    steps: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> began, ended
    wheels: dict[str, dict[str, float]] = field(default_factory=dict)  # sha256 -> stage -> at
    names: dict[str, str] = field(default_factory=dict)  # sha256 -> wheel filename
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def now(self) -> float:
        return time.monotonic() - self.started

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Record the block as step `name` (its end even when it fails)."""
        began = self.now()
        try:
            yield
        finally:
            with self.lock:
                self.steps[name] = (began, self.now())

    def record(self, name: str, began: float) -> None:
        """Step `name` began at `began` (from now()) and ends now."""
        with self.lock:
            self.steps[name] = (began, self.now())

    def marker(self, stage: str) -> Callable[[str], None]:
        """A callback that marks the wheel it is given (by sha256) as having reached `stage`
        now; the first mark of a stage counts (two arches share a pure wheel)."""

        def mark(sha256: str) -> None:
            at = self.now()
            with self.lock:
                self.wheels.setdefault(sha256, {}).setdefault(stage, at)

        return mark

    def repinned(self, again: Sequence[str]) -> None:
        """The run starts again from the checked pins: the steps it records `again` become
        one, `repinned` (from the earliest of them to now), and the wheels' marks are dropped,
        so that what the report shows is the rerun's, beside the first resolution and check."""
        with self.lock:
            spans = [self.steps.pop(name) for name in again if name in self.steps]
            began = min((start for start, _ in spans), default=self.now())
            self.steps["repinned"] = (began, self.now())
            self.wheels.clear()
            self.names.clear()

    def name(self, wheels: Mapping[str, str]) -> None:
        """The filenames of the wheels marked by sha256, for the record."""
        with self.lock:
            self.names.update(wheels)

    def to_dict(self) -> dict[str, object]:
        """report.json's `timeline`: steps in the order they began, wheels by arrival."""
        with self.lock:
            steps = sorted(self.steps.items(), key=lambda item: item[1])
            wheels = sorted(self.wheels.items(), key=lambda item: min(item[1].values()))
            return {
                "steps": {name: [round(a, 2), round(b, 2)] for name, (a, b) in steps},
                "wheels": {
                    self.names.get(sha, sha): {
                        stage: round(stages[stage], 2) for stage in WHEEL_STAGES if stage in stages
                    }
                    for sha, stages in wheels
                },
            }
