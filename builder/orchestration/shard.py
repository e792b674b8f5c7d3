"""A fleet across CI runners: `rebuild … --shard K/N` takes the K-th of N slices of its configs.

The CI system is the distributed engine (a matrix of N jobs, each given the same `--config`
list); the tool only has to give each job a slice that is the same on every runner. The slice is
by index in the list sorted by path (each path as written, normalised: `./a/cfg.toml` is
`a/cfg.toml`), dealt round-robin: config i of the sorted list goes to slice i mod N + 1. Sorted,
so the order a job's shell globbed or wrote the list in does not matter; by index rather than a
hash of the path, so the slices differ in size by at most one (a hash deals three configs to
two slices as 3 + 0 as often as 2 + 1, and a fleet's wall time is its largest slice). The price:
adding a config to the list may move others to another slice, which costs nothing here, each
job being a rebuild of its own with its state in each config's own files.

Each job writes its table as JSON (`--output-json`, by default `rebuild-shard-K-of-N.json`) so
a last CI step, or an operator, reads the N answers without parsing the printed tables.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from builder.errors import UserError
from builder.publish.state import write_json_whole

if TYPE_CHECKING:
    from builder.orchestration.fleet import Fleet, FleetResult

SHARD_FORMAT = re.compile(r"([0-9]+)/([0-9]+)")


class RowRecord(TypedDict):
    """One row of the table as JSON: the config as given, the path it took, digest or reason."""

    template: str
    path: str
    detail: str


class TableRecord(TypedDict):
    """A fleet run's table as JSON (`--output-json`), with its verdict."""

    new_version: str
    check: bool
    shard: str | None  # "K/N"; None when the run was not sharded
    rows: list[RowRecord]
    failed: list[str]


@dataclass(frozen=True)
class Shard:
    """The K-th (1-based) of N slices."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def default_json(self) -> Path:
        """Where a shard writes its table without --output-json: one name per slice."""
        return Path(f"rebuild-shard-{self.index}-of-{self.count}.json")


def parse_shard(text: str) -> Shard:
    """`K/N` with 1 <= K <= N; anything else is one line naming the value."""
    found = SHARD_FORMAT.fullmatch(text.strip())
    if found is None:
        raise UserError(f"--shard {text!r}: expected K/N, e.g. 1/4")
    index, count = int(found[1]), int(found[2])
    if count < 1 or not 1 <= index <= count:
        raise UserError(f"--shard {text!r}: K must be 1 to N, and N at least 1")
    return Shard(index, count)


def _key(path: Path) -> str:
    return os.path.normpath(str(path))


def shard_configs(configs: Sequence[Path], shard: Shard) -> list[Path]:
    """This job's configs: those whose place in the sorted list is K-1 modulo N, in that order."""
    ordered = sorted(configs, key=_key)
    return [path for place, path in enumerate(ordered) if place % shard.count == shard.index - 1]


def table_document(result: FleetResult, fleet: Fleet, shard: Shard | None) -> TableRecord:
    """The printed table as data: one row per template, with the run's verdict."""
    return {
        "new_version": fleet.new_version,
        "check": fleet.check_only,
        "shard": str(shard) if shard is not None else None,
        "rows": [
            {"template": row.name, "path": str(row.path), "detail": row.detail}
            for row in result.rows
        ],
        "failed": result.failed,
    }


def write_table(path: Path, document: TableRecord) -> None:
    """Written whole or not at all (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_whole(path, document)
