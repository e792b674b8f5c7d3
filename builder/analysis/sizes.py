"""What the image carries: download and installed sizes, and GPU-only weight.

A CPU-only sandbox gets nothing from CUDA runtimes, yet popular distributions pull them by
default (xgboost → nvidia-nccl-cu12, hundreds of MB). builder/data/gpu.toml names them and,
when one is known, the CPU build to ask for instead.
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
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


@cache
def _gpu_table() -> tuple[tuple[str, ...], Mapping[str, str]]:
    table = tomllib.loads(resources.files("builder.data").joinpath("gpu.toml").read_text())
    return tuple(table["patterns"]), dict(table.get("replacements", {}))


def is_gpu_only(name: str) -> bool:
    patterns, _ = _gpu_table()
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def gpu_warnings(wheels: Sequence[Sized]) -> list[str]:
    """One warning per GPU-only distribution, with its size and the known way out."""
    _, replacements = _gpu_table()
    present = {w.name for w in wheels}
    gpu = [w for w in wheels if is_gpu_only(w.name)]
    if not gpu:
        return []
    instead = [f"{name} → {replacements[name]}" for name in sorted(present & set(replacements))]
    hint = f"; CPU builds: {', '.join(instead)}" if instead else ""
    return [
        f"warning: {w.name}=={w.version} ({human(w.size)} download, {human(w.installed_size)}"
        f" installed) only works on a GPU, useless in a CPU-only sandbox{hint}; or drop it"
        f" with --override (a line `{w.name} ; python_version < '0'`)"
        for w in gpu
    ]
