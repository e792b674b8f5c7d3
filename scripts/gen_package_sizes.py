"""Regenerate builder/data/packages-<arch>.tsv.gz: what each apt package adds, from Debian's
Packages index.

The plan shows what its apt stage adds to the image: the packages it names and everything they
depend on, less what the base has, by Debian's `Installed-Size`. A line is
``package<TAB>installed kB<TAB>dependencies`` where the dependencies (Pre-Depends and Depends;
of alternatives the first, as apt picks it; a virtual package as its first provider) are line
numbers of the same file. Kept small: only packages the plan can name (the first choice of the
soname and program indexes) and their dependencies, without the reference base's packages
(builder/data/base-profile.json), which no plan installs again.

Usage: scripts/gen_package_sizes.py [--mirror URL] [--suite trixie] [--out DIR] [ARCH ...]
About 10 MB (xz) is streamed per arch; run it after gen_soname_index.py and
gen_program_index.py, which it reads.
"""

from __future__ import annotations

import gzip
import json
import lzma
import sys
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a plain script from a checkout

from gen_soname_index import index_arguments, write_lines  # noqa: E402  (the same family)

from builder.resolve.target import ARCHES  # noqa: E402

DATA = REPO / "builder" / "data"


def stanzas(text: str) -> Iterator[dict[str, str]]:
    """The fields of each package of a Packages file (continuation lines dropped)."""
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line and not line[0].isspace():
                key, _, value = line.partition(": ")
                fields[key] = value
        if "Package" in fields:
            yield fields


def first_names(relation: str) -> list[str]:
    """`a (>= 1) | b, c:any` -> `[a, c]`: what apt installs for each dependency."""
    parts = [part.strip() for part in relation.split(",") if part.strip()]
    return [part.split("|")[0].split()[0].split(":")[0] for part in parts]


def roots(arch: str) -> set[str]:
    """The packages a plan can name: each index line's first choice."""
    found: set[str] = set()
    for kind in ("sonames", "programs"):
        with gzip.open(DATA / f"{kind}-{arch}.tsv.gz", "rt") as index:
            found.update(line.rstrip("\n").split("\t")[1].split(",")[0] for line in index)
    return found


def closure_table(
    packages: Iterable[dict[str, str]], wanted: set[str], base: set[str]
) -> list[str]:
    """The lines for `wanted` and their dependencies, the base's packages left out."""
    sizes: dict[str, int] = {}
    depends: dict[str, list[str]] = {}
    providers: dict[str, str] = {}
    for fields in packages:
        name = fields["Package"]
        sizes[name] = int(fields.get("Installed-Size", "0"))
        depends[name] = first_names(f"{fields.get('Pre-Depends', '')},{fields.get('Depends', '')}")
        for virtual in first_names(fields.get("Provides", "")):
            providers.setdefault(virtual, name)

    def real(name: str) -> str | None:
        found = name if name in sizes else providers.get(name)
        return None if found is None or found in base else found

    kept: set[str] = set()
    stack = [name for name in map(real, wanted) if name]
    while stack:
        name = stack.pop()
        if name not in kept:
            kept.add(name)
            stack += [dep for dep in map(real, depends[name]) if dep]
    order = sorted(kept)
    number = {name: index for index, name in enumerate(order)}
    lines = []
    for name in order:
        deps = dict.fromkeys(dep for dep in map(real, depends[name]) if dep)
        lines.append(f"{name}\t{sizes[name]}\t{','.join(str(number[d]) for d in deps)}\n")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = index_arguments(__doc__, argv)
    profile = json.loads((DATA / "base-profile.json").read_text())
    for name in args.arches or ARCHES:
        url = f"{args.mirror}/dists/{args.suite}/main/binary-{name}/Packages.xz"
        with urllib.request.urlopen(url) as response:
            text = lzma.decompress(response.read()).decode("utf-8", "replace")
        base = set(profile["packages"].get(name, ()))
        lines = closure_table(stanzas(text), roots(name), base)
        destination = args.out / f"packages-{name}.tsv.gz"
        write_lines(lines, destination)
        print(f"{destination}: {len(lines)} packages from {url}")


if __name__ == "__main__":
    main()
