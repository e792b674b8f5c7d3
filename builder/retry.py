"""One retry policy for every registry and package index request: what is retried, how long to
wait, when to stop.

Registries have bad days (docs/usage.md, "When a registry fails"): Docker Hub answers 429 with
`Retry-After`, registries and their proxies answer 500/502/503/504 under load, load balancers
drop idle keep-alive connections (a connection reset or closed without an answer), a body is
cut short. Each of those is answered by trying again after a wait that grows exponentially
(with jitter, so that the templates of a fleet do not retry in step), and never sooner than a
`Retry-After` asks (capped: a registry asking for an hour is not waited on for an hour). A
400, 403 or 404 is an answer, not a fault: never retried; a 401 only through re-authentication
(builder.oci.client). Timeouts are connection errors.

Two bounds make a registry that is down fail the run instead of hanging it: the tries of one
request (`Policy.tries`), and the time one run may lose to faults (`Policy.budget`: the failed
tries' own durations and the waits, summed over every request of the run; the try that
overruns it is the last). With the real policy a registry that answers 503 to everything fails
a run within seconds of its first 503, and one that accepts connections and never answers
within about two minutes (two 60 s timeouts and a wait: the budget is spent, and that request
fails). A run is one template: a fleet rebuild gives each template a `Retries` of its own
(builder.orchestration.commands.rebuild), so one template's bad luck is not the fleet's.

A body that trickles is a fault too (`SteadyBody`): the 60 s timeout bounds each receive, not
a transfer, so a registry or index sending a byte every 59 s would otherwise hold a run for
days. A body moving less than `Policy.stall_floor` bytes in a `stall_window` is `Stalled`, a
timeout, tried again as one.

The decisions are pure functions of the policy (`retryable`, `backoff`, `retry_after`,
`wait`); `Retries` is the one mutable part, one per run: it holds the clock, the sleep and the
random source (injected by tests, so that they need no real waiting), the budget spent, the
line said for each retry, and the record of them all (report.json's `registry_retries`).
`Retries.attempt` is the one loop every remote call goes through (the registry client's and
the package index's): the caller says which of its errors are faults and how a retry line
names them (`Faulted`); the loop counts the tries, waits, says and records each retry and
spends the budget.
"""

from __future__ import annotations

import datetime
import email.utils
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
RECEIVE = 1 << 20  # bytes asked of one receive


@dataclass(frozen=True)
class Policy:
    """How hard one run tries: per request, and in all."""

    tries: int = 5  # per request, the first included
    base: float = 0.5  # seconds before the second try; doubled for each later one
    longest: float = 10.0  # seconds: the longest backoff between two tries
    retry_after_cap: float = 30.0  # seconds: the longest a Retry-After is waited on
    budget: float = 120.0  # seconds a run may lose to faults: failed tries and waits
    stall_window: float = 60.0  # seconds over which a body's progress is measured
    stall_floor: int = 64 << 10  # bytes a body must move in each window (about 1 KiB/s)


POLICY = Policy()  # what every real run uses


def retryable(status: int | None) -> bool:
    """Is this outcome a fault worth another try? `None`: no answer (refused, reset, closed,
    timed out, a body cut short or not matching its digest)."""
    return status is None or status in RETRYABLE_STATUSES


def unresolvable(exc: BaseException) -> bool:
    """Is `exc` a host name that does not resolve, which seconds will not change? A resolver
    that answers "try again" (EAI_AGAIN: no answer in time, a loaded or restarting resolver)
    is a fault like any other no-answer, worth another try."""
    why = getattr(exc, "reason", exc)
    return isinstance(why, socket.gaierror) and why.errno != socket.EAI_AGAIN


def reason(exc: BaseException) -> str:
    """A network error in a few words, as a retry line names it: `connection reset`, `timed
    out`, … (a registry's or an index's)."""
    why = getattr(exc, "reason", None) or exc
    text = str(why) or type(why).__name__
    return text[:100]


