"""Check results and the verification report, and how one check is run into a result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, NotRequired, TypedDict

FAILURES_NAMED = 6  # failed checks an error line names; the table above lists every one


class ContractViolation(Exception):
    """The server's answer breaks the runtime contract; the message is the report's detail."""


class CheckFailed(ContractViolation):
    """A check's expectation did not hold; the message is the report's detail."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def short(value: Any, limit: int = 160) -> str:
    """One line of at most `limit` characters, for a report's detail."""
    text = value if isinstance(value, str) else repr(value)
    text = text.strip().replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def last_line(text: str) -> str:
    return short((text.strip().splitlines() or ["?"])[-1])


class Status(Enum):
    """How a check's line reads: a warning passes, unless the report is strict."""

    PASS = "pass"
    INFO = "info"  # passed; something worth knowing (a deep import failing the same way anywhere)
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str
    warning: bool = False  # passed, but with something an agent would trip on (a noisy import)
    info: bool = False  # passed; information the operator may act on (fails a strict report)


def warned(check: Check, why: str) -> Check:
    """`check` as a warning, `why` added to its detail (a failed check stays failed)."""
    return replace(check, detail=f"{check.detail}; {why}", warning=check.passed)


def noted(check: Check, why: str) -> Check:
    """`check` as information, `why` (when given) added to its detail."""
    return replace(check, detail=f"{check.detail} {why}" if why else check.detail, info=True)


@dataclass(frozen=True)
class DeepFigures:
    """One distribution's deep imports: its modules imported, failed, informational, not
    reached within the budget, skipped by --skip-module, and the seconds its imports took."""

    distribution: str
    imported: int
    failed: int
    informational: int
    unreached: int
    skipped: int
    seconds: float


class DeepRecord(TypedDict):
    distribution: str
    imported: int
    failed: int
    informational: int
    unreached: int
    skipped: int
    seconds: float


class CheckRecord(TypedDict):
    name: str
    passed: bool
    status: str  # Status' value: pass, info, warn, fail
    detail: str


class VerifyRecord(TypedDict):
    """A report as report.json's `verification` and `verify --json` print it."""

    image: str
    passed: bool
    strict: bool
    checks: list[CheckRecord]
    deep_imports: NotRequired[list[DeepRecord]]  # per distribution, when deep imports ran


@dataclass(frozen=True)
class Checked:
    """Checks, and the files one interpreter read to import the set (empty when none got
    through): what a lazy node fetches for the set's first import (report.json's `soci`)."""

    checks: list[Check]
    reads: tuple[str, ...] = ()


@dataclass
class VerifyReport:
    image: str
    checks: list[Check] = field(default_factory=list)
    first_import_reads: tuple[str, ...] = ()  # absolute paths in the image, symlinks resolved
    strict: bool = False  # a warning or information fails the report (`verify --strict`)
    deep: list[DeepFigures] = field(default_factory=list)  # per distribution, when deep imports ran

    def status(self, check: Check) -> Status:
        """A check's line: a warning or information is a failure in a strict report."""
        if not check.passed or ((check.warning or check.info) and self.strict):
            return Status.FAIL
        if check.warning:
            return Status.WARN
        return Status.INFO if check.info else Status.PASS

    @property
    def passed(self) -> bool:
        return bool(self.checks) and not self.failed

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if self.status(check) is Status.FAIL]

    def failed_names(self) -> str:
        """The failed checks for the one error line: the first few by name, then how many
        more the table above lists (a strict run's deep imports can fail dozens)."""
        names = [check.name for check in self.failed]
        shown = ", ".join(names[:FAILURES_NAMED])
        more = len(names) - FAILURES_NAMED
        return f"{shown} and {more} more" if more > 0 else shown

    def table(self) -> str:
        width = max((len(check.name) for check in self.checks), default=0)
        lines = [f"verify {self.image}"]
        lines += [f"{self.status(c).name}  {c.name.ljust(width)}  {c.detail}" for c in self.checks]
        passed = len(self.checks) - len(self.failed)
        warnings = sum(self.status(check) is Status.WARN for check in self.checks)
        notes = sum(self.status(check) is Status.INFO for check in self.checks)
        tail = f", {warnings} with a warning" if warnings else ""
        tail += f", {notes} for information" if notes else ""
        lines.append(f"{passed}/{len(self.checks)} checks passed{tail}{self.deep_summary()}")
        return "\n".join(lines)

    def deep_summary(self) -> str:
        """The summary line's deep-import part: modules imported, failed, informational."""
        if not self.deep:
            return ""
        imported = sum(f.imported for f in self.deep)
        failed = sum(f.failed for f in self.deep)
        info = sum(f.informational for f in self.deep)
        seconds = round(sum(f.seconds for f in self.deep), 1)
        return (
            f"; deep imports of {len(self.deep)} distributions: {imported} modules imported,"
            f" {failed} failed, {info} informational ({seconds} s)"
        )

    @classmethod
    def merged(cls, label: str, reports: Sequence[tuple[str, VerifyReport]]) -> VerifyReport | None:
        """One table for several arches' reports, each line led by its arch; one stays as is.

        The one place reports are merged: a multi-arch build and a multi-arch rebase both
        show (and fail on) every arch's checks at once.
        """
        if len(reports) <= 1:
            return reports[0][1] if reports else None
        return cls(
            f"{label} ({', '.join(arch for arch, _ in reports)})",
            [
                replace(check, name=f"[{arch}] {check.name}")
                for arch, report in reports
                for check in report.checks
            ],
            strict=any(report.strict for _, report in reports),
            deep=[
                replace(f, distribution=f"[{arch}] {f.distribution}")
                for arch, report in reports
                for f in report.deep
            ],
        )

    def to_dict(self) -> VerifyRecord:
        record = VerifyRecord(
            image=self.image,
            passed=self.passed,
            strict=self.strict,
            checks=[
                CheckRecord(
                    name=check.name,
                    passed=self.status(check) is not Status.FAIL,
                    status=self.status(check).value,
                    detail=check.detail,
                )
                for check in self.checks
            ],
        )
        if self.deep:
            record["deep_imports"] = [DeepRecord(**vars(figures)) for figures in self.deep]  # type: ignore[typeddict-item]
        return record
