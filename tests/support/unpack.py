"""Unpacking the tests' own tar archives, on every Python the project admits."""

from __future__ import annotations

import tarfile
from pathlib import Path


def unpack(archive: Path, destination: Path) -> None:
    """Extract ``archive`` into ``destination`` with the 'tar' filter (no absolute names, no
    escape, no setuid bits) where this Python has extraction filters (3.11.4 on); Debian 12's
    3.11.2 has none and no ``filter`` argument, so the filter is set as the archive's default,
    which older releases ignore: the archive is a test's own, trusted either way."""
    with tarfile.open(archive) as tar:
        tar.extraction_filter = getattr(tarfile, "tar_filter", None)
        tar.extractall(destination)
