"""Which distributions share a layer, and how the layers stack: stable under small changes.

A registry and a node keep blobs by digest: a layer holding one wheel is the same blob in every
template that installs that wheel, on every base, so a requirements change moves only the
layers of what changed, and two templates sharing scikit-learn share its bytes. The rules:

- **Each distribution its own layer** while the set fits the budget (`budget` layers for the
  distributions; the caller derives it from the image's limits).
- **Beyond the budget, the smallest share buckets.** The largest `budget - BUCKETS`
  distributions keep their own layers; the others go into one of BUCKETS buckets chosen by a
  hash of their name, so a small distribution's bump, addition or removal rewrites only its
  bucket, whatever else the set holds (a bucket keyed by size rank would reshuffle).
- **Order: what changes least, lowest.** A node unpacks every layer above the first changed
  one again, so the own layers stack largest first (big native libraries are pinned and bumped
  rarely; their size also makes a re-unpack the costliest), ties by name, and the buckets,
  which gather the churn of many small distributions, go on top.

Pure: names and sizes in, groups out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

BUCKETS = 4  # shared layers for the small distributions once a set exceeds its budget


@dataclass(frozen=True)
class Member:
    """A distribution as the layering sees it: its name and installed size."""

    name: str  # PEP 503 normalized
    size: int


@dataclass(frozen=True)
class LayerGroup:
    """One layer's distributions by name; `bucket` is None for a distribution's own layer."""

    names: tuple[str, ...]
    size: int
    bucket: int | None = None

    @property
    def label(self) -> str:
        """How reports and the layer's history name it."""
        return self.names[0] if self.bucket is None else f"bucket {self.bucket}"


def group_layers(members: Sequence[Member], budget: int) -> tuple[LayerGroup, ...]:
    """The layers for `members`, bottom to top, at most `budget` of them (budget > BUCKETS)."""
    if budget <= BUCKETS:
        raise ValueError(f"a layer budget of {budget} leaves no room beside {BUCKETS} buckets")
    by_size = sorted(members, key=lambda m: (-m.size, m.name))
    if len(members) <= budget:
        own, rest = by_size, []
    else:
        own, rest = by_size[: budget - BUCKETS], by_size[budget - BUCKETS :]
    groups = [LayerGroup((m.name,), m.size) for m in own]
    buckets: dict[int, list[Member]] = {}
    for member in rest:
        buckets.setdefault(bucket_of(member.name), []).append(member)
    for index in sorted(buckets):
        chosen = sorted(buckets[index], key=lambda m: m.name)
        groups.append(LayerGroup(tuple(m.name for m in chosen), sum(m.size for m in chosen), index))
    return tuple(groups)


def bucket_of(name: str) -> int:
    """The bucket a small distribution goes to: a hash of its name alone, never of the set."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % BUCKETS
