"""A layer is gzipped once however many callers ask at once; `ahead` compresses before a push."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.waiting import wait_for

from builder.cache import Cache
from builder.errors import UserError
from builder.layers import gzipped as gzipped_module
from builder.layers.gzipped import Blob, ahead, cached_gzip, gzipped, gzipped_from


def layer_tar(path: Path, size: int = 3 << 20) -> tuple[Path, str]:
    """A tar-sized file of compressible bytes, and its diff ID."""
    data = b"".join(hashlib.sha256(str(i % 997).encode()).digest() for i in range(size // 32))
    path.write_bytes(data)
    return path, "sha256:" + hashlib.sha256(data).hexdigest()


def flock_waiter(root: Path) -> bool:
    """Whether a thread of this process is blocked on a flock of a file under ``root``: a
    waiter's line in /proc/locks (``N: -> FLOCK ADVISORY WRITE pid major:minor:inode ...``)."""
    inodes = set()
    for lock in root.rglob("*.lock"):
        with contextlib.suppress(FileNotFoundError):  # its holder removes it as it leaves
            inodes.add(str(lock.stat().st_ino))
    waiters = [line.split() for line in Path("/proc/locks").read_text().splitlines()]
    return any(
        fields[1:3] == ["->", "FLOCK"]
        and fields[5] == str(os.getpid())
        and fields[6].rsplit(":", 1)[1] in inodes
        for fields in waiters
    )


class Counting:
    """compress_stream, counted; its first call holds until `release` says go on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.original = gzipped_module.compress_stream
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.niceness: list[int] = []
        self.partial_visible: list[Path] = []
        self.cache_root: Path | None = None
        monkeypatch.setattr(gzipped_module, "compress_stream", self)
        monkeypatch.setattr(gzipped_module, "SPAN", 256 << 10)

    def __call__(self, source: Any) -> Iterator[bytes]:
        self.calls += 1
        self.niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        if self.calls == 1:
            self.started.set()
            assert self.release.wait(60)
            if self.cache_root is not None:
                self.partial_visible += self.cache_root.glob("blobs/*/*/layer.tar.gz")
        yield from self.original(source)


def test_concurrent_callers_share_one_compression(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tar, diff_id = layer_tar(tmp_path / "layer.tar")
    counting = Counting(monkeypatch)
    second_looked = threading.Event()

    class Watched(Cache):
        """Says when the second caller has looked in the cache and found nothing yet."""

        def get_record(self, kind: str, key: str) -> Any | None:
            if threading.current_thread().name == "second":
                second_looked.set()
            return super().get_record(kind, key)

    cache = Watched(tmp_path / "cache")
    counting.cache_root = cache.root
    results: dict[str, Blob] = {}

    def call(name: str) -> None:
        results[name] = gzipped(tar, diff_id, cache)

    first = threading.Thread(target=call, args=("first",), name="first")
    second = threading.Thread(target=call, args=("second",), name="second")
    first.start()
    assert counting.started.wait(60)  # the first is compressing ...
    second.start()
    assert second_looked.wait(60)  # ... when the second finds no blob and must wait for it
    wait_for(  # the lock (or, without one, a second compression)
        lambda: counting.calls > 1 or flock_waiter(cache.root / "locks"),
        deadline_s=60,
        what="the second caller to wait on the layer's lock",
    )
    counting.release.set()
    first.join(120)
    second.join(120)
    assert counting.calls == 1
    assert counting.partial_visible == []  # nothing under its final name while being written
    assert results["first"] == results["second"]
    blob = results["first"]
    assert blob.digest == "sha256:" + hashlib.sha256(blob.path.read_bytes()).hexdigest()
    assert gzip.decompress(blob.path.read_bytes()) == tar.read_bytes()
    assert [p.name for p in cache.root.iterdir() if p.name.startswith(".gzip-")] == []


def test_ahead_compresses_for_the_push_inside_the_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tar, diff_id = layer_tar(tmp_path / "layer.tar")
    counting = Counting(monkeypatch)
    cache = Cache(tmp_path / "cache")
    with ahead([(tar, diff_id)], cache):
        assert counting.started.wait(60)  # started before anything in the block asked
        counting.release.set()
        blob = gzipped(tar, diff_id, cache)  # the push: waits for the background one
    assert counting.calls == 1
    assert gzip.decompress(blob.path.read_bytes()) == tar.read_bytes()
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert counting.niceness == [min(19, mine + gzipped_module.AHEAD_NICE)]
    assert mine < 19  # this thread kept its priority: only the background one yielded


def test_ahead_gives_each_layer_its_ztoc_after_its_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a SOCI index to attach, the push finds the layer's ztoc in the cache as well."""
    from builder.layers import soci

    tar = tmp_path / "layer.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as archive:
        archive.add(layer_tar(tmp_path / "data.bin")[0], "app/data.bin")
    diff_id = "sha256:" + hashlib.sha256(tar.read_bytes()).hexdigest()
    cache = Cache(tmp_path / "cache")
    made: list[str] = []

    def ztoc(digest: str, where: Cache) -> bytes | None:
        made.append(digest)
        return soci.layer_ztoc(digest, where)

    with ahead([(tar, diff_id)], cache, then=ztoc):
        blob = gzipped(tar, diff_id, cache)
        wait_for(lambda: made, deadline_s=60, what="the layer's ztoc, inside the block")
    assert made == [blob.digest]

    def never(*_: object) -> bytes:
        raise AssertionError("the push wrote the ztoc again")

    monkeypatch.setattr(soci, "ztoc_bytes", never)
    assert soci.layer_ztoc(blob.digest, cache)  # the push's: from the cache


