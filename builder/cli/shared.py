"""What more than one command takes: the options build and rebuild (or build and verify) share,
and the reporter that prints a run's progress and notes.

Apart from builder/cli/app.py so that a command in a module of its own (verify) uses the same
option and the same printing as the group's commands.
"""

from __future__ import annotations

from pathlib import Path

import click

from builder.reporter import Reporter

ENGINE_OPTION = click.option(
    "--engine",
    "engine_urls",
    multiple=True,
    metavar="ARCH=URL",
    help="Build, load, verify ARCH's image on this Docker engine (repeatable; over the config's"
    " [engines]): unix:///PATH, tcp://HOST:PORT[?certs=DIR], ssh://[USER@]HOST[:PORT].",
)
WITHOUT_PROGRAM_OPTION = click.option(
    "--without-program",
    "without_programs",
    multiple=True,
    metavar="NAME",
    help="A program (or its package) the code runs, left out on purpose (repeatable; over the"
    " config's without-programs): not installed, a warning says so, verify reports it left out.",
)

SKIP_MODULE_OPTION = click.option(
    "--skip-module",
    "skip_modules",
    multiple=True,
    metavar="PATTERN",
    help="Leave modules matching this fnmatch pattern out of the deep imports (verification"
    " imports every module of the requested distributions; repeatable, over the config's"
    " skip-modules): the report says how many were skipped.",
)

TEMPLATE_OPTION = click.option(
    "--template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="SandboxTemplate YAML to point at the pushed digest (the index's, for several arches).",
)
CONTAINER_OPTION = click.option(
    "--container", help="Container of the template to update (default: the first)."
)


def note(line: str) -> None:
    """Progress and notes go to stdout; stderr carries only the one-line error."""
    click.echo(line)


REPORTER = Reporter(note)
