"""The retry policy (builder.retry) and the client's recovery, without real waiting.

The policy's pure functions: the backoff's bounds, `Retry-After` as seconds or an HTTP date
(capped), which answers are tried again. Then `RepositoryClient` against a loopback fake
registry (tests/support/fakeregistry.py) with an injected clock and sleep: a 503 then an
answer, a 400/403/404 never again, a 401 midway re-authenticating once, an upload whose
closing PUT lost its answer after the registry stored the blob (HEAD, no new session), one
whose PATCH failed (a new session from the start), a blob cut short read again, a registry
down for good failing after its tries with one line, and a clean registry asked each request
once.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from support.fakeregistry import INDEX, Reply, Server

from builder.errors import RegistryAuthError, RegistryError, RegistryUnreachable
from builder.oci.auth import Credentials
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import Referrer, api_listing
from builder.oci.transport import TIMEOUT, shown
from builder.retry import (
    POLICY,
    Faulted,
    Policy,
    Retries,
    Service,
    backoff,
    retry_after,
    retryable,
    wait,
)


def test_which_answers_are_tried_again() -> None:
    assert all(retryable(code) for code in (408, 429, 500, 502, 503, 504))
    assert retryable(None)  # no answer: refused, reset, closed, timed out, cut short
    assert not any(retryable(code) for code in (400, 401, 403, 404, 405, 416, 501))


def test_the_backoff_grows_within_its_bounds() -> None:
    policy = Policy(base=0.5, longest=10.0)
    for attempt in range(1, 9):
        full = min(10.0, 0.5 * 2 ** (attempt - 1))
        low, high = backoff(policy, attempt, 0.0), backoff(policy, attempt, 0.999999)
        assert low == pytest.approx(full / 2) and full / 2 <= high < full
    assert backoff(policy, 30, 0.5) <= 10.0


def test_retry_after_in_seconds_or_an_http_date_and_capped() -> None:
    now = 1_700_000_000.0
    assert retry_after("2", now) == 2.0
    assert retry_after(email.utils.formatdate(now + 7, usegmt=True), now) == pytest.approx(7)
    assert retry_after(email.utils.formatdate(now - 60, usegmt=True), now) == 0.0
    assert retry_after(None, now) is None and retry_after("soon", now) is None
    policy = Policy(retry_after_cap=30.0)
    assert wait(policy, 1, 0.0, 2.0) == 2.0  # longer than the backoff: the registry's wish
    assert wait(policy, 1, 0.0, 3600.0) == 30.0  # capped
    assert wait(policy, 4, 0.0, 0.1) == backoff(policy, 4, 0.0)  # never shorter than backoff


@pytest.mark.parametrize(
    "value",
    [
        "-5",
        "1.5",
        "soon",
        "\u00b2",
        "3\u00b9",
        "Mon, 99 Foo 2020 99:99:99 GMT",
        "Wed, 21 Oct 99999 07:28:00 GMT",
    ],
)
def test_a_retry_after_that_is_no_number_nor_date_is_ignored(value: str) -> None:
    """Negative, fractional, garbage, a Latin-1 superscript digit (`str.isdigit` says yes,
    `float` says no), an impossible date: none is a wish, none an exception."""
    assert retry_after(value, 1_700_000_000.0) is None
    assert wait(POLICY, 1, 0.0, retry_after(value, 1_700_000_000.0)) == backoff(POLICY, 1, 0.0)


def test_a_huge_or_old_retry_after_is_capped_or_nothing() -> None:
    now = 1_700_000_000.0
    assert wait(POLICY, 1, 0.0, retry_after("9" * 400, now)) == POLICY.retry_after_cap
    assert retry_after("Sun Nov  6 08:49:37 1994", now) == 0.0  # asctime's form: GMT, past
    later = email.utils.formatdate(now + 5, usegmt=True)  # RFC 850's form, as old servers do
    rfc850 = email.utils.parsedate_to_datetime(later).strftime("%A, %d-%b-%y %H:%M:%S GMT")
    assert retry_after(rfc850, now) == pytest.approx(5)


class Clock:
    """An injected clock whose sleep only moves time on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def retries(clock: Clock, lines: list[str], policy: Policy = POLICY) -> Retries:
    speaker = type("Speaker", (), {"note": lambda self, line: lines.append(line)})()
    return Retries(speaker, policy, clock=lambda: clock.now, sleep=clock.sleep, jitter=lambda: 0.0)


