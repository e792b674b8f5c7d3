"""Command line `sbom REF`: print what is attached to a pushed image. Parses and prints only.

Apart from builder/cli/app.py (which registers it) so that module stays within its size; the
reading is builder.publish.attachments.read_attached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from builder.cli.errors import reports_errors
from builder.cli.references import Reference
from builder.cli.shared import echo
from builder.resolve.target import ARCHES

if TYPE_CHECKING:
    from builder.oci.name import ImageRef


@click.command("sbom")
@click.argument("reference", type=Reference())
@click.option(
    "--arch",
    type=click.Choice(sorted(ARCHES)),
    help="The arch image of an index to read (default: each one).",
)
@click.option(
    "--provenance",
    "want_provenance",
    is_flag=True,
    help="Print the SLSA provenance statement instead of the CycloneDX SBOM.",
)
def sbom_command(reference: ImageRef, arch: str | None, want_provenance: bool) -> None:
    """Print the SBOM (or provenance) attached to REFERENCE; exit 1 when none is attached."""
    reports_errors(_print_attached)(reference, arch, want_provenance)


def _print_attached(reference: ImageRef, arch: str | None, want_provenance: bool) -> None:
    from builder.attest import provenance, sbom
    from builder.errors import UserError
    from builder.publish.attachments import read_attached
    from builder.reporter import TO_STDERR
    from builder.retry import Retries

    kind, media_type = (
        ("provenance", provenance.MEDIA_TYPE) if want_provenance else ("SBOM", sbom.MEDIA_TYPE)
    )
    found = read_attached(reference, media_type, arch, Retries(TO_STDERR))  # stdout: the document
    missing = [one for one in found if one.document is None]
    if missing:
        names = ", ".join(f"{reference.as_written} ({one.arch}, {one.digest})" for one in missing)
        raise UserError(f"no {kind} is attached to {names}")
    for one in found:
        if len(found) > 1:
            echo(f"# {one.arch} {one.digest}")
        echo((one.document or b"").decode())
