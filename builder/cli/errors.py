"""The CLI's one error line: every command's failure ends as one `error:` line on stderr.

Apart from builder.cli.app so that every command module (sbom, fleet) can use it without
importing the command line itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from builder.errors import DEBUG_VARIABLE, UserError, failure_message
from builder.reporter import mask

F = TypeVar("F", bound=Callable[..., Any])
ERROR_CHARS = 600  # an error line longer than this is cut


def error_line(message: str) -> str:
    """The one stderr line for a failure: newlines folded, secrets masked (builder.reporter),
    bounded."""
    line = mask(" ".join(message.split()))
    return f"error: {line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS] + '…'}"


def reports_errors(function: F) -> F:
    """Turn any failure into one `error:` line on stderr and exit 1; click's own errors pass.

    A UserError names the culprit; an OSError is about a path the user gave; anything else is
    a bug, shown as `error: internal: ...`, with the traceback when BSI_DEBUG=1 is set.
    """

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except UserError as error:
            message = failure_message(error)
        except Exception as error:
            if os.environ.get(DEBUG_VARIABLE):
                raise
            message = failure_message(error)
        click.echo(error_line(message), err=True)
        sys.exit(1)

    return wrapper  # type: ignore[return-value]
