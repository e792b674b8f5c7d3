"""`cache`, `cache prune`, `cache clean`: see the cache and trim it; `--cache-max`, the bound
every build ends with; and `open_cache`, where every command gets its cache (--cache-dir, else
the default), checked to be the tool's (builder.cache.mark). Parsing and printing only: the work
is builder.cache.prune's, builder.cache.bound's and builder.cache.mark's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from builder.cli.errors import error_line, reports_errors
from builder.cli.shared import REPORTER
from builder.errors import UserError

if TYPE_CHECKING:
    from builder.cache import Cache
    from builder.cache.prune import Pruned

SECONDS_PER_DAY = 86_400


class BadValue(click.ClickException):
    """A size or an age that is not one: the one `error:` line and exit 1 of every UserError,
    though click raises it while parsing (before anything is built or removed)."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(error_line(self.message), err=True)


class Size(click.ParamType):
    """A size as an operator writes it (`20GB`, `500MiB`, `0`), in bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, _ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from builder.cache.bound import parse_size

        what = f"--{param.name.replace('_', '-')}" if param and param.name else "size"
        try:
            return parse_size(str(value), what)
        except UserError as error:
            raise BadValue(str(error)) from None


class Days(click.ParamType):
    """An age in days (fractions allowed), in seconds."""

    name = "days"

    def convert(
        self, value: Any, _param: click.Parameter | None, _ctx: click.Context | None
    ) -> float:
        try:
            days = float(value)
        except ValueError:
            days = -1.0
        if not days >= 0:  # NaN too
            raise BadValue(f"--older-than: {str(value)[:40]!r} is not a number of days (e.g. 7)")
        return days * SECONDS_PER_DAY


def open_cache(
    cache_dir: Path | None, *, beside: Sequence[tuple[str, Path]] = (), create: bool = True
) -> Cache:
    """The cache a command uses: `cache_dir`, else the default; refused in one line, before any
    work, when it is not the tool's (builder.cache.mark.opened). Its warnings (an entry that
    no longer hashes to its digest) are the run's."""
    from dataclasses import replace

    from builder.cache import default_root
    from builder.cache.mark import opened

    cache = opened(cache_dir or default_root(), beside=beside, create=create)
    return replace(cache, warn=REPORTER.warn)


CACHE_DIR_OPTION = click.option(
    "--cache-dir", type=click.Path(path_type=Path), help="Cache directory."
)
CACHE_MAX_OPTION = click.option(
    "--cache-max",
    type=Size(),
    help="Prune the cache to this size when the build ends (default: the smaller of 20 GB and"
    " 10 % of its file system; 0: unbounded).",
)


@click.group("cache", invoke_without_command=True)
@CACHE_DIR_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the sizes as JSON (for scripts).")
@click.pass_context
@reports_errors
def cache_command(context: click.Context, cache_dir: Path | None, as_json: bool) -> None:
    """Show the cache's size by kind and its location; `prune` and `clean` trim it."""
    context.obj = cache_dir or context.find_root().params.get("cache_dir")
    if context.invoked_subcommand is not None:
        return
    from builder.cache.prune import usage
    from builder.errors import human

    found = usage(open_cache(context.obj, create=False))
    if as_json:
        click.echo(json.dumps(found.to_dict(), indent=2))
        return
    click.echo(f"cache: {found.root}")
    for kind, size in found.sizes.items():
        click.echo(f"  {kind.value:<11} {human(size):>10}  {found.counts[kind]} entries")
    click.echo(f"  {'total':<11} {human(found.total):>10}")
    if found.running:
        click.echo(f"{found.running} run(s) using it now")
    show_unknown(found.unknown)


@cache_command.command("prune")
@CACHE_DIR_OPTION
@click.option(
    "--keep",
    type=Size(),
    help="Remove least recently used entries until the cache holds at most this"
    " (default: the bound builds use, the smaller of 20 GB and 10 % of its file system).",
)
@click.option(
    "--older-than",
    type=Days(),
    metavar="DAYS",
    help="Remove every entry unused for this many days (with --keep: then more, to fit).",
)
@click.pass_context
@reports_errors
def prune_command(
    context: click.Context, cache_dir: Path | None, keep: int | None, older_than: float | None
) -> None:
    """Remove least recently used entries first; never one a running build uses."""
    from builder.cache.bound import default_bound
    from builder.cache.prune import prune

    cache = open_cache(cache_dir or context.obj, create=False)
    if keep is None and older_than is None:
        keep = default_bound(cache.root)
    show_pruned(prune(cache, keep, older_than), cache.root)


@cache_command.command("clean")
@CACHE_DIR_OPTION
@click.pass_context
@reports_errors
def clean_command(context: click.Context, cache_dir: Path | None) -> None:
    """Remove the whole cache but what a running build uses (and what the tool did not write)."""
    from builder.cache.prune import clean

    cache = open_cache(cache_dir or context.obj, create=False)
    show_pruned(clean(cache), cache.root)


def show_pruned(pruned: Pruned, root: Path) -> None:
    from builder.errors import human

    click.echo(
        f"removed {pruned.removed} entries ({human(pruned.freed)}) from {root};"
        f" {human(pruned.left)} left"
    )
    if pruned.held:
        click.echo(f"kept {pruned.held} entries in use by {pruned.running} running build(s)")
    show_unknown(pruned.unknown)


def show_unknown(unknown: Sequence[Path]) -> None:
    """What the cache's directory holds that the tool did not write: named, kept."""
    if not unknown:
        return
    named = ", ".join(str(path) for path in unknown[:5])
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    click.echo(f"kept {len(unknown)} unknown entries (not written by this tool): {named}{more}")