def backoff(policy: Policy, attempt: int, jitter: float) -> float:
    """The wait after failed try `attempt` (1-based): base * 2^(attempt-1), capped at
    `longest`, scaled by `jitter` in [0, 1) into its upper half (never less than half)."""
    full = min(policy.longest, policy.base * 2 ** (attempt - 1))
    return full * (0.5 + jitter / 2)


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` header asks for (delta-seconds or an HTTP date, against the
    wall-clock `now`); None when absent or unreadable. A date in the past asks for 0; a huge
    number is returned as it is (`wait` caps it). Header values arrive decoded as Latin-1, so
    `²` is a "digit" to `str.isdigit` but no number: only ASCII digits count."""
    if not value or not value.strip():
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime's form names no zone: every HTTP date is GMT
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)


def wait(policy: Policy, attempt: int, jitter: float, asked: float | None) -> float:
    """The wait before try `attempt + 1`: the backoff, or longer when the registry asked for
    longer, and never longer than `retry_after_cap`."""
    chosen = backoff(policy, attempt, jitter)
    if asked is not None:
        chosen = max(chosen, min(asked, policy.retry_after_cap))
    return chosen


class Speaker(Protocol):
    """Where a retry's line goes: the run's reporter (builder.reporter.Reporter is one)."""

    def note(self, line: str) -> None: ...


class _Silent:
    def note(self, line: str) -> None:
        pass


class Service(StrEnum):
    """What answered a retried request: a registry, or a package index (listings, wheels)."""

    REGISTRY = "registry"
    INDEX = "index"


@dataclass(frozen=True)
class Faulted:
    """How a caller sees one failed try: the answer a retry line names (`503`, `connection
    reset`, …) and the `Retry-After` the answer carried."""

    answer: str
    asked: str | None = None


# A caller's reading of an error: a fault to try again, or None (an answer for good: re-raised).
Classify = Callable[[Exception], Faulted | None]
# What a caller raises once the tries or the budget are spent: the last error, and the tries made.
GiveUp = Callable[[Exception, int], BaseException]


@dataclass(frozen=True)
class Retried:
    """One retry as report.json records it."""

    registry: str  # host[:port]
    request: str  # method, repository and object: "GET library/x/manifests/1.0"
    answer: str  # "503", "429", "connection reset …", "a body cut short"
    wait: float  # seconds waited before the next try
    attempt: int  # the try that failed, 1-based
    tries: int  # of how many
    service: Service = Service.REGISTRY  # or a package index (listings, wheel downloads)

    def to_dict(self) -> dict[str, object]:
        return {
            "service": self.service,
            "registry": self.registry,
            "request": self.request,
            "answer": self.answer,
            "wait_seconds": round(self.wait, 2),
            "try": self.attempt,
            "of": self.tries,
        }


@dataclass
class Retries:
    """One run's retries: the policy, the clocks, the budget left, and what was retried.

    Shared by every registry client of the run and its index requests (listings, wheel
    downloads: builder.resolve.index), its threads too (the record is locked). The
    clock measures how long a failed try took (monotonic); `wall` is what an HTTP-date
    `Retry-After` is read against.
    """

    speaker: Speaker = field(default_factory=_Silent)
    policy: Policy = POLICY
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random
    spent: float = 0.0  # seconds lost to faults so far
    record: list[Retried] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def again(
        self,
        registry: str,
        request: str,
        answer: str,
        attempt: int,
        started: float,
        asked: str | None = None,
        service: Service = Service.REGISTRY,
    ) -> bool:
        """After failed try `attempt` (begun at `started` on `clock`): wait and say so, and
        True; False when the request's tries or the run's budget are spent (the caller
        raises its error, with its last answer).

        The budget is the registry's: a package index's requests (`Service.INDEX`) are
        bounded by their tries alone, as they always were. They run eight at a time, and
        eight timeouts of one hiccup, summed, would spend in one go the budget that tells a
        registry that is down from one having a bad minute."""
        if attempt >= self.policy.tries:
            return False
        pause = wait(self.policy, attempt, self.jitter(), retry_after(asked, self.wall()))
        with self.lock:
            lost = self.clock() - started + pause
            if service == Service.REGISTRY:
                if self.spent + lost > self.policy.budget:
                    self.spent = self.policy.budget  # later requests fail at their first fault
                    return False
                self.spent += lost
            one = Retried(registry, request, answer, pause, attempt, self.policy.tries, service)
            self.record.append(one)
        said = f"answered {answer}" if answer.isdigit() else f"failed ({answer})"
        self.speaker.note(
            f"{service} {registry} {said} to {request}"
            f" (try {attempt} of {self.policy.tries}); trying again in {pause:.1f} s"
        )
        self.sleep(pause)
        return True

    def attempt(
        self,
        where: tuple[str, str],
        once: Callable[[], T],
        classify: Classify,
        give_up: GiveUp | None = None,
        service: Service = Service.REGISTRY,
    ) -> T:
        """`once()` until it does not fault: the one retry loop of every remote call.

        `where` is the host and the request a retry line names; `classify` tells a fault from
        an answer (an error it returns None for is raised as it is, at once). When `again`
        says the tries or the budget are spent, the last error is raised, or what
        `give_up(error, tries)` makes of it."""
        host, request = where
        tries = 1
        while True:
            started = self.clock()
            try:
                return once()
            except Exception as error:
                if (fault := classify(error)) is None:
                    raise
                said, asked = fault.answer, fault.asked
                if not self.again(host, request, said, tries, started, asked, service):
                    if give_up is None:
                        raise
                    raise give_up(error, tries) from None
            tries += 1

    def after(self, tries: int) -> str:
        """What an error names of the tries it took: `` (after 3 tries)``, with the budget when
        it is spent; nothing for a first try that was also the last by the policy's choice."""
        if tries == 1 and not self.exhausted():
            return ""
        spent = "; the run's retry budget is spent" if self.exhausted() else ""
        return f" (after {tries} {'try' if tries == 1 else 'tries'}{spent})"

    def exhausted(self) -> bool:
        """Has the run's budget run out (the reason a request stopped before its tries)?"""
        return self.spent >= self.policy.budget

    def to_list(self) -> list[dict[str, object]]:
        with self.lock:
            return [one.to_dict() for one in self.record]


class Stalled(TimeoutError):
    """A body that moved fewer bytes in a window than the policy's floor: a trickle, a fault."""


class SteadyBody:
    """A response's body, read one receive at a time so that a trickle is seen.

    Each receive returns what arrived (`read1`), so every piece is counted as it comes, with
    the time the receive waited for it. Once `stall_window` seconds were spent waiting (time
    the caller spends between reads does not count: an upload sending what it read is not
    the source stalling), the bytes of that window are checked against the floor. `read`
    keeps a file's meaning: `size` bytes, fewer only at the end of the body.
    """

    def __init__(
        self, response: Any, policy: Policy = POLICY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.response = response
        self.policy = policy
        self.clock = clock
        self.waited = 0.0  # seconds spent receiving in the current window
        self.moved = 0  # bytes in the current window

    def read(self, size: int = -1) -> bytes:
        pieces: list[bytes] = []
        got = 0
        while size < 0 or got < size:
            began = self.clock()
            piece = self.response.read1(RECEIVE if size < 0 else min(RECEIVE, size - got))
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
            self._count(len(piece), self.clock() - began)
        return b"".join(pieces)

    def close(self) -> None:
        self.response.close()

    def _count(self, size: int, seconds: float) -> None:
        self.moved += size
        self.waited += seconds
        if self.waited < self.policy.stall_window:
            return
        if self.moved < self.policy.stall_floor:
            raise Stalled(f"stalled: {self.moved} bytes in {self.waited:.0f} s")
        self.waited, self.moved = 0.0, 0