def test_the_budget_ends_a_run_of_faults() -> None:
    clock, lines = Clock(), []
    tried = retries(clock, lines, Policy(tries=100, budget=10.0))
    count = 0
    while tried.again("r", "GET x", "503", count + 1, clock.now):
        count += 1
    assert sum(clock.slept) <= 10.0 and tried.exhausted()
    assert not tried.again("r", "GET y", "503", 1, clock.now)  # the next request: no retry
    assert len(tried.to_list()) == count == len(lines)


def test_the_one_loop_tries_a_fault_again_and_raises_an_answer_at_once() -> None:
    """`Retries.attempt`: the caller's classification decides what is a fault; the loop waits,
    says and records each retry, and hands the last fault to `give_up` with its tries."""
    clock, lines = Clock(), []
    tried = retries(clock, lines, Policy(tries=3))
    faults = iter([ConnectionResetError("reset"), TimeoutError("timed out")])

    def once() -> str:
        fault = next(faults, None)
        if fault is not None:
            raise fault
        return "answer"

    def classify(error: Exception) -> Faulted | None:
        return Faulted(str(error)) if isinstance(error, OSError) else None

    where = ("index.example", "GET /simple/six/")
    assert tried.attempt(where, once, classify, service=Service.INDEX) == "answer"
    assert [one["answer"] for one in tried.to_list()] == ["reset", "timed out"]
    assert {one["service"] for one in tried.to_list()} == {"index"} and len(lines) == 2
    assert lines[0].startswith("index index.example failed (reset) to GET /simple/six/ (try 1")

    def answered() -> str:
        raise KeyError("not a fault")

    with pytest.raises(KeyError):
        tried.attempt(where, answered, classify)
    assert len(tried.to_list()) == 2  # an answer is never tried again

    def down() -> str:
        raise ConnectionRefusedError("refused")

    given: list[int] = []

    def give_up(error: Exception, tries: int) -> BaseException:
        given.append(tries)
        return RuntimeError(f"{error}{tried.after(tries)}")

    with pytest.raises(RuntimeError, match=r"^refused \(after 3 tries\)$"):
        tried.attempt(("registry.example", "GET x"), down, classify, give_up)
    assert given == [3] and len(tried.to_list()) == 4


Route = Callable[[str, str], Reply]


def serve(route: Route) -> tuple[Server, Clock, list[str], RepositoryClient]:
    server, clock, lines = Server(route), Clock(), []
    ref = ImageRef.parse(f"127.0.0.1:{server.port}/team/x:1")
    client = RepositoryClient(ref, credentials=None, retries=retries(clock, lines))
    return server, clock, lines, client


def manifest_route(failures: list[int]) -> Route:
    body = json.dumps({"schemaVersion": 2, "layers": []}).encode()

    def route(method: str, path: str) -> Reply:
        if failures:
            return failures.pop(0), {"Retry-After": "2"}, b""
        return 200, {"Content-Type": "application/json"}, body

    return route


def test_a_503_then_a_429_then_the_answer() -> None:
    server, clock, lines, client = serve(manifest_route([503, 429]))
    try:
        body, _ = client.manifest("1")
    finally:
        server.close()
    assert json.loads(body)["schemaVersion"] == 2
    assert len(server.seen) == 3 and clock.slept[1] >= 2.0  # the Retry-After honoured
    assert "answered 503 to GET team/x/manifests/1 (try 1 of 5)" in lines[0]
    assert [one["answer"] for one in client.retries.to_list()] == ["503", "429"]


def test_a_registry_sending_a_superscript_retry_after_is_tried_again() -> None:
    """The header as http.client decodes it (Latin-1): once, `float` raised out of the loop."""
    answers = [(503, {"Retry-After": "\u00b2"}, b"")]
    answer = manifest_route([])

    def route(method: str, path: str) -> Reply:
        return answers.pop(0) if answers else answer(method, path)

    server, clock, lines, client = serve(route)
    try:
        client.manifest("1")
    finally:
        server.close()
    assert len(server.seen) == 2 and clock.slept == [backoff(POLICY, 1, 0.0)] and len(lines) == 1


@pytest.mark.parametrize("status", [400, 403, 404])
def test_an_answer_that_is_not_a_fault_is_not_tried_again(status: int) -> None:
    server, clock, lines, client = serve(manifest_route([status]))
    try:
        with pytest.raises(RegistryError):
            client.manifest("1")
    finally:
        server.close()
    assert len(server.seen) == 1 and clock.slept == [] and lines == []


