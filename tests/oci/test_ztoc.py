"""The ztoc and SOCI index the tool writes from its own gzip layers: read back, every file's
bytes come out of its spans as they are in the tar; the same layer gives the same bytes."""

from __future__ import annotations

import io
import json
import os
import tarfile
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.errors import UserError
from builder.files import sha256_of
from builder.layers import gzipped as gzipped_module
from builder.layers.gzipped import gzipped
from builder.layers.layer import LayerWheels, wheels_layer
from builder.oci import ztoc, ztoc_read
from builder.oci.v1 import DOCKER_LAYER, OCI_MANIFEST, Descriptor, digest_of

SPAN = 64 << 10  # small spans: a few files cross a boundary, several spans per layer


def a_layer(tmp_path: Path, cache: Cache) -> tuple[Path, Path, tuple[int, ...]]:
    """A layer of a wheel with small files, a long name (a PAX record) and incompressible
    data spanning several spans; its tar, gzip blob and span offsets."""
    files = {f"pkg/m{index:03d}.py": f"X = {index}\n".encode() * 300 for index in range(40)}
    files["pkg/blob.bin"] = os.urandom(300 << 10)
    files["pkg/" + "long_" * 30 + ".py"] = b"LONG = 1\n"
    wheel = make_wheel(tmp_path / "w", "pkg", "1.0", "py3-none-any", files, top_level=["pkg"])
    layer = wheels_layer(LayerWheels(((sha256_of(wheel), wheel),)), "/app/deps-extra", cache)
    blob = gzipped(layer.path, layer.diff_id, cache)
    return layer.path, blob.path, blob.spans


def inflate_from(blob: bytes, point: ztoc.Checkpoint, length: int, skip: int) -> bytes:
    """What soci's reader does: raw inflate from a checkpoint with its window as dictionary."""
    reader = zlib.decompressobj(-15, zdict=point.window)
    out = reader.decompress(blob[point.compressed :], skip + length)
    return out[skip : skip + length]


@pytest.fixture
def small_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gzipped_module, "SPAN", SPAN)


@pytest.mark.usefixtures("small_spans")
def test_every_file_reads_back_through_its_checkpoint(tmp_path: Path) -> None:
    tar, blob, spans = a_layer(tmp_path, Cache(tmp_path / "c"))
    data = ztoc.ztoc_bytes(blob, SPAN, spans)
    read = ztoc_read.read_ztoc(data)
    tar_bytes, blob_bytes = tar.read_bytes(), blob.read_bytes()
    assert read.version == "0.9" and read.build_tool == ztoc.BUILD_TOOL
    assert read.compressed_size == len(blob_bytes)
    assert read.span_size == SPAN and len(read.checkpoints) == len(spans) >= 5
    assert len(read.span_digests) == len(spans)
    with tarfile.open(tar) as archive:
        members = archive.getmembers()
        assert [e.name.rstrip("/") for e in read.files] == [m.name for m in members]
        regular = [(m, archive.extractfile(m)) for m in members if m.isfile()]
        expected = {m.name: f.read() for m, f in regular if f is not None}
    assert any(len(dict(e.xattrs).get("path", "")) > 100 for e in read.files)  # the PAX name
    crossing = 0
    for entry in read.files:
        if entry.type != "reg":
            continue
        first = max(i for i, p in enumerate(read.checkpoints) if p.uncompressed <= entry.offset)
        point = read.checkpoints[first]
        got = inflate_from(blob_bytes, point, entry.size, entry.offset - point.uncompressed)
        assert got == tar_bytes[entry.offset : entry.offset + entry.size]
        assert got == expected[entry.name]
        crossing += (entry.offset + entry.size) // SPAN != entry.offset // SPAN
    assert crossing >= 1  # the 300 KiB file spans several


