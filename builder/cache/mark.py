"""Which directory is the tool's cache: the one it marked, never one it was pointed at by mistake.

The cache marks itself with a `CACHEDIR.TAG` (the Cache Directory Tagging Specification's, which
backup tools honour, as uv's, pip's and ccache's caches do) when a run creates it or first adopts
it. A directory without the mark is used only when it is missing or empty (it becomes a marked
cache) or holds nothing but the tool's own layout (a cache an earlier version wrote: marked, so an
upgrade keeps it); any other is refused in one line, before anything is written or removed. `/`,
the home directory, the working directory and a directory holding any of them (or the run's
output) are refused outright, marked or not.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from builder.cache import Cache
from builder.cache.layout import TAG, Kind, entries, listing
from builder.errors import UserError

SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"  # the specification's first line
TAG_TEXT = (
    f"{SIGNATURE}\n"
    "# This file is a cache directory tag created by build-sandbox-image.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)
# what shows an unmarked directory is an earlier version's cache: a blob of its layout
LEGACY_EVIDENCE = frozenset({Kind.WHEELS, Kind.LAYERS, Kind.BYTECODE, Kind.SOCI})


def opened(root: Path, *, beside: Sequence[tuple[str, Path]] = (), create: bool = True) -> Cache:
    """The cache at `root`, checked and marked: refused when it is a place no cache may be (the
    run's own `beside`, e.g. ("the output directory", its path), too) or a directory that is not
    the tool's cache.
    `create`: a missing one is made (a run); else it stays missing (`cache`, which reads)."""
    places = tuple((what, _real(path)) for what, path in beside)
    if why := refusal(_real(root), _real(Path.home()), _real(Path.cwd()), places):
        raise UserError(
            f"cache directory {root}: {why}; give a directory of its own"
            " (--cache-dir, BSI_CACHE_DIR)"
        )
    if not root.exists() and not root.is_symlink():
        if create:
            root.mkdir(parents=True, exist_ok=True)
            mark(root)
        return Cache(root.absolute())  # a wheel's file:// URL needs an absolute path
    if not root.is_dir():
        raise UserError(f"cache directory {root}: not a directory")
    if why := not_ours(root):
        raise UserError(f"cache directory {root}: {why}; give an empty or new directory")
    if create or listing(root):
        mark(root)
    return Cache(root.absolute())


def _real(path: Path) -> Path:
    """`path` with its links followed as far as they lead: a link in a loop (an `--output` planted
    as one) is left as it is, for the check that refuses it, where `Path.resolve` raises."""
    return Path(os.path.realpath(path))


def refusal(
    root: Path, home: Path, cwd: Path, beside: Sequence[tuple[str, Path]] = ()
) -> str | None:
    """Why no cache may be at `root` (resolved, as the others are), or None: a prune or a clean
    there could remove what the user keeps."""
    if root == Path(root.anchor):
        return "is the file system's root"
    places = (("your home directory", home), ("the working directory", cwd), *beside)
    for what, place in places:
        if root == place:
            return f"is {what}"
        if place.is_relative_to(root):
            return f"holds {what} ({place})"
    return None


def not_ours(root: Path) -> str | None:
    """Why the directory `root` is not the tool's cache, or None: marked by this tool (its tag's
    own comment line, not merely its name somewhere in another program's tag), or unmarked but
    empty or an earlier version's cache: the tool's layout alone, with at least one blob in
    it. A folder that happens to hold only `runs/`, `locks/`, `uv/` or `<word>/xx/*.json` is no
    cache an earlier version wrote (they all kept blobs; none kept uv's cache), so it is not
    adopted, and nothing in it is removed."""
    tag = root / TAG
    if tag.is_file() and not tag.is_symlink():
        lines = tag.read_text(errors="replace").splitlines()
        if lines[:2] == TAG_TEXT.splitlines()[:2]:
            return None
        return f"its {TAG} is another program's (a cache of its own)"
    found = entries(root)
    unknown = [e.path for e in found if e.kind is Kind.UNKNOWN or e.kind is Kind.UV]
    if found and not unknown and not any(e.kind in LEGACY_EVIDENCE for e in found):
        unknown = [e.path for e in found]
    if unknown:
        named = ", ".join(str(path.relative_to(root)) for path in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        return f"not a build-sandbox-image cache (no {TAG}; it holds {named}{more})"
    return None


def mark(root: Path) -> None:
    """Write the tag (atomically: a concurrent run sees it whole or not at all) unless there; a
    cache another user wrote, read here, stays as it is."""
    tag = root / TAG
    if tag.is_file():
        return
    try:
        fd, temp = tempfile.mkstemp(dir=root, prefix=".partial-")
    except PermissionError:
        return
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(TAG_TEXT)
        os.chmod(temp, 0o644)
        os.replace(temp, tag)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