def test_a_registry_down_fails_after_its_tries_on_one_line() -> None:
    server, _clock, lines, client = serve(manifest_route([503] * 50))
    try:
        with pytest.raises(RegistryUnreachable) as caught:
            client.manifest("1")
    finally:
        server.close()
    assert len(server.seen) == POLICY.tries and len(lines) == POLICY.tries - 1
    message = str(caught.value)
    assert "\n" not in message and f"answered 503 for http://127.0.0.1:{server.port}" in message
    assert "/v2/team/x/manifests/1" in message and f"after {POLICY.tries} tries" in message


def test_a_401_midway_gets_a_new_token_once() -> None:
    """A bearer token that expired between two requests: asked for again, the request sent
    again; a 401 right after a fresh token is the answer (an auth error), not a loop."""
    issued: list[str] = []
    expired: set[str] = set()

    def route(method: str, path: str) -> Reply:
        if path.startswith("/token"):
            issued.append(f"t{len(issued)}")
            return 200, {}, json.dumps({"token": issued[-1]}).encode()
        token = seen_auth()
        if not token or token in expired or (path.endswith("/never") and token):
            realm = f'Bearer realm="http://127.0.0.1:{server.port}/token",service="x"'
            return 401, {"WWW-Authenticate": realm}, b""
        return 200, {"Docker-Content-Digest": "sha256:" + "0" * 64}, b""

    server, clock, _lines, client = serve(route)
    seen_auth = lambda: server.seen[-1][2].removeprefix("Bearer ")  # noqa: E731
    try:
        client.head_manifest("1")
        assert issued == ["t0"]
        expired.add("t0")
        client.head_manifest("2")
        assert issued == ["t0", "t1"]
        with pytest.raises(RegistryAuthError):
            client.head_manifest("never")
        assert issued == ["t0", "t1", "t2"]  # one new token, then the 401 stands
    finally:
        server.close()
    assert clock.slept == []


class Uploads:
    """A registry's blob upload endpoints, failing as told: `lose_put` answers the closing PUT
    with a 503 after storing the blob; `fail_patch` answers the first PATCH 502."""

    def __init__(self, lose_put: bool = False, fail_patch: bool = False) -> None:
        self.stored: dict[str, bytes] = {}
        self.sessions: dict[str, bytearray] = {}
        self.lose_put, self.fail_patch = lose_put, fail_patch

    def route(self, method: str, path: str, body: bytes) -> Reply:
        if method == "HEAD" and "/blobs/sha256:" in path:
            return (200 if path.rsplit("/", 1)[1] in self.stored else 404), {}, b""
        if method == "POST":
            name = f"s{len(self.sessions)}"
            self.sessions[name] = bytearray()
            return 202, {"Location": f"/v2/team/x/blobs/uploads/{name}"}, b""
        session = re.search(r"/uploads/(s\d+)", path)
        if session is None:
            return 404, {}, b""
        if method == "PATCH":
            if self.fail_patch:
                self.fail_patch = False
                return 502, {}, b""
            self.sessions[session[1]] += body
            return 202, {"Location": f"/v2/team/x/blobs/uploads/{session[1]}"}, b""
        digest = path.split("digest=", 1)[1].replace("%3A", ":")
        data = bytes(self.sessions[session[1]]) + body
        assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
        self.stored[digest] = data
        if self.lose_put:
            self.lose_put = False
            return 503, {}, b""
        return 201, {"Docker-Content-Digest": digest}, b""


def upload_server(uploads: Uploads) -> tuple[Server, Clock, RepositoryClient]:
    server = Server(lambda method, path: (500, {}, b""))
    for verb in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):  # the body, too
        setattr(server.httpd.RequestHandlerClass, f"do_{verb}", _with_body(uploads))
    clock = Clock()
    ref = ImageRef.parse(f"127.0.0.1:{server.port}/team/x")
    return server, clock, RepositoryClient(ref, retries=retries(clock, []))


def _with_body(uploads: Uploads) -> Callable[..., None]:
    def answer(handler) -> None:  # type: ignore[no-untyped-def]
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length)
        status, headers, reply = uploads.route(handler.command, handler.path, body)
        handler.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(reply))}.items():
            handler.send_header(name, value)
        handler.end_headers()

    return answer


