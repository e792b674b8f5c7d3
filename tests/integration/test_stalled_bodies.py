"""A registry that trickles bytes is a fault, tried again, instead of a run held for days.

A read's 60 s timeout bounds each receive, not a transfer: a registry (or an index) sending a
byte every 59 s would keep every read alive. builder.retry's `SteadyBody` counts what each
receive brings and fails a body moving less than the policy's floor in a window (`Stalled`, a
timeout), which the run's policy then tries again.

The first tests read a scripted body against a scripted clock; the others read from the real
local registry through the fault proxy (tests/support/faultproxy.py), whose `trickle` sends a
body 16 bytes at a time, with a policy whose window is half a second.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from support.faultproxy import TRICKLE, FaultProxy, Plan, Rule
from support.machine import Registry

from builder.credentials import Credentials
from builder.errors import RegistryUnreachable
from builder.oci import transport
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.v1 import digest_of
from builder.retry import Policy, Retries, Stalled, SteadyBody

POLICY = Policy(stall_window=10.0, stall_floor=100)


class ScriptedBody:
    """A response whose receives bring `pieces`, each `seconds` after the one before."""

    def __init__(self, pieces: list[bytes], clock: list[float], seconds: float) -> None:
        self.pieces = pieces
        self.clock = clock
        self.seconds = seconds
        self.asked: list[int] = []

    def read1(self, size: int) -> bytes:
        self.asked.append(size)
        if not self.pieces:
            return b""
        self.clock[0] += self.seconds
        piece = self.pieces.pop(0)
        assert len(piece) <= size, "a receive never brings more than asked"
        return piece


def steady(pieces: list[bytes], seconds: float) -> tuple[SteadyBody, ScriptedBody]:
    clock = [0.0]
    response = ScriptedBody(pieces, clock, seconds)
    return SteadyBody(response, POLICY, lambda: clock[0]), response


def test_a_body_trickling_below_the_floor_stalls() -> None:
    body, _ = steady([b"x" * 9] * 100, seconds=1.0)  # 9 bytes a second: 90 in a window
    with pytest.raises(Stalled, match=r"^stalled: 90 bytes in 10 s$"):
        body.read(1000)
    assert isinstance(Stalled("x"), TimeoutError)  # what every caller already takes for a fault


def test_a_body_at_the_floor_is_read_whole() -> None:
    body, response = steady([b"y" * 11] * 30, seconds=1.0)  # 110 bytes in each window
    assert body.read() == b"y" * 330
    assert response.asked[-1] > 0  # read to the end: until a receive brought nothing


def test_a_body_that_slows_down_midway_stalls_in_its_own_window() -> None:
    fast = [b"a" * 1000] * 10  # a window well over the floor
    body, _ = steady(fast + [b"b"] * 20, seconds=1.0)
    with pytest.raises(Stalled, match=r"^stalled: 10 bytes in 10 s$"):
        body.read()


def test_time_the_caller_spends_between_reads_is_no_stall() -> None:
    """An upload of another registry's blob sends each chunk it read before reading on: a
    minute spent sending is not the source stalling."""
    body, response = steady([b"z" * 10] * 6, seconds=0.5)  # 20 bytes a second while reading
    for _ in range(3):
        assert body.read(20) == b"z" * 20
        response.clock[0] += 100.0  # the caller's own work between reads
    assert body.read() == b""


def test_a_read_keeps_a_files_meaning() -> None:
    body, response = steady([b"abc", b"de", b"fgh"], seconds=0.0)
    assert body.read(5) == b"abcde"  # size bytes, across receives
    assert response.asked == [5, 2]  # each receive asks only for what is still wanted
    assert body.read(10) == b"fgh"  # fewer only at the end
    assert body.read(10) == b""


# -- the real registry, through the fault proxy ---------------------------------------------------
FAST = Policy(base=0.05, longest=0.2, stall_window=0.5, stall_floor=1024)


@pytest.fixture
def stored(registry: Registry) -> Iterator[tuple[Registry, str, bytes, str]]:
    """A blob and a manifest in a repository of their own, pushed to the registry itself."""
    repository = f"bsi-stall-{uuid.uuid4().hex[:8]}/x"
    login = Credentials(registry.user, registry.password, "test")
    client = RepositoryClient(ImageRef.parse(f"{registry.host}/{repository}"), credentials=login)
    data = os.urandom(8192)
    digest = client.upload_blob(data)
    config = b"{}"
    config_digest = client.upload_blob(config)
    manifest = (
        '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",'
        f'"config":{{"mediaType":"application/vnd.oci.image.config.v1+json",'
        f'"digest":"{config_digest}","size":{len(config)}}},'
        f'"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar",'
        f'"digest":"{digest}","size":{len(data)}}}]}}'
    )
    client.put_manifest("1", manifest.encode(), "application/vnd.oci.image.manifest.v1+json")
    yield registry, repository, data, digest


def through(proxy: FaultProxy, registry: Registry, repository: str) -> RepositoryClient:
    login = Credentials(registry.user, registry.password, "test")
    ref = ImageRef.parse(f"{proxy.host}/{repository}")
    return RepositoryClient(ref, credentials=login, retries=Retries(policy=FAST))


def test_a_blob_trickled_once_is_read_again_and_verified(stored) -> None:
    registry, repository, data, digest = stored
    proxy = FaultProxy(registry.host, Plan(rules=(Rule(r"^GET /v2/.*/blobs/sha256:", TRICKLE),)))
    try:
        client = through(proxy, registry, repository)
        started = time.monotonic()
        read = client.read_blob(digest, lambda blob: blob.read())
        took = time.monotonic() - started
    finally:
        proxy.close()
    assert read == data
    (retried,) = client.retries.record
    assert retried.answer.startswith("stalled: ") and retried.request.startswith("GET ")
    gets = [one.action for one in proxy.log if one.method == "GET" and "/blobs/" in one.path]
    assert sorted(gets) == ["forward", TRICKLE]  # a trickle is logged when the client leaves
    assert took < 30  # the trickle alone would have taken 8192 / 160 = 51 s (30: a busy machine)


def test_a_manifest_trickled_once_is_read_again(stored) -> None:
    registry, repository, _data, _digest = stored
    rule = Rule(r"^GET /v2/.*/manifests/1$", TRICKLE)
    proxy = FaultProxy(registry.host, Plan(rules=(rule,)))
    try:
        client = through(proxy, registry, repository)
        body, digest = client.manifest("1")
    finally:
        proxy.close()
    assert digest == digest_of(body) and b'"layers"' in body
    assert [one.answer.split(":")[0] for one in client.retries.record] == ["stalled"]


def test_a_registry_that_only_trickles_fails_the_request_on_one_line(stored) -> None:
    registry, repository, _data, digest = stored
    rule = Rule(r"^GET /v2/.*/blobs/sha256:", TRICKLE, times=100)
    proxy = FaultProxy(registry.host, Plan(rules=(rule,)))
    try:
        client = through(proxy, registry, repository)
        started = time.monotonic()
        with pytest.raises(RegistryUnreachable) as caught:
            client.read_blob(digest, lambda blob: blob.read())
        took = time.monotonic() - started
    finally:
        proxy.close()
    message = str(caught.value)
    assert "\n" not in message and f"registry {proxy.host} is unreachable: stalled: " in message
    assert message.endswith(f"(after {FAST.tries} tries)")
    assert len(client.retries.record) == FAST.tries - 1
    # each try ends at its stall window, not after a 51 s trickle (+ 30: a busy machine)
    assert took < FAST.tries * (FAST.stall_window + 1) + 30


def test_a_chunk_longer_than_the_timeout_to_send_still_uploads(
    stored, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow uplink: the proxy reads the body at 8 MiB/s, so a 40 MiB chunk takes 5 s to send,
    with a 2 s timeout. Handed to the socket whole, the timeout bounded the whole body and
    every try timed out; sent a block at a time, each block has the timeout to itself."""
    registry, repository, _data, _digest = stored
    monkeypatch.setattr(transport, "TIMEOUT", 2)
    chunk = os.urandom(40 << 20)
    proxy = FaultProxy(registry.host, Plan(read_rate=8 << 20))
    try:
        client = through(proxy, registry, repository)
        started = time.monotonic()
        digest = client.upload_blob(chunk, chunk=len(chunk))
        took = time.monotonic() - started
    finally:
        proxy.close()
    assert digest == digest_of(chunk) and client.retries.record == []
    assert took > 2 * transport.TIMEOUT  # the body really went slower than the timeout
    direct = RepositoryClient(
        ImageRef.parse(f"{registry.host}/{repository}"),
        credentials=Credentials(registry.user, registry.password, "test"),
    )
    assert direct.read_blob(digest, lambda blob: len(blob.read())) == len(chunk)
