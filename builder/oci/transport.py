"""One request to a registry, tried as the run's policy says, and a blob read as it streams.

`retrying` is how every registry request of `RepositoryClient` goes through the run's one retry
loop (builder.retry's `Retries.attempt`): a try that faults (builder.retry: no answer,
408/429/5xx, a body cut short or not matching its digest) is a `Fault` carrying the error its
caller gets if it was the last try; the run's `Retries` decides whether and when to try again.
`VerifiedBlob` hashes a blob as it is read.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from builder.digest import Sha256
from builder.errors import (
    IntegrityError,
    RegistryAuthError,
    RegistryError,
    RegistryNotFound,
    RegistryUnreachable,
    UserError,
)
from builder.oci.auth import AUTH_HINT
from builder.oci.name import ImageRef
from builder.retry import Faulted, Retries, SteadyBody, reason, retryable, unresolvable

TIMEOUT = 60  # seconds per receive; a trickling body is builder.retry's `Stalled`
NETWORK_ERRORS = (urllib.error.URLError, OSError, http.client.HTTPException)
T = TypeVar("T")


def retrying(retries: Retries, host: str, text: str, attempt_once: Callable[[], T]) -> T:
    """`attempt_once()` as the run's policy allows (builder.retry's one loop): a `Fault` is
    tried again; then the last fault's error, saying how many tries it took (one line: the CLI
    prints it as it is)."""

    def give_up(fault: Exception, tries: int) -> BaseException:
        assert isinstance(fault, Fault)  # the only errors `faulted` classifies as faults
        error = fault.error
        if said := retries.after(tries):
            error.args = (f"{error.args[0]}{said}",)
        return error

    return retries.attempt((host, text), attempt_once, faulted, give_up)


def faulted(error: Exception) -> Faulted | None:
    """A `Fault` is one to try again, with its answer and `Retry-After`; anything else is not."""
    return Faulted(error.answer, error.asked) if isinstance(error, Fault) else None


class VerifiedBlob:
    """A blob response that hashes what is read; `finish` drains it and checks the digest.

    Leaving the `with` block finishes it; on an exception (a corrupt tar, say) it still drains
    and checks, so a tampered or cut layer is reported as such, not as unreadable. A body cut
    off or not matching is a `Fault` (`RepositoryClient.read_blob` reads it again).
    """

    def __init__(self, body: SteadyBody, digest: str, label: str, host: str) -> None:
        self.body = body
        self.digest = digest
        self.label = label  # how messages name the repository
        self.host = host  # and the registry
        self.sha256 = Sha256()

    def read(self, size: int = -1) -> bytes:
        data = read_body(self.body, size, self.label, self.host)
        self.sha256.update(data)
        return data

    def finish(self) -> None:
        while self.read(1 << 20):
            pass
        actual = self.sha256.digest
        if actual != self.digest:
            mismatch = IntegrityError(f"{self.label}: blob {self.digest}", self.digest, actual)
            raise Fault(mismatch, "a body not matching its digest")

    def __enter__(self) -> VerifiedBlob:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if kind is None:
                self.finish()
            elif not isinstance(error, IntegrityError | RegistryError):
                with contextlib.suppress(RegistryUnreachable):  # the original error stands
                    self.finish()
        finally:
            self.body.close()


@dataclass(frozen=True)
class Exchange:
    """One request as `_once` sends it, and how retry lines and errors name it."""

    url: str
    method: str = "GET"
    accept: str | None = None
    data: bytes | None = None
    headers: Mapping[str, str] | None = None
    missing_ok: bool = False
    scopes: tuple[str, ...] = ()

    def request(self, authorization: str | None) -> urllib.request.Request:
        """The request to send; `authorization` is never forwarded to a redirect target.

        A body goes as a stream of its length: http.client then sends it a block at a time,
        each block within the timeout. Handed over as bytes, it is one `sendall`, whose timeout
        bounds the whole body: a 16 MiB chunk on a link slower than about 280 kB/s would time
        out on every try.
        """
        data = None if self.data is None else io.BytesIO(self.data)
        request = urllib.request.Request(self.url, data=data, method=self.method)
        if self.data is not None:
            request.add_header("Content-Length", str(len(self.data)))
        accept = {"Accept": self.accept} if self.accept else {}
        for name, value in {**(self.headers or {}), **accept}.items():
            request.add_header(name, value)
        if authorization:
            request.add_unredirected_header("Authorization", authorization)
        return request

    @property
    def text(self) -> str:
        """`GET library/x/manifests/1.0`: the method, the repository and the object."""
        path = urllib.parse.urlsplit(self.url).path.removeprefix("/v2/")
        return f"{self.method} {path[:160]}"


def answered(exc: urllib.error.HTTPError, error: UserError) -> UserError:
    """What an HTTP error answer is: a `Fault` when its status is one to try again (with its
    `Retry-After`), else `error` itself."""
    asked = exc.headers.get("Retry-After") if exc.headers else None
    exc.close()
    return Fault(error, str(exc.code), asked) if retryable(exc.code) else error


def unanswered(exc: BaseException, error: UserError) -> UserError:
    """What a request without an answer is: a `Fault` (refused, reset, closed, timed out),
    but for a name that does not resolve, which seconds will not change, `error` itself."""
    if unresolvable(exc):
        return error
    return Fault(error, reason(exc))


def shown(url: str) -> str:
    """`url` as an error line may show it: scheme, host and path, without a user and password
    and without the query. An upload Location's query carries the registry's signed session
    state (`_state`), a redirect to blob storage a signature and often a session token
    (`X-Amz-Signature`, `X-Amz-Security-Token`: whoever holds the URL may read the blob), and
    error lines end up in CI logs."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def unreachable(label: str, host: str, exc: BaseException, url: str = "") -> RegistryUnreachable:
    """A request without an answer: the registry, the reason, the object asked for."""
    why = f"{reason(exc)}{f' for {shown(url)}' if url else ''}"
    return RegistryUnreachable(f"{label}: registry {host} is unreachable: {why}")