def test_a_lost_answer_to_the_closing_put_asks_whether_the_blob_arrived(tmp_path) -> None:
    uploads = Uploads(lose_put=True)
    server, _clock, client = upload_server(uploads)
    data = b"layer" * 1000
    try:
        digest = client.upload_blob(data, "sha256:" + hashlib.sha256(data).hexdigest())
    finally:
        server.close()
    assert uploads.stored[digest] == data and len(uploads.sessions) == 1  # no second session


def chunked_upload(server: Server, client: RepositoryClient, tmp_path: Path) -> tuple[str, Path]:
    """A 100 KiB file uploaded in 30 KB PATCHes (four of them), the server closed after:
    (its digest, the file)."""
    path = tmp_path / "big"
    path.write_bytes(bytes(range(256)) * 400)
    try:
        return client.upload_blob(path, chunk=30_000), path
    finally:
        server.close()


def test_a_failed_patch_starts_a_new_session_from_the_start(tmp_path) -> None:
    uploads = Uploads(fail_patch=True)
    server, _clock, client = upload_server(uploads)
    digest, path = chunked_upload(server, client, tmp_path)
    assert uploads.stored[digest] == path.read_bytes()
    assert len(uploads.sessions) == 2 and bytes(uploads.sessions["s0"]) == b""


