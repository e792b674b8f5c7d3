"""What the image carries: download and installed sizes, as registries and pip print them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

MB = 1_000_000


class Sized(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def installed_size(self) -> int: ...


def size_figures(wheels: Sequence[Sized]) -> dict[str, int]:
    """Bytes to download and bytes unpacked, summed over `wheels`."""
    return {
        "download": sum(w.size for w in wheels),
        "installed": sum(w.installed_size for w in wheels),
    }


def human(size: int) -> str:
    """Decimal megabytes, as registries and pip print them."""
    return f"{size / MB:.1f} MB" if size >= MB // 10 else f"{size / 1000:.0f} kB"
