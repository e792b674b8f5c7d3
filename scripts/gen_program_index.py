"""Regenerate builder/data/programs-<arch>.tsv.gz from Debian's Contents indexes.

Python code runs programs by name (`subprocess.run(["pdftoppm", ...])`); apt installs
packages. The Contents index maps every file to the packages shipping it, so the files on
the default PATH (``usr/bin``, ``bin``, ``usr/sbin``, ``sbin``) give the program -> package
table, as gen_soname_index.py gives the soname one. Programs live in arch-specific packages
(Contents-<arch>) and in architecture-independent ones (Contents-all: scripts, xdg-utils,
TeX Live), so both are read. Names that only the alternatives system creates at install time
(`convert`, `awk`, `editor`) are not files of any package and are not listed.

Usage: scripts/gen_program_index.py [--mirror URL] [--suite trixie] [--out DIR] [ARCH ...]
About 13 MB (per arch) and 38 MB (all) compressed are streamed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a plain script from a checkout

from gen_soname_index import (  # noqa: E402  (this directory: the same family)
    UNWANTED_SUFFIXES,
    contents_entries,
    index_arguments,
    stream_lines,
    write_index,
)

from builder.resolve.target import ARCHES  # noqa: E402

PATH_DIRECTORIES = ("usr/bin/", "bin/", "usr/sbin/", "sbin/")


def preference(package: str) -> tuple[bool, bool, int, str]:
    """Sort key: the canonical package first (never -dbg or -cross, then the shortest name,
    which is the upstream one: `ffmpeg` before `ffmpeg-doc`-like variants)."""
    return (package.endswith(UNWANTED_SUFFIXES), package.endswith("-cross"), len(package), package)


def parse_contents(
    lines: Iterable[str], index: dict[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Add each program on the default PATH to `index` (name -> packages shipping it).

    A Contents line is ``path<whitespace>section/pkg[,section/pkg...]``, split on the last
    whitespace run (paths may hold spaces). A program in /usr/bin and /bin (merged /usr) is
    one name.
    """
    index = {} if index is None else index
    for directory, name, packages in contents_entries(lines):
        if directory in PATH_DIRECTORIES and name:
            index.setdefault(name, set()).update(packages)
    return index


def ordered(index: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each program's packages, preferred first; programs only unwanted packages ship dropped."""
    return {
        name: sorted(packages, key=preference)
        for name, packages in index.items()
        if not all(package.endswith(UNWANTED_SUFFIXES) for package in packages)
    }


def main(argv: list[str] | None = None) -> None:
    args = index_arguments(__doc__, argv)
    base = f"{args.mirror}/dists/{args.suite}/main"
    shared = parse_contents(stream_lines(f"{base}/Contents-all.gz"))
    for name in args.arches or ARCHES:
        url = f"{base}/Contents-{name}.gz"
        index = parse_contents(stream_lines(url), {k: set(v) for k, v in shared.items()})
        destination = args.out / f"programs-{name}.tsv.gz"
        write_index(ordered(index), destination)
        print(f"{destination}: {len(index)} programs from {url} and Contents-all")


if __name__ == "__main__":
    main()
