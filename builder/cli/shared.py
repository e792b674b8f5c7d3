"""What more than one command takes: the options build and rebuild (or build and verify) share,
and the reporter that prints a run's progress and notes.

Apart from builder/cli/app.py so that a command in a module of its own (verify) uses the same
option and the same printing as the group's commands.
"""

from __future__ import annotations

from pathlib import Path

import click

from builder.reporter import Reporter, mask

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
    help="Leave modules matching this fnmatch pattern out of the deep imports of every module of"
    " the requested distributions, and a use check whose `use NAME` line it matches"
    " (repeatable; a build's add to its config's skip-modules, verify's need -r): the report"
    " says how many modules were skipped.",
)

TEMPLATE_OPTION = click.option(
    "--template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="SandboxTemplate YAML to point at the pushed digest (the index's, for several arches).",
)
CONTAINER_OPTION = click.option(
    "--container", help="Container of the template to update (default: the first)."
)

APT_CA_OPTION = click.option(
    "--apt-ca-bundle",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CA bundle for apt, passed as a BuildKit secret (never stored in the image).",
)
APT_AUTH_OPTION = click.option(
    "--apt-auth",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="apt auth.conf for a private mirror, passed as a BuildKit secret.",
)


def apt_secrets(ca_bundle: Path | None, auth: Path | None) -> dict[str, Path]:
    """The BuildKit secret id -> file of the apt options given."""
    given = (("apt-ca", ca_bundle), ("apt-auth", auth))
    return {secret: path for secret, path in given if path is not None}


def echo(message: str = "", err: bool = False) -> None:
    """Print `message` masked (builder.reporter.mask): how every command prints, so no secret
    a run read reaches a CI log through a table or a summary."""
    click.echo(mask(message), err=err)


def note(line: str) -> None:
    """Progress and notes go to stdout; stderr carries only the one-line error."""
    echo(line)


REPORTER = Reporter(note)
