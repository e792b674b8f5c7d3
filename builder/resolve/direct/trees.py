"""A project's tree as its build reads it: a symbolic link that leaves it is refused.

A build backend follows links: a link in a project to a host file (`/root/.docker/config.json`,
`../../.ssh/id_rsa`) would ship that file in the wheel, and from there in a layer. A
repository's export (builder.resolve.direct.vcs) and a local project directory
(builder.resolve.direct.fetch) are both held to this before they are built; links inside the
project are fine. A source distribution's links are checked in its archive, before it is
unpacked (builder.resolve.index).
"""

from __future__ import annotations

import os
from pathlib import Path

from builder.errors import UserError, shown

VCS_DIRECTORIES = frozenset({".git", ".hg"})  # a repository's own records: never built


def refuse_links_out(tree: Path, label: str) -> None:
    """Refuse (one line, `label` naming the requirement) the first link under `tree` whose
    target, every link on its way followed, is not in `tree`."""
    root = tree.resolve()
    for directory, directories, files in os.walk(tree):
        directories[:] = [d for d in directories if d not in VCS_DIRECTORIES]
        for name in (*directories, *files):  # os.walk lists a link to a directory as one
            link = Path(directory, name)
            if not link.is_symlink():
                continue
            target = Path(os.path.realpath(link))  # a loop resolves to itself: no way out
            if target != root and root not in target.parents:
                inside = str(link.relative_to(tree))
                raise UserError(f"{label}: {shown(inside)} links outside the project")
