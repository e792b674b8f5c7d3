"""An extras layer the tool writes itself: same wheels, same bytes; laid out as pip --target."""

from __future__ import annotations

import gzip
import hashlib
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest
from support.unpack import unpack
from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.errors import UserError
from builder.files import sha256_of
from builder.inspect import wheels as wheels_module
from builder.inspect.wheel_reader import inspect_wheel
from builder.inspect.wheels import WheelInspection
from builder.layers import gzipped as gzipped_module
from builder.layers import layer as layer_module
from builder.layers.gzipped import gzipped, spans_of
from builder.layers.layer import (
    ZIP_EPOCH,
    Layer,
    LayerWheels,
    lock_hash,
    source_date_epoch,
    wheels_layer,
)

ROOT = "/app/deps-extra"


def layer_of(files: list[Path], cache: Cache) -> Layer:
    """The layer of `files` as builder.layers.extras writes one group: its wheels by sha256."""
    return wheels_layer(LayerWheels(tuple((sha256_of(f), f) for f in files)), ROOT, cache)


def wheels(tmp_path: Path) -> list[Path]:
    pure = make_wheel(
        tmp_path / "w",
        "alpha",
        "1.0",
        "py3-none-any",
        {"alpha/__init__.py": b"VALUE = 42\n", "alpha/sub/data.txt": b"x"},
        top_level=["alpha"],
    )
    # A wheel with a .data/purelib part, a script and a console entry point.
    beta = tmp_path / "w" / "beta-2.0-py3-none-any.whl"
    plain = make_wheel(tmp_path / "b", "beta", "2.0", "py3-none-any", {})
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(beta, "w") as out:
        for info in src.infolist():
            out.writestr(info, src.read(info))
        out.writestr("beta-2.0.data/purelib/beta.py", b"def main():\n    return 0\n")
        out.writestr("beta-2.0.data/scripts/beta-run", b"#!python\nprint('hi')\n")
        out.writestr("beta-2.0.data/headers/beta.h", b"/* dropped */\n")
        out.writestr("beta-2.0.dist-info/entry_points.txt", "[console_scripts]\nbeta=beta:main\n")
    return [pure, beta]


