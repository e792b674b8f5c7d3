"""The one click type for an image reference: the CLI parses each reference where it enters.

Every option or argument that names an image (`--base-image`, `--push`, `verify IMAGE`,
`sbom REFERENCE`, `base --from`, `base --tag`) takes `Reference`, so the command line has one
parse of a reference and one of a repository; inside, the value travels as an `ImageRef`.
"""

from __future__ import annotations

from typing import Any

import click

from builder.cli.errors import error_line
from builder.errors import UserError
from builder.oci.name import ImageRef


class BadReference(click.ClickException):
    """A malformed reference: the same one `error:` line and exit 1 as every other UserError
    (builder.cli.errors), not click's usage error, though click raises it while parsing."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(error_line(self.message), err=True)


class Reference(click.ParamType):
    """An image reference (`repository=True`: a repository, with neither tag nor digest);
    `what` names it in the error, as the operator knows it."""

    name = "reference"

    def __init__(self, what: str = "image reference", *, repository: bool = False) -> None:
        self.what = what
        self.repository = repository

    def convert(
        self, value: Any, _param: click.Parameter | None, _ctx: click.Context | None
    ) -> ImageRef:
        if isinstance(value, ImageRef):  # a default click has converted already
            return value
        try:
            if self.repository:
                return ImageRef.parse_repository(value, self.what)
            return ImageRef.parse(value, self.what)
        except UserError as error:
            raise BadReference(str(error)) from None
