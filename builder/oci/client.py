"""A distribution API client (stdlib urllib) for one repository: the registry's primitives.

Reads verify while they stream: a manifest or blob not hashing to the digest asked for (or
announced) raises IntegrityError naming both, and every read is bounded. Writes are what
`remote.write` sequences: blob existence, mount, monolithic and chunked upload, a manifest PUT
returning the digest. Authentication is basic or bearer-token (a password or an identity
token) from the caller's `Credentials`, sent only to the registry's own origin (an upload
Location or redirect elsewhere gets none; a token realm must be HTTPS, but on loopback). Every
request is tried again on faults as the run's `Retries` says (builder.retry, through
builder.oci.transport); failures are typed (`builder.errors`): unreachable, auth, other.
"""

from __future__ import annotations

import contextlib
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from builder.digest import Readable, Sha256
from builder.errors import (
    IntegrityError,
    RegistryAuthError,
    RegistryError,
    RegistryUnreachable,
)
from builder.oci import transport
from builder.oci.auth import MAX_TOKEN_ANSWER, Credentials, token_of, token_request, trusted_realm
from builder.oci.name import DIGEST_RE, TAG_RE, ImageRef, is_loopback
from builder.oci.transport import Exchange, Fault, VerifiedBlob
from builder.oci.v1 import MANIFEST_TYPES, digest_of
from builder.retry import Retries, SteadyBody

MAX_MANIFEST = 16 << 20
MAX_JSON_BLOB = 64 << 20
REFERENCE_RE = re.compile(rf"{DIGEST_RE.pattern}|{TAG_RE.pattern}")
CHUNK = 16 << 20  # bytes per PATCH of a chunked upload
OCTETS = MappingProxyType({"Content-Type": "application/octet-stream"})
Source = bytes | Path | Callable[[], AbstractContextManager[Readable]]
T = TypeVar("T")