def http_error(label: str, ref: ImageRef, signed_in: bool, code: int, url: str) -> RegistryError:
    """An error answer as its typed error: the registry, the repository, the object."""
    host, url = ref.api_host, shown(url)
    if code in (401, 403):
        how = "with the given credentials" if signed_in else "without credentials"
        return RegistryAuthError(
            f"{label}: registry {host} refused access ({code} unauthorized {how}) — "
            + AUTH_HINT.format(host=ref.registry)
        )
    if code == 404:
        what = "manifest" if "/manifests/" in url else "blob"
        return RegistryNotFound(
            f"{label}: not found in registry {host} "
            f"(no {what} {url.rsplit('/', 1)[-1]} in {ref.repository})"
        )
    kind = RegistryUnreachable if code == 429 or code >= 500 else RegistryError
    return kind(f"{label}: registry {host} answered {code} for {url}")


def held(response: Any) -> bool:
    """Did a HEAD (None: its 404) find what it asked for? The response is closed."""
    if response is None:
        return False
    response.close()
    return True


def read_body(body: SteadyBody, size: int, label: str, host: str) -> bytes:
    """`size` bytes of `body` (fewer at its end); a network error, a stall included, is a
    `Fault` naming the registry `host` and the object read."""
    try:
        return body.read(size)
    except NETWORK_ERRORS as exc:
        error = unreachable(label, host, exc, getattr(body.response, "url", ""))
        raise unanswered(exc, error) from None


def whole(response: Any, body: bytes, limit: int) -> bytes:
    """`body`, read from `response` up to `limit` bytes; a fault if the connection ended
    before its Content-Length (http.client hands a short read over without a word)."""
    missing = response.length or 0
    if len(body) < limit and missing > 0:
        cut = RegistryUnreachable(f"{shown(response.url)}: the body ended {missing} bytes short")
        raise Fault(cut, "a body cut short")
    return body


class Fault(RegistryError):
    """One try's transient failure: `error` is what the caller gets if it was the last try.

    A RegistryError, so that a stream's `__exit__` does not drain on it (and one that escaped
    would still be one `error:` line); `retrying` turns every fault into its error, so none
    leaves the client but from the reads of a `RepositoryClient.blob` stream, whose one caller
    (`upload_blob`, reading a stream source) is inside its own loop.
    """

    def __init__(self, error: UserError, answer: str, asked: str | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.answer = answer  # what the retry line says the registry did
        self.asked = asked  # its Retry-After header
