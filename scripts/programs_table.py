"""Print docs/programs.md's table: what the reading finds in a set of wheels, and what it installs.

Each wheel is read as a build reads it (builder.inspect.wheel_reader.read_wheel) and decided alone,
as the plan decides per distribution (builder.plan.program_needs), for amd64 against the
reference base's shipped facts. Only wheels whose code runs a program are listed; the
distributions named on the command line are marked as such, the others as dependencies.

Usage: scripts/programs_table.py WHEEL_DIR NAME ...
The wheels of docs/programs.md's 40 distributions and their dependencies, for example:
  pip download --only-binary=:all: --python-version 3.13 -d WHEEL_DIR \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 NAME ...
(pip takes each --platform as one tag: a wheel tagged only manylinux2014, matplotlib's, needs
its own.)
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Collection
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a plain script from a checkout

from packaging.utils import canonicalize_name  # noqa: E402

from builder.inspect.wheel_reader import read_wheel  # noqa: E402
from builder.plan.program_needs import program_needs  # noqa: E402
from builder.resolve.target import ARCHES, shipped_facts  # noqa: E402

NO_NEED = "no need: the base has it, a desktop program, or no Debian package"


def table(wheel_dir: Path, direct: Collection[str]) -> list[str]:
    """The markdown table's lines, then the direct distributions that run nothing."""
    arch = ARCHES["amd64"]
    base = shipped_facts().packages.get(arch.name, frozenset())
    wheels = sorted(wheel_dir.glob("*.whl"))
    inspected = [read_wheel(w, hashlib.sha256(w.read_bytes()).hexdigest()) for w in wheels]
    lines = [
        "| distribution | programs its code runs (read) | installed by default"
        " | optional (`--with-optional`) | why |",
        "|---|---|---|---|---|",
    ]
    for wheel in inspected:
        found = sorted({name for site in wheel.programs for name in site.names})
        needs, _ = program_needs([wheel], base, arch)
        if not found and not needs:
            continue
        required = sorted(
            {
                f"{n.program} → {n.package or 'no Debian 13 package'}"
                for n in needs
                if not n.optional
            }
        )
        optional = sorted({n.package for n in needs if n.optional and n.package})
        why = " / ".join(sorted({n.why for n in needs})) or NO_NEED
        label = f"{wheel.name} {wheel.version}" + ("" if wheel.name in direct else " (dependency)")
        lines.append(
            f"| {label} | {', '.join(found) or '—'} | {'; '.join(required) or '—'}"
            f" | {', '.join(optional) or '—'} | {why} |"
        )
    listed = {line.split(" ")[1] for line in lines[2:]}
    none = sorted(w.name for w in inspected if w.name in direct and w.name not in listed)
    return [*lines, "", f"Run no program: {', '.join(none)}."]


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    direct = {canonicalize_name(name) for name in sys.argv[2:]}
    print("\n".join(table(Path(sys.argv[1]), direct)))


if __name__ == "__main__":
    main()
