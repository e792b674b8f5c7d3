"""The cache's bound: sizes as an operator writes them, the default, and the prune a run ends with.

Every build ends by pruning the cache to its bound (`--cache-max`, the config's `cache-max`),
by default the smaller of 20 GB and 10 % of the cache's file system, as BuildKit's default
garbage collection keeps its store; `0` is unbounded. The run says it is using the cache while
it runs (builder.cache.Cache.in_use), so another run's prune meanwhile keeps what it uses; its
own prune comes after it stopped using it, so the bound holds at its end even when its own
set needs more.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from builder.cache import Cache
from builder.cache.prune import Pruned, prune
from builder.errors import UserError, human

DEFAULT_MAX = 20 * 10**9  # bytes: the default bound's ceiling
DEFAULT_SHARE = 0.10  # of the cache's file system: the default bound on a smaller disk
UNITS = MappingProxyType(
    {
        "": 1,
        "b": 1,
        "k": 1024,
        "kb": 1000,
        "kib": 1024,
        "m": 1024**2,
        "mb": 1000**2,
        "mib": 1024**2,
        "g": 1024**3,
        "gb": 1000**3,
        "gib": 1024**3,
        "t": 1024**4,
        "tb": 1000**4,
        "tib": 1024**4,
    }
)
SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*", re.IGNORECASE)
SIZE_EXAMPLES = "e.g. 20GB, 500MiB, 2G; 0 for unbounded"


def parse_size(text: str, what: str) -> int:
    """Bytes from `20GB` (decimal), `20GiB` or `20G` (binary), or a plain number of bytes;
    `what` names the setting in the error. A size below one byte but above 0 is refused: it
    would round to 0, which means unbounded."""
    match = SIZE_RE.fullmatch(text)
    unit = match and UNITS.get(match.group(2).lower())
    if match is None or unit is None:
        why = "a size must not be negative" if text.strip().startswith("-") else SIZE_EXAMPLES
        raise UserError(f"{what}: {text[:40]!r} is not a size ({why})")
    exact = float(match.group(1)) * unit
    if 0 < exact < 1:
        raise UserError(f"{what}: {text[:40]!r} is below one byte (0 means unbounded)")
    return int(exact)


def default_bound(root: Path) -> int:
    """The smaller of 20 GB and 10 % of the file system the cache is (or would be) on."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    stats = os.statvfs(existing)
    return min(DEFAULT_MAX, int(stats.f_blocks * stats.f_frsize * DEFAULT_SHARE))


@dataclass
class Bounded:
    """A run's bound, and what its closing prune did (None until the run ended; unbounded)."""

    limit: int  # bytes; 0: unbounded
    pruned: Pruned | None = None
    failed: str | None = None  # why the closing prune could not run (the build stands)

    def summary(self) -> str | None:
        """One line for the run's output: said when unbounded, or when the prune removed or
        had to keep something; a prune with nothing to do is silent."""
        if self.limit == 0:
            return "cache: unbounded (--cache-max 0 / cache-max = 0): nothing is pruned"
        if self.failed:
            return f"warning: cache: not pruned to its bound ({self.failed})"
        pruned = self.pruned
        if pruned is None or (pruned.removed == 0 and pruned.left <= self.limit):
            return None
        line = (
            f"cache: pruned {pruned.removed} entries ({human(pruned.freed)}) to its bound of"
            f" {human(self.limit)}; {human(pruned.left)} left"
        )
        if pruned.left > self.limit:
            line += f", over the bound while {pruned.running} other run(s) use it"
        return line


@contextmanager
def bounded_use(cache: Cache, limit: int | None) -> Iterator[Bounded]:
    """Use the cache for a run, then prune it to `limit` (None: the default bound; 0: never),
    after the run stopped using it, whether it succeeded or failed."""
    bound = Bounded(default_bound(cache.root) if limit is None else limit)
    try:
        with cache.in_use():
            yield bound
    finally:
        if bound.limit:
            try:
                bound.pruned = prune(cache, keep=bound.limit)
            except OSError as error:  # never hides the run's own outcome
                bound.failed = f"{error.strerror}: {error.filename}"
