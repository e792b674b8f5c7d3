"""Command line: parse options, call the pipeline, print. No logic lives here."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from builder.cache import Cache, default_root
from builder.errors import UserError
from builder.plan import Plan
from builder.target import ARCHES, shipped_profile

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_OUTPUT = Path("sandbox-image")


def reports_errors(function: F) -> F:
    """Turn a UserError into one line on stderr and exit 1."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except UserError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def summary(plan: Plan) -> str:
    """The human table: distribution, version, wheel tag, native needs -> Debian package."""
    lines = [f"base: {plan.base_image} (python {plan.base.python_version}, {plan.base.source})"]
    for arch in plan.arches:
        rows = [("distribution", "version", "wheel tag", "native needs -> package")]
        for wheel in arch.wheels:
            needs = [
                f"{lib.soname or '(run time)'} -> {lib.package}"
                for lib in arch.libraries
                if any(by.startswith(f"{wheel.name}=={wheel.version}") for by in lib.needed_by)
            ]
            rows.append((wheel.name, wheel.version, wheel.tag, ", ".join(needs) or "-"))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines.append(f"\n{arch.arch}:")
        lines += [
            "  " + "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
            + "  " + row[3]
            for row in rows
        ]
        if arch.provided_by_base:
            lines.append(f"  provided by the base (not installed again): {', '.join(arch.provided_by_base)}")
        lines.append(f"  apt packages: {' '.join(arch.apt_packages) or 'none'}")
    return "\n".join(lines)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-r", "--requirement", "requirements", multiple=True, type=click.Path(path_type=Path),
              help="Requirements file (repeatable).")
@click.option("-c", "--constraint", "constraints", multiple=True, type=click.Path(path_type=Path),
              help="Constraints file (repeatable).")
@click.option("--arch", "arches", multiple=True, type=click.Choice(sorted(ARCHES)),
              help="Target architecture (repeatable; default amd64).")
@click.option("--base-image", help="The platform's runtime image, tagged with the platform version.")
@click.option("--output", type=click.Path(path_type=Path), default=DEFAULT_OUTPUT, show_default=True,
              help="Directory for the build context.")
@click.option("--no-build", is_flag=True, help="Stop after writing the build context.")
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Cache directory.")
@click.pass_context
@reports_errors
def main(
    context: click.Context,
    requirements: tuple[Path, ...],
    constraints: tuple[Path, ...],
    arches: tuple[str, ...],
    base_image: str | None,
    output: Path,
    no_build: bool,
    cache_dir: Path | None,
) -> None:
    """Turn requirements into a verified sandbox runtime image (CPython 3.13 on Debian 13)."""
    if context.invoked_subcommand is not None:
        return
    if not requirements:
        raise click.UsageError("give at least one -r/--requirement file")
    from builder.pipeline import Request, prepare

    request = Request(
        requirement_files=requirements,
        constraint_files=constraints,
        arches=arches or ("amd64",),
        base=shipped_profile(base_image),
        output=output,
        cache=Cache(cache_dir or default_root()),
    )
    plan = prepare(request)
    click.echo(summary(plan))
    click.echo(f"\nbuild context written to {output}/ (report: {output}/report.json)")
    if no_build or True:
        platforms = ",".join(f"linux/{a.arch}" for a in plan.arches)
        click.echo(
            "build it with: DOCKER_BUILDKIT=1 /usr/bin/docker build"
            f" --platform {platforms} -t IMAGE {output}"
        )
