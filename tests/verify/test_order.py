"""`served_checks` schedules the checks so that none skews another; the report keeps its order.

Against the runtime server as a process (as tests/verify/test_checks.py runs it), every check
callable is wrapped to record when it ran and on which thread. The rules (builder/verify/run.py):
the timeout and its cleanup run one after the other on one thread; the race starts only once
everything else has finished and runs beside the detached check alone; then the flood runs
alone, then the starve check, last and alone. Why: the race counts attempts in a fixed time, the
flood times GET / and a Python start and reads the server's peak RSS, the starve check times
GET / while a few hundred connections load the accept path and hold the sandbox's own share of
connections for seconds (a check talking to the server from inside meanwhile would be refused,
and the flood's timings would be skewed). The report is in the contract's order whatever order
the checks finished in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.sandboxserver import sandbox_of, start_namespaced

from builder.verify import run
from builder.verify.checks import contract_checks
from builder.verify.client import Sandbox
from builder.verify.sdk import sdk_installed

LAST = ("race", "detached", "flood", "starve")


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    thread: int

    def overlaps(self, other: Span) -> bool:
        return self.start < other.end and other.start < self.end


@pytest.fixture
def server(tmp_path: Any) -> Iterator[Sandbox]:
    process = start_namespaced(tmp_path / "workspace")
    try:
        yield sandbox_of(process)
    finally:
        process.stop()


def timed(spans: list[tuple[str, Span]], name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    """`call`, noting in `spans` when it started and ended, and on which thread."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return call(*args, **kwargs)
        finally:
            spans.append((name, Span(start, time.monotonic(), threading.get_ident())))

    return wrapper


def test_the_lifetimes_race_flood_and_starve_run_apart_and_the_report_keeps_its_order(
    server: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[str, Span]] = []
    contract = contract_checks(process_mode=True)
    monkeypatch.setattr(
        run,
        "contract_checks",
        lambda process_mode: [(name, timed(ran, name, check)) for name, check in contract],
    )
    monkeypatch.setattr(run, "wanted_imports", timed(ran, "imports", run.wanted_imports))
    monkeypatch.setattr(run, "sdk_checks", timed(ran, "sdk", run.sdk_checks))
    real_snippet = run.snippet_run
    monkeypatch.setattr(
        run,
        "snippet_run",
        lambda sandbox, number, snippet: timed(ran, f"check {number}", real_snippet)(
            sandbox, number, snippet
        ),
    )

    checks = run.served_checks(
        server, ["json"], ["pass", "import time; time.sleep(0.5)"], (), None, process_mode=True
    ).checks

    sdk = ["sdk run", "sdk python3", "sdk timeout", "sdk write-read", "sdk list", "sdk exists"]
    expected = [name for name, _ in contract]
    expected += (sdk if sdk_installed() else []) + ["import json", "check 1", "check 2"]
    assert [check.name for check in checks] == expected
    assert all(check.passed for check in checks), [c for c in checks if not c.passed]
    wanted = [name for name, _ in contract] + ["imports", "sdk", "check 1", "check 2"]
    assert sorted(name for name, _ in ran) == sorted(wanted)  # each once
    spans = dict(ran)

    timeout, cleanup = spans["timeout"], spans["timeout-cleanup"]
    assert cleanup.start >= timeout.end and cleanup.thread == timeout.thread

    others = [span for name, span in spans.items() if name not in LAST]
    everything_else = max(span.end for span in others)
    race, detached, flood, starve = (spans[name] for name in LAST)
    assert race.start >= everything_else and detached.start >= everything_else
    assert race.overlaps(detached)  # side by side: the detached check's sleeps barely load
    assert flood.start >= max(race.end, detached.end)
    assert starve.start >= flood.end
    for alone in ("flood", "starve"):
        assert not any(spans[alone].overlaps(span) for name, span in spans.items() if name != alone)
