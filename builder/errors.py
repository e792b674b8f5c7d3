"""The errors the CLI turns into one line on stderr and exit code 1.

Every subclass keeps that contract (the message names the culprit); the type says what kind of
failure it was, so a caller can decide without reading messages:

    UserError                 the input cannot work on the target
    ├── RegistryError         a registry refused or could not answer a request
    │   ├── RegistryUnreachable  connection refused, DNS, timeout, 5xx, after the retries
    │   │                        (builder.retry): the only failure a planner may answer
    │   │                        by falling back to the shipped profile, with a warning
    │   ├── RegistryNotFound     404: the registry does not hold it
    │   └── RegistryAuthError    401/403: credentials missing or wrong
    └── IntegrityError        content that does not hash to its digest; never fallen back from
"""

DEBUG_VARIABLE = "BSI_DEBUG"  # set: unexpected errors show their traceback
SHOWN = 80  # characters of a hostile name an error line shows


def shown(name: str) -> str:
    """A name from hostile input (a wheel's member, a project's link) as an error line shows
    it: quoted and escaped (a newline in it cannot start a line of its own), cut short."""
    return repr(name[:SHOWN]) + ("…" if len(name) > SHOWN else "")


class UserError(Exception):
    """The input cannot work on the target; the message names the culprit."""


class RegistryError(UserError):
    """A registry request failed (not found, refused, an answer that makes no sense)."""


class RegistryUnreachable(RegistryError):
    """The registry could not be asked: nothing listens, no route or name, a timeout, a 5xx."""


class RegistryNotFound(RegistryError):
    """The registry answered that it holds no such manifest or blob (404)."""


class RegistryAuthError(RegistryError):
    """The registry refused access with the credentials given (or without any)."""


class IntegrityError(UserError):
    """A manifest or blob whose content does not match its digest: tampering or corruption."""

    def __init__(self, what: str, expected: str, actual: str) -> None:
        super().__init__(f"{what} does not match its digest: expected {expected}, got {actual}")


def human(size: int) -> str:
    """`size` bytes as an operator reads them (decimal units, as `du --si` and Docker print)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def failure_message(error: Exception) -> str:
    """What a failure tells the user: a UserError its message (it names the culprit), an
    OSError the path it is about, anything else `internal: Type: text` (a bug, with the hint).

    One home for the CLI's error line (builder.cli.errors) and a fleet template's reason
    (builder.orchestration.fleet), so a failure reads the same in either.
    """
    if isinstance(error, UserError):
        return str(error)
    if isinstance(error, OSError) and error.filename and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return (
        f"internal: {type(error).__name__}: {error}"
        f" (rerun with {DEBUG_VARIABLE}=1 for the traceback)"
    )
