"""The command line: every flag defaults to a ``SANDBOX_*`` variable, so images configure the
server through their environment and need no argv.

The flags are one table (:data:`FLAGS`), read in order to build the parser, to name each
flag's variable and to check the bounds that must be positive: one place to add a flag.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from .config import MIB


@dataclass(frozen=True)
class Flag:
    """One ``--name`` flag: its type, its default (as text, unless the variable is set), its
    help, and whether it must be positive (a bound: zero or less would refuse everything)."""

    name: str
    kind: type[str] | type[int] | type[float]
    default: str | None
    text: str | None = None
    positive: bool = False

    @property
    def variable(self) -> str:
        """The environment variable that sets the default: ``--max-upload``: SANDBOX_MAX_UPLOAD."""
        return "SANDBOX_" + self.name.upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


FLAGS = (
    Flag("host", str, "0.0.0.0"),
    Flag("port", int, "8888"),
    Flag("workspace", str, "/workspace"),
    Flag(
        "max-upload",
        int,
        str(100 * MIB),
        "largest accepted upload body in bytes (larger: 413)",
        positive=True,
    ),
    Flag(
        "max-output",
        int,
        str(10 * MIB),
        "bytes kept per output stream of a command; the rest is dropped",
        positive=True,
    ),
    Flag(
        "default-timeout",
        float,
        "300",
        "seconds a command may run when the request names no timeout_seconds",
        positive=True,
    ),
    Flag("max-timeout", float, "3600", "cap on timeout_seconds", positive=True),
    Flag(
        "max-reply",
        int,
        str(32 * MIB),
        "encoded bytes of one /execute reply (half per stream)",
        positive=True,
    ),
    Flag("max-executes", int, "32", "commands running at once", positive=True),
    Flag("max-queued", int, "64", "executes waiting for a slot; beyond that: 429"),
    Flag(
        "max-connections",
        int,
        "256",
        "connections served at once; beyond: 503 (GET / answered)",
        positive=True,
    ),
    Flag(
        "max-connections-per-source",
        int,
        "64",
        "connections one client address holds at once (this host's own are one); beyond: 503",
        positive=True,
    ),
    Flag(
        "max-executes-per-source",
        int,
        "16",
        "commands one client address runs or queues at once; beyond that: 503",
        positive=True,
    ),
    Flag(
        "header-timeout",
        float,
        "30",
        "seconds to receive a request's line and headers",
        positive=True,
    ),
    Flag("body-timeout", float, "600", "seconds to receive a request's body", positive=True),
    Flag(
        "home-seed",
        str,
        "/opt/sandbox/home",
        "caches built into the image, copied into $HOME at start (see files/home.py)",
    ),
    Flag(
        "home-fallback",
        str,
        "/dev/shm/home",
        "the commands' home when $HOME cannot be made (no writable /tmp); empty: none",
    ),
    Flag(
        "spool-dir",
        str,
        None,
        "where command output is spooled (default: $TMPDIR, /tmp, /var/tmp, else memory)",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of :data:`FLAGS`, each default taken from its variable when that is set."""
    parser = argparse.ArgumentParser(description="Sandbox runtime HTTP server.")
    for flag in FLAGS:
        default = os.environ.get(flag.variable, flag.default)
        parser.add_argument(f"--{flag.name}", type=flag.kind, default=default, help=flag.text)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv`` (None: the process's), a bound that is not positive an error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in FLAGS:
        if flag.positive and not getattr(args, flag.dest) > 0:
            parser.error(f"--{flag.name} must be positive")
    return args
