"""A ztoc read back, and a layer checked against it: what verify and the tests rely on.

`read_ztoc` parses the flatbuffers builder.oci.ztoc writes (or soci writes) with the
`flatbuffers` library's table reader; `mismatches` streams a layer's gzip bytes once
(builder.oci.ztoc.read_layer: each span hashed and each window kept while the tar inside is
read) and says where the ztoc and the layer disagree.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import flatbuffers
from flatbuffers import number_types
from flatbuffers.table import Table

from builder.digest import Readable
from builder.errors import UserError
from builder.oci.ztoc import WINDOW, Checkpoint, FileEntry, Ztoc, read_layer


def read_ztoc(data: bytes) -> Ztoc:
    """A ztoc's bytes read back; a malformed one is one UserError."""
    try:
        root = Table(bytearray(data), flatbuffers.encode.Get(flatbuffers.packer.uoffset, data, 0))
        files = tuple(_read_entry(table) for table in _tables(root, 4, 0))
        info = _table(root, 5)
        raw = _bytes(info, 3)
        count, span_size = struct.unpack_from("<iq", raw, 0)
        size = 17 + WINDOW
        if len(raw) != 12 + count * size:
            raise ValueError("checkpoints of the wrong size")
        points = []
        for index in range(count):
            at = 12 + index * size
            compressed, uncompressed, _bits = struct.unpack_from("<qqB", raw, at)
            points.append(Checkpoint(compressed, uncompressed, raw[at + 17 : at + size]))
        return Ztoc(
            version=_string(root, 0),
            build_tool=_string(root, 1),
            compressed_size=_int64(root, 2),
            uncompressed_size=_int64(root, 3),
            files=files,
            span_size=span_size,
            checkpoints=tuple(points),
            span_digests=tuple(_strings(info, 2)),
        )
    except (ValueError, IndexError, TypeError, struct.error, UnicodeDecodeError) as error:
        raise UserError(f"not a ztoc: {error}") from None


def _read_entry(table: Table) -> FileEntry:
    xattrs = tuple((_string(x, 0), _string(x, 1)) for x in _tables(table, 13))
    return FileEntry(
        name=_string(table, 0),
        type=_string(table, 1),
        offset=_int64(table, 2),
        size=_int64(table, 3),
        linkname=_string(table, 4),
        mode=_int64(table, 5),
        uid=_number(table, 6, number_types.Uint32Flags),
        gid=_number(table, 7, number_types.Uint32Flags),
        uname=_string(table, 8),
        gname=_string(table, 9),
        mod_time=_string(table, 10),
        devmajor=_int64(table, 11),
        devminor=_int64(table, 12),
        xattrs=xattrs,
    )


def _field(table: Table, index: int) -> int:
    return int(table.Offset(4 + 2 * index))


def _string(table: Table, index: int) -> str:
    at = _field(table, index)
    return table.String(at + table.Pos).decode(errors="surrogateescape") if at else ""


def _number(table: Table, index: int, flags: type[number_types.NumberTypeFlags]) -> int:
    at = _field(table, index)
    return int(table.Get(flags, at + table.Pos)) if at else 0


def _int64(table: Table, index: int) -> int:
    return _number(table, index, number_types.Int64Flags)


def _table(table: Table, index: int) -> Table:
    at = _field(table, index)
    if not at:
        raise ValueError(f"field {index} missing")
    return Table(table.Bytes, table.Indirect(at + table.Pos))


def _vector(table: Table, index: int) -> tuple[int, int]:
    """A vector field's start and length (0, 0 when absent)."""
    at = _field(table, index)
    return (table.Vector(at), table.VectorLen(at)) if at else (0, 0)


def _tables(table: Table, index: int, inner: int | None = None) -> list[Table]:
    """The tables of a vector field (of the table in field `index`'s field `inner`)."""
    if inner is not None:
        table, index = _table(table, index), inner
    start, length = _vector(table, index)
    return [Table(table.Bytes, table.Indirect(start + 4 * i)) for i in range(length)]


def _strings(table: Table, index: int) -> list[str]:
    start, length = _vector(table, index)
    return [table.String(start + 4 * i).decode(errors="surrogateescape") for i in range(length)]


def _bytes(table: Table, index: int) -> bytes:
    start, length = _vector(table, index)
    return bytes(table.Bytes[start : start + length])


def mismatches(ztoc: Ztoc, blob: Readable, blob_size: int) -> list[str]:
    """How the layer `blob` (its gzip bytes, streamed once) differs from what `ztoc` says of
    it: both sizes, each span's digest and window, and the file table (name, type, offset, size,
    link, mode, owner, mtime, PAX records) against the tar inside; empty when they agree."""
    found: list[str] = []
    if ztoc.compressed_size != blob_size:
        found.append(f"compressed size {ztoc.compressed_size}, the layer has {blob_size}")
    spans = [point.compressed for point in ztoc.checkpoints]
    try:
        read = read_layer(blob, ztoc.span_size, spans)
    except UserError as error:
        return [*found, str(error)]
    if read.tar_size != ztoc.uncompressed_size:
        found.append(f"uncompressed size {ztoc.uncompressed_size}, the tar has {read.tar_size}")
    if read.span_digests != ztoc.span_digests:
        found.append("span digests differ from the layer's bytes")
    if read.windows != tuple(point.window for point in ztoc.checkpoints):
        found.append("checkpoint windows differ from the layer's tar")
    if ztoc.files != read.files:
        theirs = {entry.name: entry for entry in read.files}
        differing = [e.name for e in ztoc.files if theirs.get(e.name) != e]
        extra = len(read.files) - len(ztoc.files)
        found.append(f"file table differs: {differing[:3]} ({extra:+d} entries in the layer)")
    return found


def flushed_at(blob_path: Path, checkpoints: Sequence[Checkpoint]) -> bool:
    """Whether inflating may start at each checkpoint of the gzip layer `blob_path`: raw
    deflate from its compressed offset, with its window as the dictionary, gives exactly the
    tar's bytes from its uncompressed offset to the next checkpoint's. A point inside a deflate
    block, or one a bit offset away, gives an error or other bytes; `mismatches` alone would
    not see it, as it hashes the spans at whatever offsets the ztoc names."""
    points = list(checkpoints)
    if not points or points[0].uncompressed != 0:
        return False
    lengths = [b.uncompressed - a.uncompressed for a, b in itertools.pairwise(points)]
    if any(length <= 0 for length in lengths):
        return False
    try:
        with gzip.open(blob_path, "rb") as tar:
            expected = [hashlib.sha256(tar.read(length)).digest() for length in lengths]
            expected.append(hashlib.sha256(tar.read()).digest())
        with blob_path.open("rb") as blob:
            for index, point in enumerate(points):
                blob.seek(point.compressed)
                end = points[index + 1].compressed if index + 1 < len(points) else None
                if end is not None and end <= point.compressed:
                    return False
                data = blob.read(end - point.compressed) if end is not None else blob.read()
                inflater = zlib.decompressobj(-zlib.MAX_WBITS, zdict=point.window)
                limit = lengths[index] if index < len(lengths) else 0
                out = inflater.decompress(data, limit + 1) if limit else inflater.decompress(data)
                if hashlib.sha256(out).digest() != expected[index]:
                    return False
    except (OSError, EOFError, zlib.error):
        return False
    return True