class RepositoryClient:
    """Requests on one repository of one registry, authenticated on the first 401."""

    def __init__(
        self,
        ref: ImageRef,
        label: str | None = None,
        credentials: Credentials | None = None,
        retries: Retries | None = None,
    ) -> None:
        self.ref = ref
        self.retries = retries or Retries()  # the run's, else the real policy, said to no one
        self.label = label or str(ref)  # how messages name what was asked for
        local = is_loopback(ref.api_host)
        self.scheme = "http" if local else "https"
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({} if local else None)
        )
        self.credentials = credentials
        # Basic credentials go with the first request (they are this host's own), saving a 401
        # round trip; a registry that wants tokens answers with its Bearer challenge instead.
        usable = self.credentials and not self.credentials.identity_token
        self.authorization = self.credentials.basic() if usable and self.credentials else None
        self.token_service: tuple[str, str] | None = None  # (realm, service) of a Bearer login
        self.token_scopes: frozenset[str] = frozenset()  # asked for with the current token
        self.refused_sources: set[str] = set()  # repositories the token service denied a pull of

    # -- plumbing -----------------------------------------------------------------------------
    def url(self, kind: str, reference: str = "") -> str:
        return f"{self.scheme}://{self.ref.api_host}/v2/{self.ref.repository}/{kind}/{reference}"

    def _checked(self, reference: str, what: str) -> str:
        """A tag or digest from a manifest or caller, refused before it becomes part of a URL."""
        if not REFERENCE_RE.fullmatch(reference) or (what == "blob" and ":" not in reference):
            raise RegistryError(f"{self.label}: {what} reference {reference[:80]!r} is malformed")
        return reference

    def _own(self, url: str) -> bool:
        """Is `url` on this registry's API origin (where its credentials may go)?"""
        parts = urllib.parse.urlsplit(url)
        return (parts.scheme, parts.netloc) == (self.scheme, self.ref.api_host)

    def open(
        self,
        url: str,
        method: str = "GET",
        *,
        accept: str | None = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        missing_ok: bool = False,
        scopes: tuple[str, ...] = (),
    ) -> Any:
        """The response to `url` (None for a 404 when `missing_ok`); typed errors otherwise.
        Tried again on faults: it is idempotent or its body is bytes (an upload session's
        steps are not sent here: `upload_blob` begins a new session instead)."""
        exchange = Exchange(url, method, accept, data, headers, missing_ok, scopes)
        return self._retrying(exchange.text, lambda: self._once(exchange))

    def _once(self, exchange: Exchange) -> Any:
        """One try of `exchange`: a 401 is answered once by authenticating as its challenge
        asks (also midway through a run: an expired token is asked for again); a fault is a
        `Fault` for `_retrying`, any other failure its typed error."""
        reauthenticated = False
        while True:
            # Credentials never go to another host, nor to a redirect target (blob storage).
            authorization = self.authorization if self._own(exchange.url) else None
            try:
                return self.opener.open(exchange.request(authorization), timeout=transport.TIMEOUT)
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
                if exc.code == 401 and not reauthenticated:
                    reauthenticated = True
                    if self._authenticate(challenge, exchange.method, exchange.scopes):
                        continue
                if exc.code == 404 and exchange.missing_ok:
                    return None
                raise transport.answered(exc, self._http_error(exc.code, exchange.url)) from None
            except transport.NETWORK_ERRORS as exc:
                error = self._unreachable(self.ref.api_host, exc, exchange.url)
                raise transport.unanswered(exc, error) from None

    def _retrying(self, text: str, attempt_once: Callable[[], T], host: str | None = None) -> T:
        return transport.retrying(self.retries, host or self.ref.api_host, text, attempt_once)

    def _unreachable(self, host: str, exc: BaseException, url: str = "") -> RegistryUnreachable:
        return transport.unreachable(self.label, host, exc, url)

    def _http_error(self, code: int, url: str) -> RegistryError:
        return transport.http_error(self.label, self.ref, self.credentials is not None, code, url)

    def _authenticate(self, challenge: str, method: str, scopes: tuple[str, ...]) -> bool:
        """Set the Authorization header a 401 challenge asks for; False if there is none."""
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.credentials or self.credentials.identity_token:
                return False
            if (self.authorization or "").startswith("Basic "):
                return False  # already sent and refused
            self.authorization = self.credentials.basic()
            return True
        if scheme.lower() != "bearer":
            return False
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        realm = fields.get("realm", "")
        if not realm:
            return False
        if not trusted_realm(realm):
            raise RegistryAuthError(
                f"{self.label}: registry {self.ref.api_host} asks for credentials at"
                f" {transport.shown(realm)[:100]!r}; only an https token service is trusted"
                " with them"
            )
        action = "pull" if method in ("GET", "HEAD") else "pull,push"
        wanted = [fields.get("scope") or f"repository:{self.ref.repository}:{action}", *scopes]
        self.token_service = (realm, fields.get("service", ""))
        return self._bearer(wanted)

    def _bearer(self, scopes: list[str]) -> bool:
        """Authorize with a token for `scopes` from the token service met before."""
        if self.token_service is None:
            return False
        token = self._token(*self.token_service, scopes)
        if not token:
            return False
        self.authorization = f"Bearer {token}"
        self.token_scopes = frozenset(part for scope in scopes for part in scope.split())
        return True

    def _token(self, realm: str, service: str, scopes: list[str]) -> str | None:
        """A bearer token from the realm (its answer bounded: tokens are a few KiB), tried
        again on faults as every registry request is."""

        def ask() -> str | None:
            request = token_request(realm, service, scopes, self.credentials)
            try:
                with self.opener.open(request, timeout=transport.TIMEOUT) as response:
                    body = SteadyBody(response, self.retries.policy)
                    return token_of(body.read(MAX_TOKEN_ANSWER))  # cut: not JSON
            except urllib.error.HTTPError as exc:
                raise transport.answered(exc, self._http_error(exc.code, realm)) from None
            except transport.NETWORK_ERRORS as exc:
                raise transport.unanswered(exc, self._unreachable(host, exc, realm)) from None
            except ValueError:
                raise RegistryError(
                    f"{self.label}: token service {transport.shown(realm)} answered no JSON"
                ) from None

        host = urllib.parse.urlsplit(realm).netloc
        return self._retrying(f"GET token {urllib.parse.urlsplit(realm).path}", ask, host)

    # -- reading ------------------------------------------------------------------------------
    def ping(self) -> None:
        """Raise unless the registry answers its API root (authenticating as it asks)."""
        with self.open(f"{self.scheme}://{self.ref.api_host}/v2/"):
            pass

    def head_manifest(self, reference: str) -> str | None:
        """The digest the registry serves for `reference`, from one HEAD request."""
        url = self.url("manifests", self._checked(reference, "manifest"))
        with self.open(url, "HEAD", accept=", ".join(MANIFEST_TYPES)) as response:
            digest = response.headers.get("Docker-Content-Digest")
        return digest if digest and DIGEST_RE.fullmatch(digest) else None

    def manifest(self, reference: str, expected: str | None = None) -> tuple[bytes, str]:
        """A manifest's or index's bytes and digest, checked against every digest naming it.

        A body cut short or not matching is fetched again (a fault, bounded by the policy);
        the last mismatch is the IntegrityError.
        """
        url = self.url("manifests", self._checked(reference, "manifest"))
        exchange = Exchange(url, accept=", ".join(MANIFEST_TYPES))

        def fetch() -> tuple[bytes, str]:
            with self._once(exchange) as response:
                body = self._whole(response, MAX_MANIFEST + 1)
                served = response.headers.get("Docker-Content-Digest")
            if len(body) > MAX_MANIFEST:
                raise RegistryError(
                    f"{self.label}: manifest {reference} is larger than {MAX_MANIFEST >> 20} MiB"
                )
            digest = digest_of(body)
            asked = reference if DIGEST_RE.fullmatch(reference) else None
            for wanted in (asked, expected, served):
                if wanted and wanted != digest:
                    mismatch = IntegrityError(f"{self.label}: manifest {reference}", wanted, digest)
                    raise Fault(mismatch, "a body not matching its digest")
            return body, digest

        return self._retrying(exchange.text, fetch)

    def document(self, url: str, accept: str, limit: int) -> tuple[str, bytes] | None:
        """A small document's Content-Type and body, up to `limit` bytes (None: a 404), read
        inside the retry loop: one cut short or reset midway (the referrers API's answer has
        no digest to check) is asked for again, not handed over as a malformed document."""
        exchange = Exchange(url, accept=accept, missing_ok=True)

        def fetch() -> tuple[str, bytes] | None:
            response = self._once(exchange)
            if response is None:
                return None
            with response:
                return response.headers.get("Content-Type") or "", self._whole(response, limit)

        return self._retrying(exchange.text, fetch)

    def read_blob(self, digest: str, consume: Callable[[VerifiedBlob], T]) -> T:
        """`consume(stream)` over the blob `digest`, verified as it streams and at its end.

        A body cut off or not matching is a fault: `consume` is called again on a new stream,
        from its start (bounded by the policy; the last mismatch is the IntegrityError), so it
        must be restartable, what it made of a failed stream not counting (each caller's is: a
        layer is laid over the lower ones once its whole tar was read, builder.base.layers; a
        file is rewritten from its start). Spooling every blob first would make any consumer
        restartable, at a layer's size in scratch space and a second pass on the clean path.
        """
        exchange = Exchange(self.url("blobs", self._checked(digest, "blob")))

        def once() -> T:
            body = SteadyBody(self._once(exchange), self.retries.policy)
            with VerifiedBlob(body, digest, self.label, self.ref.api_host) as blob:
                return consume(blob)

        return self._retrying(exchange.text, once)

    def blob(self, digest: str) -> VerifiedBlob:
        """A blob as a stream (opened as `open` retries); a fault in its body is `Fault`, for
        the caller that can begin again (`upload_blob` re-opens a stream source)."""
        url = self.url("blobs", self._checked(digest, "blob"))
        body = SteadyBody(self.open(url), self.retries.policy)
        return VerifiedBlob(body, digest, self.label, self.ref.api_host)

    def small_blob(self, digest: str) -> bytes:
        """A config blob's bytes, verified; larger than MAX_JSON_BLOB is an error, not a read."""

        def bounded(blob: VerifiedBlob) -> bytes:
            body = blob.read(MAX_JSON_BLOB + 1)
            if len(body) > MAX_JSON_BLOB:  # fail before `finish` drains the rest
                raise RegistryError(
                    f"{self.label}: blob {digest} is larger than {MAX_JSON_BLOB >> 20} MiB"
                )
            return body

        return self.read_blob(digest, bounded)

    def _whole(self, response: Any, limit: int) -> bytes:
        """Up to `limit` bytes of `response`; a fault if it ended before its Content-Length."""
        body = SteadyBody(response, self.retries.policy)
        read = transport.read_body(body, limit, self.label, self.ref.api_host)
        return transport.whole(response, read, limit)

    # -- writing ------------------------------------------------------------------------------
    def blob_exists(self, digest: str) -> bool:
        url = self.url("blobs", self._checked(digest, "blob"))
        return transport.held(self.open(url, "HEAD", missing_ok=True))

    def _arrived(self, digest: str) -> bool:
        """Is a failed upload's blob there after all? One HEAD, tried once: its fault is the
        upload's, counted in the run's budget by the upload's loop (retried on its own, a
        registry that never answers held a run a failed step's 60 s, then the HEAD's 2 x 60 s)."""
        url = self.url("blobs", self._checked(digest, "blob"))
        try:
            return transport.held(self._once(Exchange(url, "HEAD", missing_ok=True)))
        except Fault:
            return False

    def mount(self, digest: str, source_repository: str) -> bool:
        """Link a blob from another repository of this registry; False if it cannot.

        A mount needs pull on the source as well as push here: with token auth the token is
        asked for both scopes at once before the POST (a token for this repository alone gets
        a 202 upload session, or a 401, from most registries instead of the mount). A 202 is
        the registry declining the mount: its session is cancelled and the caller uploads. A
        source the token service refuses is remembered, so that the other blobs of the write
        do not ask for the token (and try the mount) again.
        """
        if source_repository in self.refused_sources:
            return False
        source_scope = f"repository:{source_repository}:pull"
        if self.token_service is not None and source_scope not in self.token_scopes:
            wanted = [f"repository:{self.ref.repository}:pull,push", source_scope]
            try:
                asked = self._bearer(wanted)
            except RegistryAuthError:  # no pull on the source for us
                asked = False
            if not asked:
                self.refused_sources.add(source_repository)
                return False
        query = urllib.parse.urlencode({"mount": digest, "from": source_repository})
        url = self.url("blobs", f"uploads/?{query}")
        with self.open(url, "POST", data=b"", scopes=(source_scope,)) as response:
            if response.status == 201:
                return True
            location = self._location(response)
        self._cancel(location)  # the registry started an upload instead
        return False

    def upload_blob(self, source: Source, digest: str | None = None, chunk: int = CHUNK) -> str:
        """Upload bytes, a file or a stream; returns its digest (checked if `digest` is given).

        Bytes and files up to `chunk` go in one PUT; larger files and streams in PATCHes of
        `chunk` bytes, hashed as they go, then a closing PUT naming the digest. A stream is a
        function opening it (another registry's blob: `blob`), to read it again from its start.

        A fault in any step (the POST, a PATCH, the closing PUT, the stream's source) ends the
        session (stale once the registry took bytes unheard of): the blob is asked for (HEAD:
        a reply lost after the registry stored it is the common case), else a new session
        sends it all again; a blob streamed across registries is fetched again, not spooled
        (no layer-sized scratch space on the clean path; the target is mounted from first).
        """
        if isinstance(source, Path) and source.stat().st_size <= chunk:
            source = source.read_bytes()
        known = digest or (digest_of(source) if isinstance(source, bytes) else None)
        text = f"upload of {known or 'a blob'} to {self.ref.repository}"

        def once() -> str:
            try:
                return self._upload_once(source, digest, chunk)
            except Fault:
                if known and self._arrived(known):
                    return known
                raise

        return self._retrying(text, once)

    def _upload_once(self, source: Source, digest: str | None, chunk: int) -> str:
        """One upload session, every step tried once (`upload_blob` begins again on a fault)."""
        with self._once(Exchange(self.url("blobs", "uploads/"), "POST", data=b"")) as response:
            location = self._location(response)
        if isinstance(source, bytes):
            actual, body = digest_of(source), source
        else:
            opened = source.open("rb") if isinstance(source, Path) else source()
            with opened as stream:
                actual, location = self._patch_all(location, stream, chunk)
            body = b""
        if digest and digest != actual:
            self._cancel(location)
            mismatch = IntegrityError(f"{self.label}: blob upload", digest, actual)
            if isinstance(source, bytes | Path):
                raise mismatch  # the same bytes would be read again
            raise Fault(mismatch, "a source not matching its digest")
        separator = "&" if "?" in location else "?"
        put = f"{location}{separator}{urllib.parse.urlencode({'digest': actual})}"
        with self._once(Exchange(put, "PUT", data=body, headers=OCTETS)) as response:
            served = response.headers.get("Docker-Content-Digest")
        if served and served != actual:
            raise IntegrityError(f"{self.label}: uploaded blob", actual, served)
        return actual

    def _patch_all(self, location: str, stream: Readable, chunk: int) -> tuple[str, str]:
        sent = Sha256()  # the digest to commit under, and where the next PATCH begins
        while data := stream.read(chunk):
            span = {"Content-Range": f"{sent.size}-{sent.size + len(data) - 1}"}
            patch = Exchange(location, "PATCH", data=data, headers={**OCTETS, **span})
            with self._once(patch) as response:
                location = self._location(response)
            sent.update(data)
        return sent.digest, location

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        """PUT a manifest or index under a tag or its digest; returns the digest it has."""
        digest = digest_of(body)
        if DIGEST_RE.fullmatch(reference) and reference != digest:
            raise IntegrityError(f"{self.label}: manifest to put", reference, digest)
        headers = {"Content-Type": media_type}
        url = self.url("manifests", reference)
        with self.open(url, "PUT", data=body, headers=headers) as response:
            served = response.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise IntegrityError(f"{self.label}: stored manifest", digest, served)
        return digest

    def _cancel(self, location: str) -> None:
        """Drop an upload session; best effort, tried once (it expires on the registry)."""
        with contextlib.suppress(RegistryError):  # a fault included
            response = self._once(Exchange(location, "DELETE", missing_ok=True))
            if response is not None:
                response.close()

    def _location(self, response: Any) -> str:
        location = response.headers.get("Location")
        if not location:
            raise RegistryError(
                f"{self.label}: registry {self.ref.api_host} gave no upload location"
            )
        url = urllib.parse.urljoin(f"{self.scheme}://{self.ref.api_host}/", location)
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise RegistryError(
                f"{self.label}: upload location {transport.shown(location)[:100]!r} is not HTTP"
            )
        return url
