"""Regenerate builder/data/sonames-<arch>.tsv.gz from Debian's Contents index.

A wheel's DT_NEEDED names a soname; apt installs packages. The Contents index maps every
file in the archive to the packages shipping it, so the library files the default loader
search path would find (directly in ``usr/lib/<triplet>/`` or ``lib/<triplet>/``) give the
soname -> package table, small enough to ship and to use offline.

Usage: scripts/gen_soname_index.py [--mirror URL] [--suite trixie] [--out DIR] [ARCH ...]
The Contents file is streamed and gunzipped on the fly (about 12.7 MB compressed per arch).
"""

from __future__ import annotations

import argparse
import gzip
import io
import re
import sys
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a plain script from a checkout

from builder.resolve.target import ARCHES  # noqa: E402

SHARED_LIBRARY = re.compile(r"[^/]+\.so(\.[^/]*)?")
UNWANTED_SUFFIXES = ("-dev", "-dbg", "-dbgsym")


def is_development(package: str) -> bool:
    return package.endswith(UNWANTED_SUFFIXES)


def preference(package: str) -> tuple[bool, bool, bool, int, str]:
    """Sort key: runtime library packages first, so apt installs the smallest right thing."""
    return (
        is_development(package),
        package.endswith("-cross"),
        not package.startswith("lib"),
        len(package),
        package,
    )


def parse_contents(lines: Iterable[str], triplet: str) -> dict[str, list[str]]:
    """Map each shared-library file name on the loader's default path to its packages.

    A Contents line is ``path<whitespace>section/pkg[,section/pkg...]``; paths may contain
    spaces, so split on the last whitespace run. Packages come out preferred first.
    An unversioned ``libfoo.so`` shipped only by -dev packages is a link-time name, never
    a DT_NEEDED, so it is dropped; one a runtime package ships is a real soname and stays.
    """
    directories = (f"usr/lib/{triplet}/", f"lib/{triplet}/")
    index: dict[str, set[str]] = {}
    for directory, name, packages in contents_entries(lines):
        if directory in directories and SHARED_LIBRARY.fullmatch(name):
            index.setdefault(name, set()).update(packages)
    return {
        name: sorted(packages, key=preference)
        for name, packages in index.items()
        if not (name.endswith(".so") and all(map(is_development, packages)))
    }


def contents_entries(lines: Iterable[str]) -> Iterator[tuple[str, str, list[str]]]:
    """(directory with its trailing slash, file name, package names) of each Contents line.

    A line is ``path<whitespace>section/pkg[,section/pkg...]``; paths may contain spaces, so
    it is split on the last whitespace run.
    """
    for line in lines:
        parts = line.rstrip("\n").rsplit(maxsplit=1)
        if len(parts) == 2:
            directory, _, name = parts[0].rpartition("/")
            yield f"{directory}/", name, [loc.rpartition("/")[2] for loc in parts[1].split(",")]


def stream_lines(url: str) -> Iterable[str]:
    """Lines of a gzipped text file at ``url``, decompressed while downloading."""
    with urllib.request.urlopen(url) as response, gzip.GzipFile(fileobj=response) as raw:
        yield from io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


def write_index(index: dict[str, list[str]], destination: Path) -> None:
    """Write sorted ``soname<TAB>pkg,...`` lines as a byte-for-byte reproducible gzip."""
    write_lines([f"{name}\t{','.join(index[name])}\n" for name in sorted(index)], destination)


def write_lines(lines: Iterable[str], destination: Path) -> None:
    """Write `lines` as a byte-for-byte reproducible gzip (no name, no date)."""
    with (
        destination.open("wb") as file,
        gzip.GzipFile(filename="", mode="wb", fileobj=file, compresslevel=9, mtime=0) as out,
    ):
        out.write("".join(lines).encode())


def index_arguments(doc: str | None, argv: list[str] | None) -> argparse.Namespace:
    """The command line every index script of this family takes: the arches (all by default),
    Debian's mirror and suite, the output directory."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("arches", nargs="*", metavar="ARCH", help=f"default: {' '.join(ARCHES)}")
    parser.add_argument("--mirror", default="http://deb.debian.org/debian")
    parser.add_argument("--suite", default="trixie")
    parser.add_argument("--out", type=Path, default=REPO / "builder" / "data")
    args = parser.parse_args(argv)
    for name in args.arches:
        if name not in ARCHES:
            parser.error(f"unknown architecture {name!r}: choose from {', '.join(ARCHES)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = index_arguments(__doc__, argv)
    for name in args.arches or ARCHES:
        url = f"{args.mirror}/dists/{args.suite}/main/Contents-{name}.gz"
        index = parse_contents(stream_lines(url), ARCHES[name].triplet)
        destination = args.out / f"sonames-{name}.tsv.gz"
        write_index(index, destination)
        print(f"{destination}: {len(index)} sonames from {url}")


if __name__ == "__main__":
    main()
