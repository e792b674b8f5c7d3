"""Where a run's progress lines and notes go: one object, made by the CLI, carried in records.

Progress goes to stdout (the CLI's `note`), a test's list, or nowhere; stderr is kept for the
one-line error, and for the notes of a command whose stdout is its product (`sbom`'s document,
`verify --json`'s report, `base`'s image names). Every layer that tells the user something
takes the reporter it was given rather than printing, so a library caller decides where the
lines go.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Reporter:
    """Says one line at a time to `sink`."""

    sink: Callable[[str], None]

    def say(self, line: str) -> None:
        self.sink(line)

    def note(self, line: str) -> None:
        self.sink(f"note: {line}")

    def warn(self, line: str) -> None:
        self.sink(f"warning: {line}")

    def prefixed(self, name: str) -> Reporter:
        """A reporter whose lines start with `[name]`: templates rebuilt at once
        (builder.orchestration.fleet) interleave their lines, and each must still say whose it
        is."""
        return Reporter(lambda line: self.sink(f"[{name}] {line}"))


QUIET = Reporter(lambda line: None)
TO_STDERR = Reporter(lambda line: print(line, file=sys.stderr, flush=True))
