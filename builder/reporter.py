"""Where a run's progress lines and notes go: one object, made by the CLI, carried in records.

Progress goes to stdout (the CLI's `note`), a test's list, or nowhere; stderr is kept for the
one-line error, and for the notes of a command whose stdout is its product (`sbom`'s document,
`verify --json`'s report, `base`'s image names). Every layer that tells the user something
takes the reporter it was given rather than printing, so a library caller decides where the
lines go.

Every line the tool prints or writes for a person goes through `mask`: a requirements file is
hostile input read on CI runners that hold logins and keys, and whatever a message quotes of it
lands in a log. `mask` replaces each secret value the run has read (`remember`: a `${VAR}`
substituted into a URL's credentials, a URL's own password, a registry password, a signing
passphrase) and any `user:password@` of a URL.
"""

from __future__ import annotations

import re
import sys
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

MASK = "***"
# Shorter values are not masked in free text: a password "wrong" would mangle every "wrong
# passphrase". A URL's user:password@ is masked whatever its length.
MIN_SECRET_CHARS = 8
# `scheme://user:password@`, or a bare `user:password@host` (a URL written without its scheme)
# that is no image reference's `name:tag@sha256:…`
URL_CREDENTIALS = re.compile(
    r"(?i)(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]*@"
    r"|(?<![\w.:/@-])[\w.~%+-]+:[^\s/@:]+@(?=[\w\[])(?!sha\d+:)"
)
EXCERPT_CHARS = 40
ASSIGNMENT = re.compile(r"(?<![=<>!~])=(?!=).*")
KEY_VALUE = re.compile(r":\s.*")  # `password: …`, `"token": "…"`: a YAML or JSON file's line
TOKEN = re.compile(r"[A-Za-z0-9_+/-]{20,}")
_secrets: set[str] = set()
_lock = threading.Lock()


def remember(value: str) -> None:
    """Mask `value` in every line from now on (and its percent-encoded form, as a URL holds it)."""
    if len(value) < MIN_SECRET_CHARS:
        return
    with _lock:
        _secrets.update({value, urllib.parse.quote(value, safe="")})


def remember_credentials(url: str) -> None:
    """Remember the password of `url`'s `user:password@` (the user when no password follows
    in an http(s) URL: a token alone; ssh's `git@` is a login name); a part still holding an
    unsubstituted `${VAR}` is left to its substitution."""
    scheme, _, rest = url.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    userinfo, at, _ = authority.rpartition("@")
    if not at:
        return
    user, colon, password = userinfo.partition(":")
    if not colon and not scheme.lower().endswith(("http", "https")):
        return
    secret = password if colon else user
    if "${" not in secret:
        remember(secret)
        remember(urllib.parse.unquote(secret))


def redact_credentials(text: str) -> str:
    """`scheme://user:password@host` → `scheme://***@host`, `user:password@host` → `***@host`,
    anywhere in the text (builder.resolve.resolution.redact drops them from one URL, for a
    record that keeps the URL)."""
    return URL_CREDENTIALS.sub(lambda m: f"{m['scheme'] or ''}{MASK}@", text)


def mask(text: str, *, urls: bool = True) -> str:
    """`text` with every remembered secret, and every URL's credentials, replaced by `***`: the
    one function every user-visible line and written record goes through. A record (`urls`
    False) is masked of the remembered values only: its text is data (a purl's `pkg:pypi/x@1`),
    and a secret reaching it is the bug this guards against, not its own URL."""
    with _lock:
        known = sorted(_secrets, key=len, reverse=True)
    for secret in known:
        text = text.replace(secret, MASK)
    return redact_credentials(text) if urls else text


def excerpt(text: str) -> str:
    """A short, quoted, masked piece of user input, safe to print in an error line.

    Masks as `mask` does, then everything after an assignment-like `=` (not `==`, `>=`, ...)
    or a `key: ` and long letter-and-digit runs that look like tokens, then cuts to a few dozen
    characters.
    """
    text = KEY_VALUE.sub(": ***", ASSIGNMENT.sub("=***", mask(text)))
    text = TOKEN.sub(
        lambda m: MASK if re.search(r"\d", m[0]) and re.search(r"[A-Za-z]", m[0]) else m[0], text
    )
    if len(text) > EXCERPT_CHARS:
        text = text[:EXCERPT_CHARS] + "…"
    return repr(text)


@dataclass(frozen=True)
class Reporter:
    """Says one line at a time to `sink`."""

    sink: Callable[[str], None]

    def say(self, line: str) -> None:
        self.sink(mask(line))

    def note(self, line: str) -> None:
        self.say(f"note: {line}")

    def warn(self, line: str) -> None:
        self.say(f"warning: {line}")

    def prefixed(self, name: str) -> Reporter:
        """A reporter whose lines start with `[name]`: templates rebuilt at once
        (builder.orchestration.fleet) interleave their lines, and each must still say whose it
        is."""
        return Reporter(lambda line: self.say(f"[{name}] {line}"))


QUIET = Reporter(lambda line: None)
TO_STDERR = Reporter(lambda line: print(line, file=sys.stderr, flush=True))
