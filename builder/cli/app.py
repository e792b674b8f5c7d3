"""The click group and its commands: parse options, call the orchestration, print. No logic.

Each command imports what it runs in its body: `--help`, or a command that pushes nothing,
must not pay for the whole stack (docker, the SBOM library, the verifier) at start.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from builder.cli.base import base_command
from builder.cli.cache import CACHE_MAX_OPTION, Size, cache_command
from builder.cli.errors import reports_errors
from builder.cli.references import Reference
from builder.cli.runners.parts import merge_command, part_command
from builder.cli.sbom import sbom_command
from builder.cli.shared import (
    APT_AUTH_OPTION,
    APT_CA_OPTION,
    CONTAINER_OPTION,
    ENGINE_OPTION,
    REPORTER,
    SKIP_MODULE_OPTION,
    TEMPLATE_OPTION,
    WITHOUT_PROGRAM_OPTION,
    apt_secrets,
    echo,
    note,
)
from builder.cli.verify import verify_command
from builder.errors import UserError
from builder.orchestration import DEFAULT_JOBS
from builder.resolve.target import ARCHES, REFERENCE_BASE

if TYPE_CHECKING:
    from builder.config import PipelineConfig, RunSettings
    from builder.orchestration.commands import Rebuild
    from builder.orchestration.delivery import Outcome
    from builder.plan.plan import Plan

TOOL = "build-sandbox-image"  # the distribution whose metadata `--version` reads
DEFAULT_OUTPUT = Path("sandbox-image")
EXIT_REBUILD_NEEDED = 3  # rebuild --check: the platform upgrade changes the image


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name=TOOL, message=f"{TOOL} %(version)s")
@click.option(
    "-r",
    "--requirement",
    "requirements",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Requirements file (repeatable).",
)
@click.option(
    "-c",
    "--constraint",
    "constraints",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Constraints file (repeatable).",
)
@click.option(
    "--arch",
    "arches",
    multiple=True,
    type=click.Choice(sorted(ARCHES)),
    help="Target architecture (repeatable; default: every arch the base offers).",
)
@click.option(
    "--base-image",
    type=Reference("base image"),
    default=REFERENCE_BASE,  # parsed by Reference, as a given value is
    help="The platform's runtime image, tagged with the platform version.",
)
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=DEFAULT_OUTPUT,
    show_default=True,
    help="Directory for the build context.",
)
@click.option("--no-build", is_flag=True, help="Stop after writing the build context.")
@click.option("--tag", help="Name for the built image.")
@click.option(
    "--no-verify", is_flag=True, help="Do not verify the built image (nor gate a push on it)."
)
@click.option(
    "--strict",
    is_flag=True,
    help="Fail verification on a warning too (an import that writes to stderr or stdout), and on"
    " information (a deep import failing the same way outside the sandbox, a module the image"
    " lacks, a use check not run).",
)
@SKIP_MODULE_OPTION
@click.option(
    "--push",
    "push_repository",
    type=Reference("push target", repository=True),
    metavar="REPOSITORY",
    help="Push the verified image here.",
)
@click.option(
    "--platform-version", help="Platform version for tags (default: the base image's tag)."
)
@TEMPLATE_OPTION
@CONTAINER_OPTION
@click.option(
    "--warm-pool",
    "warm_pools",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="SandboxWarmPool YAML to check for stale-pod strategies (repeatable).",
)
@APT_CA_OPTION
@APT_AUTH_OPTION
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Cache directory.")
@CACHE_MAX_OPTION
@click.option(
    "--wheel-max",
    type=Size(),
    help="Refuse a wheel that unpacks to more than this, a zip bomb (default 8 GiB, or past"
    " 1 GiB 100 times its size; 0: unbounded).",
)
@click.option(
    "--refresh", is_flag=True, help="Resolve again even if this input was resolved within the hour."
)
@click.option(
    "--override",
    "overrides",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="uv override file: replace a dependency, or drop one (`name ; python_version < '0'`).",
)
@click.option(
    "--with-optional",
    is_flag=True,
    help="Also install libraries only on-demand plugins need, and programs only side features run.",
)
@WITHOUT_PROGRAM_OPTION
@click.option(
    "--torch-backend",
    metavar="BUILD",
    callback=lambda _context, _parameter, value: _torch_backend(value),
    help="PyTorch's own build from its own index, passed to uv: `cpu` for no CUDA wheels"
    " (docs/usage.md).",
)
@click.option(
    "--find-links",
    "-f",
    "find_links",
    multiple=True,
    metavar="DIR|URL",
    callback=lambda _context, _parameter, value: _find_links(value),
    help="A wheelhouse (directory or page of links) searched like an index; repeatable.",
)
@click.option(
    "--cache-from",
    "cache_from",
    multiple=True,
    type=Reference("--cache-from"),
    metavar="REF",
    help="An image this tool pushed whose build facts and layers seed the cache (a fresh CI"
    " runner); repeatable; default: the image the config's state last pushed (docs/ci.md).",
)
@click.option(
    "--no-index",
    is_flag=True,
    help="Use no package index: only --find-links wheelhouses and direct requirements.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Pipeline config (TOML) supplying the options above; flags given here win.",
)
@click.option(
    "--no-bytecode",
    is_flag=True,
    help="Ship no .pyc for the extras (smaller image; every sandbox start compiles them).",
)
@click.option(
    "--sign-key",
    type=click.Path(path_type=Path),
    help="Sign what is pushed with this cosign key or PKCS#8 P-256 PEM (passphrase:"
    " BSI_SIGN_PASSWORD, else COSIGN_PASSWORD).",
)
@click.option(
    "--no-soci",
    is_flag=True,
    help="Attach no SOCI index to the pushed images (no lazy loading on soci-snapshotter nodes).",
)
@ENGINE_OPTION
@click.pass_context
@reports_errors
# click passes every option above as a keyword; `run_settings` reads them from the context
def main(context: click.Context, **_flags: object) -> None:
    """Turn requirements into a verified sandbox runtime image (CPython 3.13 on Debian 13)."""
    if context.invoked_subcommand is not None:
        return
    from builder.cache.bound import bounded_use
    from builder.cli.cache import open_cache
    from builder.engines.connection import engine_client
    from builder.engines.per_arch import unheeded
    from builder.orchestration.commands import build

    settings = run_settings(context)
    cache = open_cache(settings.cache_dir, beside=(("the output directory", settings.output),))
    planning = not settings.build and settings.push_repository is not None  # for `part`
    client = engine_client() if settings.build or planning else None
    if ignored := unheeded(settings.engines, not settings.build, client is not None):
        echo(ignored, err=True)
    with bounded_use(cache, settings.cache_max) as bound:
        built = build(settings, client, cache, REPORTER, partial(show_plan, settings.output))
    if line := bound.summary():
        note(line)
    if built.outcome is None or built.delivery is None:
        show_not_built(
            built.plan,
            settings.output,
            "no Docker engine reachable" if settings.build else "--no-build",
        )
        if planning:  # builder.cli.runners.parts
            echo(
                f"plan for runners: {settings.output}/plan.json (`part {settings.output} --arch"
                f" ARCH --push {settings.push_repository}` on each, then `merge`)"
            )
        return
    show_outcome(built.outcome)
    if built.delivery.state is not None and built.outcome.pushed:
        echo(f"state recorded in {built.delivery.state.path}")


def run_settings(context: click.Context) -> RunSettings:
    """The run's settings: the main command's flags over its --config file's settings. The one
    place a flag becomes a setting (builder.config.merge lays them over the config)."""
    from builder.config import RunSettings, load_config, merge
    from builder.engines.per_arch import engine_flags

    flags = context.params
    config = load_config(flags["config_path"]) if flags["config_path"] else None
    asked = RunSettings(
        requirements=flags["requirements"],
        base_image=flags["base_image"],
        constraints=flags["constraints"],
        arches=flags["arches"],
        output=flags["output"],
        push_repository=flags["push_repository"],
        platform_version=flags["platform_version"],
        template=flags["template"],
        container=flags["container"],
        warm_pools=flags["warm_pools"],
        apt_secrets=apt_secrets(flags["apt_ca_bundle"], flags["apt_auth"]),
        bytecode=not flags["no_bytecode"],
        engines=engine_flags(flags["engine_urls"]),
        sign_key=flags["sign_key"],
        soci=not flags["no_soci"],
        without_programs=flags["without_programs"],
        torch_backend=flags["torch_backend"],
        find_links=flags["find_links"],
        no_index=flags["no_index"],
        cache_max=flags["cache_max"],
        wheel_max=flags["wheel_max"],
        cache_dir=flags["cache_dir"],
        refresh=flags["refresh"],
        overrides=flags["overrides"],
        with_optional=flags["with_optional"],
        build=not flags["no_build"],
        verify=not flags["no_verify"],
        strict=flags["strict"],
        skip_modules=flags["skip_modules"],
        tag=flags["tag"],
        cache_from=flags["cache_from"],
    )
    given = {
        name: context.get_parameter_source(name) is not ParameterSource.DEFAULT
        for name in ("output", "base_image")
    }
    settings = merge(asked, config, output_given=given["output"], base_given=given["base_image"])
    if not settings.requirements:
        raise click.UsageError("give at least one -r/--requirement file (or --config)")
    if settings.template and not settings.push_repository:
        raise click.UsageError("--template needs --push: the template names the pushed digest")
    if settings.sign_key and not settings.push_repository:
        raise click.UsageError("--sign-key needs --push: what is signed is what is pushed")
    return settings


def show_plan(output: Path, plan: Plan) -> None:
    """The plan, as soon as it exists: its warnings (stderr), its summary, where the context is."""
    from builder.cli.summary import summary

    for line in plan.warnings:
        echo(line, err=True)
    echo(summary(plan, json.loads((output / "report.json").read_text())))
    echo(f"\nbuild context written to {output}/ (report: report.json)")


def show_not_built(plan: Plan, output: Path, why: str) -> None:
    """Without an engine (or with --no-build): how to build each arch from the context."""
    echo(f"not building ({why}); build each arch with BuildKit:")
    for arch in plan.arches:
        echo(
            f"  DOCKER_BUILDKIT=1 docker build --platform linux/{arch.arch}"
            f" -t IMAGE-{arch.arch} {output}"
        )


@main.command("rebuild")
@click.option(
    "--config",
    "config_paths",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=(Path("build-sandbox-image.toml"),),
    show_default=True,
    help="Pipeline config (TOML); repeat it to rebuild a fleet of templates in one run.",
)
@click.option("--platform-version", required=True, help="The new platform version (base tag).")
@click.option(
    "--check",
    is_flag=True,
    help=f"Only report: exit 0 if up to date, {EXIT_REBUILD_NEEDED} if a rebuild is needed.",
)
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Cache directory.")
@CACHE_MAX_OPTION
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=DEFAULT_JOBS,
    show_default=True,
    help="With several --config: how many templates are rebuilt at a time.",
)
@ENGINE_OPTION
@click.option(
    "--shard",
    "shard_text",
    metavar="K/N",
    help="Rebuild only the K-th of N stable slices of the configs (a CI matrix of N jobs).",
)
@click.option(
    "--output-json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the fleet's table as JSON here (with --shard: rebuild-shard-K-of-N.json).",
)
@reports_errors
def rebuild(
    config_paths: tuple[Path, ...],
    platform_version: str,
    check: bool,
    cache_dir: Path | None,
    cache_max: int | None,
    jobs: int,
    engine_urls: tuple[str, ...],
    shard_text: str | None,
    json_path: Path | None,
) -> None:
    """Re-resolve against a new platform version; build, verify, push and point the template.

    With several --config, each is one template of a fleet (builder.orchestration.fleet),
    ending in a table.
    """
    from builder.cache.bound import bounded_use
    from builder.cli.cache import open_cache
    from builder.cli.fleet import fleet_output, show_fleet
    from builder.config import load_config, with_flags
    from builder.engines.connection import engine_client
    from builder.engines.per_arch import engine_flags
    from builder.orchestration.commands import rebuild as run_rebuild
    from builder.orchestration.fleet import Fleet, Shared, rebuild_fleet

    output = fleet_output(config_paths, shard_text, json_path, check)
    cache = open_cache(cache_dir)
    config = None if output.as_fleet else load_config(config_paths[0])
    if engine_urls and config is None:
        raise click.UsageError("--engine takes one --config: a fleet's configs name [engines]")
    config = config and with_flags(config, engine_flags(engine_urls), cache_max)
    client = engine_client()
    if client is None:
        raise UserError("rebuild: no Docker engine reachable to probe the new base")
    limit = cache_max if config is None else config.cache_max
    with bounded_use(cache, limit) as bound:
        if config is None:
            fleet = Fleet(output.configs, platform_version, jobs, check)
            result = rebuild_fleet(fleet, Shared(client, cache, REPORTER))
            needed = show_fleet(result, fleet, output)
        else:
            found = run_rebuild(config, platform_version, client, cache, REPORTER, check_only=check)
    if line := bound.summary():
        note(line)
    if config is not None:
        show_rebuild(found, config, platform_version, check)
    elif needed:
        sys.exit(EXIT_REBUILD_NEEDED)


def show_rebuild(found: Rebuild, config: PipelineConfig, new_version: str, check: bool) -> None:
    """A lone rebuild: its plan, what changed, and what was done (or, with --check, the exit
    status that says whether a rebuild is needed)."""
    from builder.cli.summary import summary

    echo(summary(found.plan))
    echo("\nchanges since the last build:" if found.changes else "\nno changes: up to date")
    for line in found.changes:
        echo(f"  {line}")
    if check:
        sys.exit(EXIT_REBUILD_NEEDED if found.changes else 0)
    if found.outcome is None:
        return
    show_outcome(found.outcome)
    echo(f"state recorded in {config.state}; {config.path} now names {new_version}")


def _find_links(values: tuple[str, ...]) -> tuple[str, ...]:
    """--find-links, checked as a requirements file's is (relative to here); a usage error when
    a directory does not exist."""
    from builder.errors import UserError
    from builder.resolve.requirements import find_links

    try:
        return tuple(find_links(value, "--find-links", Path.cwd()) for value in values)
    except UserError as error:
        raise click.BadParameter(str(error).removeprefix("--find-links: ")) from None


def _torch_backend(value: str | None) -> str | None:
    """--torch-backend, checked as the config's key is; a usage error when it names no build."""
    if value is None:
        return None
    from builder.resolve.index_options import torch_backend

    try:
        return torch_backend(value, "--torch-backend")
    except UserError as error:
        raise click.BadParameter(str(error).removeprefix("--torch-backend: ")) from None


def show_outcome(outcome: Outcome) -> None:
    """Print what happened after planning; a failed verification is an error."""
    from builder.cli.summary import pushed_lines

    for one in outcome.produced:
        if one.local_tag:
            echo(f"image: {one.local_tag} ({one.engine_name}, {one.arch})")
    if outcome.verification is not None:
        echo(outcome.verification.table())
        if not outcome.verification.passed:
            failed = outcome.verification.failed_names()
            raise UserError(f"verification of {outcome.label} failed: {failed}")
    if outcome.pushed:
        echo(pushed_lines(outcome.pushed, outcome.node_update))
    if outcome.template_change:
        change = outcome.template_change
        echo(f"template {change.template_name}: {change.old_image} -> {change.new_image}")
    for line in outcome.notes:
        note(line)


main.add_command(sbom_command)
main.add_command(base_command)
main.add_command(verify_command)
main.add_command(cache_command)
main.add_command(part_command)
main.add_command(merge_command)
