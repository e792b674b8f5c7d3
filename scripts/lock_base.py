"""Regenerate the reference base's hash locks: builder/runtime/pylock.{amd64,arm64}.toml.

Resolves builder/runtime/requirements.in with uv for CPython <profile python> on manylinux
x86_64 and aarch64 (the same resolution the extension builds use, see builder.resolve.uv).

    python scripts/lock_base.py            re-lock at the versions of builder/data/base-profile.json
                                           (fresh hashes and URLs, same versions)
    python scripts/lock_base.py --upgrade  re-resolve to the newest versions; afterwards rebuild
                                           the base and regenerate base-profile.json from it, so
                                           the profile keeps describing what the image contains
    python scripts/lock_base.py --check    exit 1 if the committed locks disagree with the profile
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from builder.cache import Cache, default_root
from builder.oci.name import ImageRef
from builder.orchestration.reference_base import (
    LOCK_HEADER,
    RUNTIME_DIR,
    lock_path,
    locked_versions,
)
from builder.resolve.requirements import read_requirements
from builder.resolve.target import ARCHES, REFERENCE_BASE, Target, shipped_profile
from builder.resolve.uv import resolve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upgrade", action="store_true", help="ignore the profile's pins")
    parser.add_argument("--check", action="store_true", help="only compare locks and profile")
    parser.add_argument("--arch", action="append", choices=sorted(ARCHES), help="default: all")
    args = parser.parse_args(argv)
    profile = shipped_profile(ImageRef.parse(REFERENCE_BASE, "reference base"))
    arches = [ARCHES[name] for name in (args.arch or sorted(ARCHES))]
    if args.check:
        pinned = dict(profile.distributions)
        problems = [
            f"{arch.name}: lock {locked_versions(arch.name)} != profile {pinned}"
            for arch in arches
            if locked_versions(arch.name) != pinned
        ]
        print("\n".join(problems) or "locks match builder/data/base-profile.json")
        return 1 if problems else 0
    base = replace(profile, distributions={}) if args.upgrade else profile
    requirements = read_requirements([RUNTIME_DIR / "requirements.in"])
    cache = Cache(default_root())
    for arch in arches:
        resolution = resolve(requirements, Target(base, (arch,)), arch, cache)
        path: Path = lock_path(arch.name)
        path.write_text(LOCK_HEADER + resolution.pylock)
        versions = locked_versions(arch.name)
        print(f"{path}: {len(versions)} distributions")
        changed: dict[str, tuple[str | None, str | None]] = {
            name: (profile.distributions.get(name), version)
            for name, version in versions.items()
            if profile.distributions.get(name) != version
        }
        for name in sorted(set(profile.distributions) - set(versions)):
            changed[name] = (profile.distributions[name], None)
        for name, (old, new) in sorted(changed.items()):
            print(f"  {name}: {old or '-'} -> {new or '-'}")
        if changed:
            print(
                "  the profile no longer matches: rebuild the base (build-sandbox-image base)"
                " and regenerate builder/data/base-profile.json from it",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
