"""Regenerate builder/data/base-profile.json by probing a real base image through the engine.

The shipped profile is what `build-sandbox-image` assumes when no engine can reach the base, so
it must come from the reference runtime image itself, not be written by hand. It holds the facts
only: which image they hold for is the caller's (the default base is
builder.resolve.target.REFERENCE_BASE), and only a live probe pins a digest.

Usage: scripts/gen_base_profile.py IMAGE [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a plain script from a checkout

from builder.base.probe import probe_base  # noqa: E402
from builder.base.profile import base_problems  # noqa: E402
from builder.cache import Cache, default_root  # noqa: E402
from builder.engines.connection import engine_client  # noqa: E402
from builder.errors import UserError  # noqa: E402
from builder.oci.name import ImageRef  # noqa: E402

DEFAULT_OUT = REPO / "builder" / "data" / "base-profile.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", help="the local (or pullable) reference base image to probe")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    client = engine_client()
    if client is None:
        print(
            "error: no Docker engine answers; the profile must come from a real image",
            file=sys.stderr,
        )
        return 1
    try:
        profile = probe_base(ImageRef.parse(args.image, "image"), client, Cache(default_root()))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    for problem in base_problems(profile):
        print(f"warning: {problem}", file=sys.stderr)
    args.out.write_text(json.dumps(profile.facts_record(), indent=1, sort_keys=True) + "\n")
    counts = ", ".join(f"{arch} {len(names)}" for arch, names in sorted(profile.sonames.items()))
    print(
        f"wrote {args.out}: python {profile.python_version}, glibc {profile.glibc}, "
        f"{len(profile.distributions)} distributions, sonames {counts} ({profile.source})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
