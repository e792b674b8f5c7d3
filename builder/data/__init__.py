"""Distro and base knowledge shipped as data files, each with the script that regenerates it.

`shipped_text` and `shipped_bytes` are the one reader of these files: they are part of the
installed tool, fixed as its code is, so the pure modules that decide by them (plan.debian,
plan.gpu, resolve.target) may reach this reader and stay pure (tests/test_layout.py).
"""

from importlib import resources


def shipped_text(name: str) -> str:
    """The shipped data file `name` (e.g. "gpu.toml"), as text."""
    return resources.files(__name__).joinpath(name).read_text()


def shipped_bytes(name: str) -> bytes:
    """The shipped data file `name` (e.g. "sonames-amd64.tsv.gz"), as bytes."""
    return resources.files(__name__).joinpath(name).read_bytes()