def test_a_blob_cut_short_is_read_again_from_its_start() -> None:
    data = bytes(range(256)) * 64
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    served: list[int] = []

    def route(method: str, path: str) -> Reply:
        served.append(1)
        return 200, {}, data[: len(data) // 2] if len(served) == 1 else data

    server, _clock, lines, client = serve(route)
    reads: list[int] = []
    try:
        got = client.read_blob(digest, lambda blob: reads.append(1) or blob.read(1 << 20))
    finally:
        server.close()
    assert got == data and len(reads) == 2 and len(lines) == 1


def test_a_clean_registry_is_asked_each_request_once() -> None:
    server, clock, _lines, client = serve(manifest_route([]))
    try:
        for reference in ("1", "2", "3"):
            client.manifest(reference)
    finally:
        server.close()
    assert len(server.seen) == 3 and clock.slept == [] and client.retries.to_list() == []


def test_credentials_do_not_change_the_count() -> None:
    """Basic credentials go with the first request: still one request each."""
    server, _clock, _lines, client = serve(manifest_route([]))
    client.credentials = Credentials("u", "p", "test")
    client.authorization = client.credentials.basic()
    try:
        client.manifest("1")
    finally:
        server.close()
    assert len(server.seen) == 1 and server.seen[0][2].startswith("Basic ")


def test_a_refused_connection_is_tried_again_and_named_in_the_error() -> None:
    clock, lines = Clock(), []
    ref = ImageRef.parse("127.0.0.1:9/team/x:1")  # the discard port: nothing listens
    client = RepositoryClient(ref, retries=retries(clock, lines))
    with pytest.raises(RegistryUnreachable) as caught:
        client.manifest("1")
    assert len(lines) == POLICY.tries - 1 and "try 4 of 5" in lines[-1]
    message = str(caught.value)
    assert "registry 127.0.0.1:9 is unreachable" in message
    assert "for http://127.0.0.1:9/v2/team/x/manifests/1 (after 5 tries)" in message


def test_an_upload_to_a_registry_that_never_answers_fails_within_the_budget() -> None:
    """Each request plays a 60 s timeout (the clock moved on, then no usable answer). The HEAD
    asking whether the failed upload's blob arrived is part of the upload's try: counted in
    the run's budget, not retried on its own past it, its error not the upload's."""
    clocks: list[Clock] = []

    def route(method: str, path: str) -> Reply:
        clocks[0].now += TIMEOUT
        return 504, {}, b""

    server, clock, _lines, client = serve(route)
    clocks.append(clock)
    try:
        with pytest.raises(RegistryUnreachable) as caught:
            client.upload_blob(b"layer")
    finally:
        server.close()
    assert [method for method, _path, _auth in server.seen] == ["POST", "HEAD"]
    assert clock.now <= POLICY.budget and "/v2/team/x/blobs/uploads/" in str(caught.value)


def test_a_referrers_answer_cut_short_is_asked_for_again() -> None:
    """The referrers API's index has no digest to check: a body cut short was parsed as it
    was, a malformed index, never asked for again."""
    digest = "sha256:" + "1" * 64
    entry = {"digest": digest, "size": 10, "artifactType": "x"}
    listing = json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode()
    sent: list[str] = []

    def answer(handler) -> None:  # type: ignore[no-untyped-def]
        sent.append(handler.path)
        handler.send_response(200)
        handler.send_header("Content-Type", INDEX)
        handler.send_header("Content-Length", str(len(listing)))
        handler.end_headers()
        handler.wfile.write(listing[: len(listing) // 2] if len(sent) == 1 else listing)
        handler.close_connection = True

    server, _clock, lines, client = serve(lambda method, path: (500, {}, b""))
    server.httpd.RequestHandlerClass.do_GET = answer  # type: ignore[attr-defined]
    try:
        found = api_listing(client, "sha256:" + "2" * 64)
    finally:
        server.close()
    assert found == (Referrer(digest, 10, "x"),) and len(sent) == 2
    assert len(lines) == 1 and "a body cut short" in lines[0]


def test_no_upload_state_nor_signature_in_what_the_operator_sees() -> None:
    """An upload Location's query (the registry's signed `_state`; a storage signature and
    session token on other registries) is in no retry line, record or error."""
    secret = "_state=SIGNED-STATE&X-Amz-Security-Token=TOKEN"

    def route(method: str, path: str) -> Reply:
        if method == "POST":
            return 202, {"Location": f"/v2/team/x/blobs/uploads/s0?{secret}"}, b""
        return (404 if method == "HEAD" else 500), {}, b""

    server, _clock, lines, client = serve(route)
    try:
        with pytest.raises(RegistryUnreachable) as caught:
            client.upload_blob(b"layer")
    finally:
        server.close()
    assert any("_state" in path for _method, path, _auth in server.seen)  # it was sent
    seen = "\n".join([str(caught.value), *lines, json.dumps(client.retries.to_list())])
    assert "uploads/s0" in str(caught.value)
    assert not any(word in seen for word in ("_state", "SIGNED", "TOKEN", "Amz"))


def test_a_url_shown_has_no_query_nor_password() -> None:
    signed = "https://user:pw@bucket.s3.example/blobs/ab?X-Amz-Signature=s&X-Amz-Credential=c"
    assert shown(signed) == "https://bucket.s3.example/blobs/ab"
    assert (
        shown("http://127.0.0.1:5000/v2/x/manifests/1") == "http://127.0.0.1:5000/v2/x/manifests/1"
    )


def test_a_401_on_a_patch_midway_renews_the_token_and_the_session_goes_on(tmp_path) -> None:
    """A token that expires between two PATCHes of a chunked upload: the registry refused the
    second before touching the session (auth comes first), so the same PATCH is sent again
    with a new token to the same session: no chunk lost or doubled, no new session."""
    uploads, issued, patched = Uploads(), [], []

    def answer(handler) -> None:  # type: ignore[no-untyped-def]
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        auth = handler.headers.get("Authorization", "")
        realm = f'Bearer realm="http://127.0.0.1:{server.port}/token",service="x"'
        if handler.path.startswith("/token"):
            issued.append(f"t{len(issued)}")
            status, headers, reply = 200, {}, json.dumps({"token": issued[-1]}).encode()
        elif not auth or (auth == "Bearer t0" and handler.command == "PATCH" and patched):
            status, headers, reply = 401, {"WWW-Authenticate": realm}, b""  # t0 expired
        else:
            patched.extend([auth] if handler.command == "PATCH" else [])
            status, headers, reply = uploads.route(handler.command, handler.path, body)
        handler.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(reply))}.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(reply)

    server, clock, lines, client = serve(lambda method, path: (500, {}, b""))
    for verb in ("GET", "HEAD", "POST", "PUT", "PATCH"):
        setattr(server.httpd.RequestHandlerClass, f"do_{verb}", answer)
    digest, path = chunked_upload(server, client, tmp_path)
    assert uploads.stored[digest] == path.read_bytes() and list(uploads.sessions) == ["s0"]
    assert issued == ["t0", "t1"] and patched[:2] == ["Bearer t0", "Bearer t1"]
    assert clock.slept == [] and lines == []


def test_a_resolver_saying_try_again_is_a_fault_worth_another_try() -> None:
    """EAI_AGAIN (a loaded or restarting resolver) is retried like any unanswered request; a
    name that does not exist (EAI_NONAME) is not: seconds will not change it."""
    import socket
    import urllib.error

    from builder.retry import unresolvable

    again = urllib.error.URLError(socket.gaierror(socket.EAI_AGAIN, "Temporary failure"))
    gone = urllib.error.URLError(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert (unresolvable(again), unresolvable(gone)) == (False, True)