@pytest.mark.usefixtures("small_spans")
def test_spans_digests_windows_and_archive_size(tmp_path: Path) -> None:
    tar, blob, spans = a_layer(tmp_path, Cache(tmp_path / "c"))
    read = ztoc_read.read_ztoc(ztoc.ztoc_bytes(blob, SPAN, spans))
    blob_bytes, tar_bytes = blob.read_bytes(), tar.read_bytes()
    ends = [*spans[1:], len(blob_bytes)]
    for index, (start, end) in enumerate(zip(spans, ends, strict=True)):
        assert read.span_digests[index] == digest_of(blob_bytes[start:end])
        point = read.checkpoints[index]
        assert (point.compressed, point.uncompressed) == (start, index * SPAN)
        before = tar_bytes[max(0, index * SPAN - ztoc.WINDOW) : index * SPAN]
        assert point.window == bytes(ztoc.WINDOW - len(before)) + before
    # soci counts the archive up to the two zero blocks (Go's tar reader), not the record padding
    last = read.files[-1]
    assert read.uncompressed_size == last.offset + -(-last.size // 512) * 512 + 1024
    assert read.uncompressed_size <= len(tar_bytes)


def test_the_same_layer_gives_the_same_ztoc_on_another_cache(tmp_path: Path) -> None:
    """The same wheel (its bytes copied elsewhere: a zip's entry times are the wheel's own) gives
    the same layer, blob and ztoc in another cache."""
    _, _, _, _, wheel = _plain(tmp_path, "one")
    copy = tmp_path / "two" / "wheel" / wheel.name
    copy.parent.mkdir(parents=True)
    copy.write_bytes(wheel.read_bytes())
    first = ztoc.ztoc_bytes(*_plain(tmp_path, "one", wheel)[1:4])
    again = ztoc.ztoc_bytes(*_plain(tmp_path, "two", copy)[1:4])
    assert first == again


def _plain(
    tmp_path: Path, name: str, wheel: Path | None = None
) -> tuple[Path, Path, int, tuple[int, ...], Path]:
    """A layer of a small wheel (`wheel`, else a new one): its tar, blob, span size, spans."""
    if wheel is None:
        files = {f"q/m{index}.py": f"Y = {index}\n".encode() * 50 for index in range(20)}
        wheel = make_wheel(tmp_path / name, "q", "1.0", "py3-none-any", files, top_level=["q"])
    cache = Cache(tmp_path / name / "cache")
    layer = wheels_layer(LayerWheels(((sha256_of(wheel), wheel),)), "/app/deps-extra", cache)
    blob = gzipped(layer.path, layer.diff_id, cache)
    return layer.path, blob.path, gzipped_module.SPAN, blob.spans, wheel


def test_the_index_manifest_is_soci_0_4s() -> None:
    layer = Descriptor(DOCKER_LAYER, "sha256:" + "a" * 64, 123)
    index = ztoc.SociIndex((ztoc.LayerZtoc(layer, b"ztoc-bytes"),))
    subject = Descriptor(OCI_MANIFEST, "sha256:" + "b" * 64, 456)
    document = json.loads(index.manifest(subject))
    assert list(document) == ["schemaVersion", "mediaType", "config", "layers", "subject",
                              "annotations"]  # fmt: skip
    assert document["config"] == {
        "mediaType": "application/vnd.amazon.soci.index.v1+json",
        "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        "size": 2,
    }
    assert document["layers"] == [
        {
            "mediaType": "application/octet-stream",
            "digest": digest_of(b"ztoc-bytes"),
            "size": 10,
            "annotations": {
                "com.amazon.soci.image-layer-digest": layer.digest,
                "com.amazon.soci.image-layer-mediaType": DOCKER_LAYER,
            },
        }
    ]
    assert document["subject"] == {"mediaType": OCI_MANIFEST, "digest": subject.digest,
                                   "size": 456}  # fmt: skip
    assert index.blobs() == (b"{}", b"ztoc-bytes")
    assert ztoc.indexed_layers(index.manifest(subject)) == {layer.digest: digest_of(b"ztoc-bytes")}


def test_bad_input_is_one_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a ztoc"):
        ztoc_read.read_ztoc(b"\x08\x00\x00\x00garbage!")
    with pytest.raises(UserError, match="not a SOCI index"):
        ztoc.indexed_layers(b'{"config": {"mediaType": "application/vnd.oci.empty.v1+json"}}')
    with pytest.raises(UserError, match="not a layer tar"):
        ztoc.toc(io.BytesIO(b"\x01" * 1024))
    tar, blob, _, spans, _ = _plain(tmp_path, "bad")
    with pytest.raises(UserError, match="do not start after the gzip header"):
        ztoc.ztoc_bytes(blob, gzipped_module.SPAN, (0, *spans[1:]))
    with pytest.raises(UserError, match="does not read as a gzip tar"):
        ztoc.ztoc_bytes(tar, gzipped_module.SPAN, spans)  # the tar itself is no gzip
    with pytest.raises(UserError, match="fewer spans"):
        ztoc.ztoc_bytes(blob, gzipped_module.SPAN, (*spans, spans[-1] + 1))


@pytest.mark.usefixtures("small_spans")
def test_mismatches_finds_nothing_in_the_layer_and_what_another_layer_changes(
    tmp_path: Path,
) -> None:
    _, blob, spans = a_layer(tmp_path, Cache(tmp_path / "c"))
    read = ztoc_read.read_ztoc(ztoc.ztoc_bytes(blob, SPAN, spans))
    with blob.open("rb") as stream:
        assert ztoc_read.mismatches(read, stream, blob.stat().st_size) == []
    _, other_blob, _, _, _ = _plain(tmp_path, "other")  # another layer's bytes
    with other_blob.open("rb") as stream:
        found = ztoc_read.mismatches(read, stream, other_blob.stat().st_size)
    assert any("compressed size" in line for line in found)
    assert any("fewer spans" in line for line in found)  # one span: the other layer is small
    wrong = [
        (replace(read, span_digests=read.span_digests[::-1]), "span digests"),
        (replace(read, files=read.files[:-1]), "file table differs"),
        (replace(read, checkpoints=(*read.checkpoints[1:], read.checkpoints[0])), "windows"),
    ]
    for ztoc_value, said in wrong:
        with blob.open("rb") as stream:
            found = ztoc_read.mismatches(ztoc_value, stream, blob.stat().st_size)
        assert any(said in line for line in found), (said, found)
    data = bytearray(blob.read_bytes())
    data[spans[1] + 100] ^= 0xFF  # one flipped bit in the second span
    with io.BytesIO(bytes(data)) as stream:
        found = ztoc_read.mismatches(read, stream, len(data))
    assert found and not any("compressed size" in line for line in found)


@pytest.mark.usefixtures("small_spans")
def test_checkpoints_are_where_inflating_may_start(tmp_path: Path) -> None:
    """Each checkpoint of the tool's gzip inflates alone to its span of the tar; one moved by a
    byte into its deflate data does not, though the spans would hash the same way."""
    _, blob, spans = a_layer(tmp_path, Cache(tmp_path / "c"))
    read = ztoc_read.read_ztoc(ztoc.ztoc_bytes(blob, SPAN, spans))
    assert ztoc_read.flushed_at(blob, read.checkpoints)
    points = list(read.checkpoints)
    points[2] = replace(points[2], compressed=points[2].compressed + 1)
    assert not ztoc_read.flushed_at(blob, points)
    points = list(read.checkpoints)
    points[1] = replace(points[1], uncompressed=points[1].uncompressed + 1)
    assert not ztoc_read.flushed_at(blob, points)


def test_names_and_pax_values_that_are_not_utf8_travel_as_their_bytes(tmp_path: Path) -> None:
    """A tar entry whose name is not UTF-8 and a binary capability xattr (as a saved base may
    hold) give a ztoc whose file table reads back equal to the tar's: not an encoding error."""
    tar_path = tmp_path / "layer.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("usr/bin/caf\udce9")  # the byte 0xe9, as tarfile keeps it
        info.size = 3
        info.pax_headers = {"SCHILY.xattr.security.capability": "\x01\udcff\x02"}
        archive.addfile(info, io.BytesIO(b"abc"))
    diff_id = "sha256:" + sha256_of(tar_path)
    blob = gzipped(tar_path, diff_id, Cache(tmp_path / "c"))
    data = ztoc.ztoc_bytes(blob.path, blob.span_size, blob.spans)
    read = ztoc_read.read_ztoc(data)
    assert [entry.name for entry in read.files] == ["usr/bin/caf\udce9"]
    with blob.path.open("rb") as stream:
        assert ztoc_read.mismatches(read, stream, blob.size) == []


def test_no_span_starts_past_the_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans small enough that one starts in the tar's record padding: soci would size it
    negative, so the ztoc leaves it to the span before, which runs to the blob's end."""
    monkeypatch.setattr(gzipped_module, "SPAN", 1024)
    tar, blob, spans = a_layer(tmp_path, Cache(tmp_path / "c"))
    read = ztoc_read.read_ztoc(ztoc.ztoc_bytes(blob, 1024, spans))
    assert len(read.checkpoints) < len(spans)  # the padding held at least one span start
    assert all(point.uncompressed < read.uncompressed_size for point in read.checkpoints)
    assert read.uncompressed_size < tar.stat().st_size
    assert ztoc_read.flushed_at(blob, read.checkpoints)
    with blob.open("rb") as stream:
        assert ztoc_read.mismatches(read, stream, blob.stat().st_size) == []
