"""Command line `verify IMAGE`: run an image hardened and check the runtime contract. Parses
and prints only.

Apart from builder/cli/app.py (which registers it) so that module stays within its size; the
checks are builder.verify.run.verify_image. Its registry reads (the signatures, the attached
SBOM and SOCI index) try again on faults and say so: on stdout beside the table, on stderr with
--json (whose stdout is the report alone).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from builder.cli.errors import reports_errors
from builder.cli.references import Reference
from builder.cli.shared import REPORTER, SKIP_MODULE_OPTION, WITHOUT_PROGRAM_OPTION, echo
from builder.errors import UserError

if TYPE_CHECKING:
    from builder.oci.name import ImageRef
    from builder.retry import Retries
    from builder.verify.run import Installed


@click.command("verify")
@click.argument("image", type=Reference())
@click.option(
    "-r",
    "--requirement",
    "requirements",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Import every top-level module of the distributions this file names, and run every"
    " program they need.",
)
@click.option("--import", "modules", multiple=True, metavar="MODULE", help="Module to import.")
@click.option(
    "--check", "snippets", multiple=True, metavar="CODE", help="Python snippet that must run."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@WITHOUT_PROGRAM_OPTION
@click.option(
    "--key",
    type=click.Path(path_type=Path),
    help="cosign public key: IMAGE (pushed) must be signed and attested with it, checked first.",
)
@click.option(
    "--client",
    "clients",
    type=click.Choice(["sdk"]),
    multiple=True,
    help="Also drive the image with this client and fail if it cannot run (sdk: the upstream"
    " k8s-agent-sandbox SDK, which otherwise runs only when installed).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Fail on a warning too (an import that writes to stderr or stdout), and on information"
    " (a deep import failing the same way outside the sandbox, a module the image lacks).",
)
@SKIP_MODULE_OPTION
@reports_errors
def verify_command(
    image: ImageRef,
    requirements: Path | None,
    modules: tuple[str, ...],
    snippets: tuple[str, ...],
    as_json: bool,
    without_programs: tuple[str, ...],
    key: Path | None,
    clients: tuple[str, ...],
    strict: bool,
    skip_modules: tuple[str, ...],
) -> None:
    """Run IMAGE hardened and check the sandbox runtime contract; exit 1 if any check fails."""
    from builder.cli.soci import soci_check
    from builder.publish.attachments import attached_sbom
    from builder.reporter import TO_STDERR
    from builder.retry import Retries
    from builder.verify.run import verify_image

    retries = Retries(TO_STDERR if as_json else REPORTER)  # --json prints the report alone
    if key is not None:  # the signatures first: nothing unsigned is run
        lines = check_signature(image, key, retries)
        if not as_json:  # --json prints the report alone
            echo("\n".join(lines))
    report = verify_image(
        image,
        modules=modules,
        checks=snippets,
        installed=installed(image, requirements, without_programs, skip_modules),
        sdk=True if "sdk" in clients else None,
        sbom=attached_sbom(image, retries),
    )
    report.strict = strict
    if soci := soci_check(image, retries):
        report.checks.append(soci)
    echo(json.dumps(report.to_dict(), indent=2) if as_json else report.table())
    if not report.passed:
        raise UserError(f"verification of {image.as_written} failed: {report.failed_names()}")


def check_signature(image: ImageRef, key: Path, retries: Retries) -> list[str]:
    """IMAGE signed and attested with `key`, checked before anything of it runs; the lines
    that say what was checked. Not signed so: an error."""
    from builder import credentials
    from builder.sign.check import check_signed
    from builder.sign.keys import load_public_key

    public = load_public_key(key)
    return check_signed(credentials.registry(image, image.as_written, retries), public)


def installed(
    image: ImageRef,
    requirements: Path | None,
    without_programs: tuple[str, ...],
    skip_modules: tuple[str, ...] = (),
) -> Installed:
    """What -r FILE says the image holds: its distributions (whose modules are all imported,
    but those `skip_modules` match) and the programs they need on the image's own arch
    (`without_programs` marked left out)."""
    from builder.verify.deep.imports import DeepOptions
    from builder.verify.run import Installed

    if requirements is None:
        if skip_modules:
            raise UserError("--skip-module needs -r FILE: deep imports follow its distributions")
        return Installed()
    from builder.cli.cache import open_cache
    from builder.engines.connection import image_architecture
    from builder.orchestration.delivery import program_expectations
    from builder.orchestration.prepare import programs_needed
    from builder.resolve.requirements import distribution_names

    arch, left_out = image_architecture(image), frozenset(without_programs)
    cache = open_cache(None)
    with cache.in_use():  # a prune meanwhile keeps what this reads
        needs = programs_needed(requirements, image, arch, left_out, cache)
    return Installed(
        distribution_names(requirements),
        program_expectations(needs),
        deep=DeepOptions(skip=skip_modules),
    )
