"""A ztoc read back, and a layer checked against it: what verify and the tests rely on.

`read_ztoc` parses the flatbuffers builder.oci.ztoc writes (or soci writes) with the
`flatbuffers` library's table reader; `mismatches` streams a layer's gzip bytes once, hashing
each span between the ztoc's checkpoints while the tar inside is read, and says where the
ztoc and the layer disagree.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import struct
import tarfile
import zlib
from collections.abc import Sequence
from typing import Protocol

import flatbuffers
from flatbuffers import number_types
from flatbuffers.table import Table

from builder.errors import UserError
from builder.oci.ztoc import WINDOW, Checkpoint, FileEntry, Ztoc, entry_of


class Readable(Protocol):
    """A stream of a blob's bytes (a file, or a registry's verified blob stream)."""

    def read(self, size: int = -1) -> bytes: ...


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
    return table.String(at + table.Pos).decode() if at else ""


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
    return [table.String(start + 4 * i).decode() for i in range(length)]


def _bytes(table: Table, index: int) -> bytes:
    start, length = _vector(table, index)
    return bytes(table.Bytes[start : start + length])


def mismatches(ztoc: Ztoc, blob: Readable, blob_size: int) -> list[str]:
    """How the layer `blob` (its gzip bytes, streamed once) differs from what `ztoc` says of
    it: sizes, each span's digest, and the file table (name, type, offset, size, link, mode,
    owner, mtime) against the tar inside; empty when they agree."""
    found: list[str] = []
    if ztoc.compressed_size != blob_size:
        found.append(f"compressed size {ztoc.compressed_size}, the layer has {blob_size}")
    spans = _SpanHashing(blob, [point.compressed for point in ztoc.checkpoints])
    inflated = gzip.GzipFile(fileobj=spans, mode="rb")  # type: ignore[call-overload]
    entries: list[FileEntry] = []
    try:
        with tarfile.open(fileobj=inflated, mode="r|") as archive:
            entries.extend(entry_of(info) for info in archive)
        while inflated.read(1 << 20):  # the rest: padding, the trailer, every span's bytes
            pass
    except (tarfile.TarError, OSError, zlib.error, EOFError) as error:
        return [*found, f"the layer does not read as a gzip tar: {error}"]
    if spans.digests() != list(ztoc.span_digests):
        found.append("span digests differ from the layer's bytes")
    if list(ztoc.files) != entries:
        theirs = {entry.name: entry for entry in entries}
        differing = [e.name for e in ztoc.files if theirs.get(e.name) != e]
        extra = len(entries) - len(ztoc.files)
        found.append(f"file table differs: {differing[:3]} ({extra:+d} entries in the layer)")
    return found


class _SpanHashing:
    """A reader that hashes each span's compressed bytes (one span to the next's start) as
    they pass through to the inflater."""

    def __init__(self, inner: Readable, starts: Sequence[int]) -> None:
        self.inner, self.starts, self.position = inner, list(starts), 0
        self.hashes = [hashlib.sha256() for _ in self.starts]

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        at = 0
        while at < len(data):
            index = bisect.bisect_right(self.starts, self.position) - 1  # -1: the gzip header
            following = self.starts[index + 1] if index + 1 < len(self.starts) else None
            take = len(data) - at
            if following is not None:
                take = min(take, following - self.position)
            if index >= 0:
                self.hashes[index].update(data[at : at + take])
            at, self.position = at + take, self.position + take
        return data

    def digests(self) -> list[str]:
        return [f"sha256:{digest.hexdigest()}" for digest in self.hashes]