def members(layer_path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(layer_path, "r:") as tar:
        return tar.getmembers()


def test_two_cold_builds_with_separate_caches_are_byte_identical(tmp_path: Path) -> None:
    files = wheels(tmp_path)
    first = layer_of(files, Cache(tmp_path / "c1"))
    # Other day, other order on disk: copies with fresh mtimes in a different directory.
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    copies = []
    for wheel in files:
        copy = elsewhere / wheel.name
        copy.write_bytes(wheel.read_bytes())
        copies.append(copy)
    second = layer_of(copies, Cache(tmp_path / "c2"))
    assert first.diff_id == second.diff_id
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.diff_id == "sha256:" + hashlib.sha256(first.path.read_bytes()).hexdigest()
    assert first.size == first.path.stat().st_size
    # The registry blob: the same gzip bytes from either cache, and it unpacks to the tar.
    blob = gzipped(first.path, first.diff_id, Cache(tmp_path / "c1"))
    assert blob == gzipped(first.path, first.diff_id, Cache(tmp_path / "c1"))  # cached
    assert blob.digest == gzipped(second.path, second.diff_id, Cache(tmp_path / "c2")).digest
    assert blob.digest == "sha256:" + hashlib.sha256(blob.path.read_bytes()).hexdigest()
    assert gzip.decompress(blob.path.read_bytes()) == first.path.read_bytes()
    # Cached by the wheels' sha256: a third call with no wheel at hand returns the cached tar.
    gone = LayerWheels(tuple((sha256_of(f), tmp_path / "gone" / f.name) for f in files))
    assert wheels_layer(gone, ROOT, Cache(tmp_path / "c1")) == first
    lock = "alpha==1.0 --hash=sha256:aa\nbeta==2.0 --hash=sha256:bb\n"
    assert lock_hash(lock) != lock_hash(lock + "gamma==1\n")


def test_layout_is_pip_target_with_fixed_metadata(tmp_path: Path) -> None:
    files = wheels(tmp_path)
    layer = layer_of(files, Cache(tmp_path / "c"))
    entries = members(layer.path)
    names = [entry.name for entry in entries]
    directories = [entry.name for entry in entries if entry.isdir()]
    files_in_order = [entry.name for entry in entries if not entry.isdir()]
    assert names[: len(directories)] == sorted(directories)  # directories first, sorted
    assert names[:2] == ["app", "app/deps-extra"]
    # what importing the top-level modules reads leads (builder.layers.first_reads), then sorted
    assert files_in_order[:2] == ["app/deps-extra/alpha/__init__.py", "app/deps-extra/beta.py"]
    assert files_in_order[2:] == sorted(files_in_order[2:])
    assert {e.mtime for e in entries} == {layer.source_date_epoch}
    assert layer.source_date_epoch == source_date_epoch(files) > ZIP_EPOCH
    assert {(e.uid, e.gid, e.uname, e.gname) for e in entries} == {(0, 0, "", "")}
    by_name = {e.name: e for e in entries}
    for entry in entries:
        assert entry.mode == (0o755 if entry.isdir() or "/bin/" in entry.name else 0o644), (
            entry.name
        )
    assert "app/deps-extra/beta.py" in by_name  # .data/purelib at the root
    assert "app/deps-extra/alpha/sub/data.txt" in by_name
    assert not [n for n in names if "headers" in n or n.endswith(".h") or ".data/" in n]
    assert not [n for n in names if n.endswith(".pyc")]
    with tarfile.open(layer.path, "r:") as tar:

        def read(name: str) -> bytes:
            handle = tar.extractfile(name)
            assert handle is not None, name
            return handle.read()

        assert read("app/deps-extra/bin/beta-run").startswith(b"#!/usr/bin/env python3\n")
        assert b"from beta import main" in read("app/deps-extra/bin/beta")
        assert read("app/deps-extra/alpha-1.0.dist-info/INSTALLER") == b"build-sandbox-image\n"
        record = read("app/deps-extra/beta-2.0.dist-info/RECORD").decode()
    assert "\nbeta.py," in record and "bin/beta-run,sha256=" in record
    assert "beta-2.0.dist-info/RECORD,," in record


def test_the_epoch_is_read_once_per_wheel_and_a_stale_record_is_not_trusted(
    tmp_path: Path,
) -> None:
    """A wheel's newest date is part of its inspection, cached by sha256: the plan's epoch
    (assemble.assemble.plan_epoch) is what the zips say, and a second plan opens no zip for it.
    A record without the date (an older schema, or a damaged one) is read again, not used."""
    files = wheels(tmp_path)
    cache = Cache(tmp_path / "c")
    first = [inspect_wheel(f, sha256_of(f), cache) for f in files]

    def again() -> list[WheelInspection]:
        return [inspect_wheel(f, one.sha256, cache) for f, one in zip(files, first, strict=True)]

    assert max([ZIP_EPOCH, *(one.newest for one in first)]) == source_date_epoch(files)
    moved = [f.rename(f.with_suffix(".moved")) for f in files]  # no zip left to open
    assert again() == first
    for was, now in zip(files, moved, strict=True):
        now.rename(was)
    stale = {**first[0].to_dict(), "newest": "damaged"}
    cache.put_record(wheels_module.RECORD_KIND, first[0].sha256, stale)
    older = {k: v for k, v in first[1].to_dict().items() if k != "newest"}
    cache.put_record(wheels_module.RECORD_KIND, first[1].sha256, older)
    assert again() == first


def test_the_unpacked_layer_imports(tmp_path: Path) -> None:
    layer = layer_of(wheels(tmp_path), Cache(tmp_path / "c"))
    unpack(layer.path, tmp_path / "root")
    site = tmp_path / "root" / "app" / "deps-extra"
    code = (
        "import alpha, beta; from importlib.metadata import version;"
        " print(alpha.VALUE, version('beta'))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.split() == ["42", "2.0"]


def test_gzip_is_one_member_with_a_full_flush_at_each_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gzipped_module, "SPAN", 1000)  # several spans from a small tar
    layer = layer_of(wheels(tmp_path), Cache(tmp_path / "c"))
    blob = gzipped(layer.path, layer.diff_id, Cache(tmp_path / "c"))
    data = blob.path.read_bytes()
    assert data[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no name, mtime 0
    reader = zlib.decompressobj(31)  # one gzip member: nothing follows its trailer
    assert reader.decompress(data) == layer.path.read_bytes() and reader.eof
    assert not reader.unused_data
    assert len(blob.spans) == -(-layer.size // 1000) and blob.spans[0] == 10
    for index, start in enumerate(blob.spans):  # each span inflates on its own from its offset
        assert data[start - 4 : start] == b"\x00\x00\xff\xff" or start == 10  # a full flush
        piece = zlib.decompressobj(-15).decompress(data[start:])
        assert piece[:1000] == layer.path.read_bytes()[index * 1000 : (index + 1) * 1000]
    with tarfile.open(blob.path, "r:gz") as tar:
        assert "app/deps-extra/beta.py" in tar.getnames()
    assert spans_of(blob.digest, Cache(tmp_path / "c")) == blob  # found again by its digest
    assert spans_of("sha256:" + "0" * 64, Cache(tmp_path / "c")) is None  # not the tool's


def lying_wheel(tmp_path: Path, declared: int) -> Path:
    """A wheel whose stored `alpha/blob.bin` (100 bytes) claims `declared` bytes in the zip."""
    files = {"alpha/x.py": b"#" * 1000}  # after the blob: its producer is busy when that fails
    wheel = make_wheel(tmp_path / "lie", "alpha", "1.0", "py3-none-any", files)
    with zipfile.ZipFile(wheel, "a", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("alpha/blob.bin", b"x" * 100)
    data = bytearray(wheel.read_bytes())
    name = b"alpha/blob.bin"
    # the uncompressed size in the local header (offset 22) and the central directory (24)
    for signature, name_at, size_at in ((b"PK\x03\x04", 30, 22), (b"PK\x01\x02", 46, 24)):
        start = data.find(signature)
        while start >= 0:
            if data[start + name_at : start + name_at + len(name)] == name:
                struct.pack_into("<I", data, start + size_at, declared)
            start = data.find(signature, start + 4)
    wheel.write_bytes(bytes(data))
    return wheel


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_member_inflating_to_another_size_than_declared_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streamed: bool
) -> None:
    if streamed:  # every member streams, three bytes at a time through a one-chunk queue
        for name, value in (("STREAMED", 1), ("CHUNK", 3), ("QUEUED", 1)):
            monkeypatch.setattr(layer_module, name, value)
    cache = Cache(tmp_path / "c")
    wheel = lying_wheel(tmp_path, 200)
    expected = "alpha-1.0-py3-none-any.whl: alpha/blob.bin inflates to 100 bytes, not the 200"
    with pytest.raises(UserError, match=expected):
        layer_of([wheel], cache)
    assert not list(cache.root.glob(".layer-*")), "a refused layer left its temporary file"


def test_large_members_stream_into_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = wheels(tmp_path)
    whole = layer_of(files, Cache(tmp_path / "c1"))
    monkeypatch.setattr(layer_module, "STREAMED", 1)  # every member above one byte streams,
    monkeypatch.setattr(layer_module, "CHUNK", 3)  # three bytes at a time
    monkeypatch.setattr(layer_module, "QUEUED", 1)  # through a queue of one chunk
    streamed = layer_of(files, Cache(tmp_path / "c2"))
    assert streamed.diff_id == whole.diff_id
    assert streamed.path.read_bytes() == whole.path.read_bytes()
