"""The one exception type the CLI turns into a one-line message and exit code 1."""


class UserError(Exception):
    """The input cannot work on the target; the message names the culprit."""
