"""Whether a file a run writes after its push (the template, the state, the config) can be.

Checked before anything is built or pushed: a run that pushed and only then finds it cannot
record what it pushed has moved a tag and left the template behind. Each of these files is
replaced the same way, a new file beside it renamed over it, so the directory must be writable,
on a file system mounted read-write. A file the operator marked read-only (no write bit at all)
is theirs to keep: it is refused even for root, whom the permission bits do not stop.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from builder.errors import UserError


def check_replaceable(path: Path, what: str) -> None:
    """One UserError naming `path` and why it cannot be replaced; `what` says what it holds."""
    reason = _refusal(path)
    if reason is not None:
        raise UserError(f"{path}: {reason}, so the {what} cannot be written")


def _refusal(path: Path) -> str | None:
    """Why `path` cannot be replaced by a sibling renamed over it; None when it can."""
    folder = path.parent
    if not folder.is_dir():
        return f"its directory {folder} does not exist"
    try:
        found = path.stat()
    except FileNotFoundError:
        found = None
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    if found is not None and not stat.S_ISREG(found.st_mode):
        return "is not a regular file"
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return "is on a read-only file system"
    if found is not None and not found.st_mode & 0o222:
        return f"is read-only (mode {stat.S_IMODE(found.st_mode):04o})"
    if found is not None and not os.access(path, os.W_OK):
        return "is not writable by this user"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its directory {folder} is not writable by this user"
    return None