def test_ahead_on_error_finishes_the_running_one_drops_the_rest_and_leaves_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, first_id = layer_tar(tmp_path / "one.tar")
    second, second_id = layer_tar(tmp_path / "two.tar", 1 << 20)
    counting = Counting(monkeypatch)
    cache = Cache(tmp_path / "cache")
    with (
        pytest.raises(RuntimeError, match="verification failed"),
        ahead([(first, first_id), (second, second_id)], cache),
    ):
        assert counting.started.wait(60)
        counting.release.set()
        raise RuntimeError("verification failed")
    assert counting.calls == 1  # the second layer's compression never started
    assert not any(t.name.startswith("gzip-ahead") for t in threading.enumerate())
    records = list((cache.root / "layer-gzip").glob("*/*.json"))
    assert len(records) == 1  # the first finished into the cache, content-addressed


def test_a_stream_is_compressed_once_and_checked_against_its_diff_id(tmp_path: Path) -> None:
    """`gzipped_from` (a `docker save` member): the source is opened only when no blob is
    cached; bytes that are not the diff ID's are one error naming the layer, and nothing is
    cached or left behind."""
    tar, diff_id = layer_tar(tmp_path / "layer.tar")
    cache = Cache(tmp_path / "cache")
    opened: list[str] = []

    def source() -> Any:
        opened.append(diff_id)
        return tar.open("rb")

    blob = gzipped_from(source, diff_id, cache, "image x: layer 1")
    assert gzipped_from(source, diff_id, cache, "image x: layer 1") == blob
    assert opened == [diff_id]  # the second call found the blob: no save member read
    assert cached_gzip(diff_id, cache) == blob == gzipped(tar, diff_id, cache)
    assert gzip.decompress(blob.path.read_bytes()) == tar.read_bytes()

    other = Cache(tmp_path / "other")
    wrong = "sha256:" + "0" * 64
    with pytest.raises(UserError, match=f"^image x: layer 2 is not {wrong}$"):
        gzipped_from(source, wrong, other, "image x: layer 2")
    assert cached_gzip(wrong, other) is None
    assert list(other.root.glob("blobs/*/*/layer.tar.gz")) == []
    assert [p.name for p in other.root.iterdir() if p.name.startswith(".gzip-")] == []


def test_a_cached_layer_tar_whose_bytes_changed_is_refused(tmp_path: Path) -> None:
    """A kept tar is hashed as it is compressed: a corrupted cache cannot reach a registry."""
    tar, diff_id = layer_tar(tmp_path / "layer.tar")
    tar.write_bytes(tar.read_bytes()[:-1] + b"!")
    with pytest.raises(UserError, match=f"^layer tar {tar} is not {diff_id}$"):
        gzipped(tar, diff_id, Cache(tmp_path / "cache"))


def test_a_record_of_another_shape_is_gzipped_again(tmp_path: Path) -> None:
    """A record written under the same key by a build of the tool before the spans (no span
    offsets) is no blob: the layer is compressed again and the record replaced."""
    tar, diff_id = layer_tar(tmp_path / "layer.tar")
    cache = Cache(tmp_path / "cache")
    blob = gzipped(tar, diff_id, cache)
    key = gzipped_module._key(diff_id)
    cache.put_record("layer-gzip", key, {"digest": blob.digest, "size": blob.size})
    hexdigest = blob.digest.removeprefix("sha256:")
    cache.put_record("layer-spans", hexdigest, {"size": blob.size})
    assert cached_gzip(diff_id, cache) is None
    assert gzipped_module.spans_of(blob.digest, cache) is None
    assert gzipped(tar, diff_id, cache) == blob  # the same bytes again, recorded whole
    assert cached_gzip(diff_id, cache) == blob == gzipped_module.spans_of(blob.digest, cache)
