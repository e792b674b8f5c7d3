"""SOCI ztocs and the SOCI index, as soci-snapshotter 0.4 reads them, from a layer and its spans.

A lazy node (soci-snapshotter) mounts a gzip layer before it is downloaded: a *ztoc* per layer
lists its files (name, type, offset and size in the tar, owner, mode, mtime, PAX records as
xattrs) and where decompression may start ("checkpoints", soci's gzip *zinfo*), so a read of
one file fetches only the spans holding it, by range request. The *SOCI index* is an OCI image
manifest whose config media type is `application/vnd.amazon.soci.index.v1+json` (the empty
`{}` config blob), whose layers are the ztocs (`application/octet-stream`, annotated with the
image layer's digest and media type) and whose `subject` is the image manifest; attached like
an SBOM, the image itself is unchanged.

`soci create` finds checkpoints by inflating the layer and stopping at deflate block ends,
storing for each the bit offset and the 32 KiB of output before it (the dictionary the next
bytes may refer to). The tool writes its own gzip (builder.layers.gzipped): ONE member whose
spans each start with a fresh dictionary after a full flush, so a checkpoint is just the span's
byte offsets (bits 0); its window is still stored (the reader always sets it as the
dictionary), as the 32 KiB of tar before it. Everything here is a pure function of the gzip
blob and its span offsets (the tar is inflated out of the blob in one pass, so any layer the tool
gzipped is described, a `docker save`'d base layer too): the same layer gives the same ztoc
bytes on any machine.

The format facts come from awslabs/soci-snapshotter v0.4.1: `ztoc/fbs/ztoc.fbs` (the
flatbuffers schema, version "0.9"), `ztoc/compression/gzip_zinfo.h` (zinfo v2: int32 count,
int64 span size, then per checkpoint int64 `in`, int64 `out`, uint8 bits, 32 KiB window, all
little-endian), `ztoc/toc_builder.go` (offsets as Go's tar reader counts them: the archive
size ends after the two zero blocks) and `soci/soci_index.go` (the index manifest). The
flatbuffers are built with the maintained `flatbuffers` library, fields in the schema's order;
builder.oci.ztoc_read reads them back and checks a layer against its ztoc.
"""

from __future__ import annotations

import bisect
import gzip
import json
import struct
import tarfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

import flatbuffers

from builder.digest import Readable, Sha256
from builder.errors import UserError
from builder.oci.v1 import EMPTY_CONFIG, OCI_MANIFEST, Descriptor, digest_of

ZTOC_VERSION = "0.9"
BUILD_TOOL = "build-sandbox-image"
SOCI_INDEX = "application/vnd.amazon.soci.index.v1+json"  # the index's config media type
ZTOC_MEDIA_TYPE = "application/octet-stream"
LAYER_DIGEST = "com.amazon.soci.image-layer-digest"
LAYER_MEDIA_TYPE = "com.amazon.soci.image-layer-mediaType"
BUILD_TOOL_ANNOTATION = "com.amazon.soci.build-tool-identifier"
WINDOW = 32768  # deflate's dictionary: what a checkpoint stores of the output before it
GZIP_HEADER = 10  # the fixed header builder.layers.gzipped writes: the first span starts here
CHUNK = 1 << 20  # bytes per read of a layer's inflated tar
TYPES = MappingProxyType(
    {
        tarfile.REGTYPE: "reg",
        tarfile.AREGTYPE: "reg",
        tarfile.DIRTYPE: "dir",
        tarfile.SYMTYPE: "symlink",
        tarfile.LNKTYPE: "hardlink",
        tarfile.CHRTYPE: "char",
        tarfile.BLKTYPE: "block",
        tarfile.FIFOTYPE: "fifo",
    }
)


@dataclass(frozen=True)
class FileEntry:
    """One tar entry as a ztoc lists it."""

    name: str
    type: str
    offset: int  # of its data in the uncompressed tar
    size: int
    linkname: str = ""
    mode: int = 0
    uid: int = 0
    gid: int = 0
    uname: str = ""
    gname: str = ""
    mod_time: str = ""  # RFC 3339, as Go's time.MarshalText writes it
    devmajor: int = 0
    devminor: int = 0
    xattrs: tuple[tuple[str, str], ...] = ()  # the entry's PAX records, sorted by key


@dataclass(frozen=True)
class Checkpoint:
    """Where inflating may start: compressed and uncompressed offsets, and the window before."""

    compressed: int
    uncompressed: int
    window: bytes


@dataclass(frozen=True)
class Ztoc:
    """A layer's ztoc, as read back from its bytes (what verify and the tests compare)."""

    version: str
    build_tool: str
    compressed_size: int
    uncompressed_size: int
    files: tuple[FileEntry, ...]
    span_size: int
    checkpoints: tuple[Checkpoint, ...]
    span_digests: tuple[str, ...]


@dataclass(frozen=True)
class LayerRead:
    """What one pass over a gzip layer found: what its ztoc describes."""

    files: tuple[FileEntry, ...]
    tar_size: int  # as soci counts it: up to the end-of-archive blocks
    windows: tuple[bytes, ...]  # each span's checkpoint window: the 32 KiB of tar before it
    span_digests: tuple[str, ...]  # each span's compressed bytes' sha256


def read_layer(blob: Readable, span_size: int, spans: Sequence[int]) -> LayerRead:
    """One pass over the gzip layer `blob`, cut at the compressed offsets `spans` (span i
    holding the tar from `i * span_size`): its files, each span's window and digest.

    Only the blob is needed, not its tar: a layer the tool gzipped from a `docker save` (a
    base it pushed itself) is described as well as one it wrote. Not a gzip tar: UserError.
    """
    hashing = _SpanHashing(blob, spans)
    inflated = gzip.GzipFile(fileobj=hashing, mode="rb")  # type: ignore[call-overload]
    windows = _Windows(inflated, [index * span_size for index in range(len(spans))])
    try:
        files, tar_size = toc(windows)
        while windows.read(CHUNK):  # the rest: padding, the trailer, every span's bytes
            pass
    except (OSError, zlib.error, EOFError) as error:
        raise UserError(f"the layer does not read as a gzip tar: {error}") from None
    if len(windows.windows) != len(spans):
        raise UserError("the layer holds fewer spans than its offsets say")
    return LayerRead(files, tar_size, tuple(windows.windows), hashing.digests())


def toc(tar: Readable) -> tuple[tuple[FileEntry, ...], int]:
    """The tar stream's entries and its size as soci counts it (up to the end-of-archive
    blocks, as Go's tar reader does, not the record padding after them)."""
    entries: list[FileEntry] = []
    try:
        with tarfile.open(fileobj=tar, mode="r|", bufsize=CHUNK) as archive:  # type: ignore[call-overload]
            entries.extend(entry_of(info) for info in archive)
            end = archive.offset  # after the last entry's padding
    except tarfile.TarError as error:
        raise UserError(f"not a layer tar: {error}") from None
    return tuple(entries), end + 2 * tarfile.BLOCKSIZE


class _Windows:
    """A reader that keeps, for each span start it passes, the WINDOW bytes before it (zeros
    before the start of the tar): the dictionary soci's reader sets at that checkpoint."""

    def __init__(self, inner: Readable, starts: Sequence[int]) -> None:
        self.inner, self.starts, self.position = inner, list(starts), 0
        self.tail, self.windows = bytes(WINDOW), list[bytes]()

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        end = self.position + len(data)
        while len(self.windows) < len(self.starts) and self.starts[len(self.windows)] <= end:
            cut = self.starts[len(self.windows)] - self.position
            self.windows.append((self.tail + data[:cut])[-WINDOW:])
        self.tail = (self.tail + data[-WINDOW:])[-WINDOW:]
        self.position = end
        return data


class _SpanHashing:
    """A reader that hashes each span's compressed bytes (one span to the next's start, the
    last to the blob's end) as they pass through to the inflater."""

    def __init__(self, inner: Readable, starts: Sequence[int]) -> None:
        self.inner, self.starts, self.position = inner, list(starts), 0
        self.hashes = [Sha256() for _ in self.starts]

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

    def digests(self) -> tuple[str, ...]:
        return tuple(digest.digest for digest in self.hashes)


def _mod_time(info: tarfile.TarInfo) -> str:
    """The mtime as Go's RFC 3339 with nanoseconds, trailing zeros dropped, in UTC."""
    whole = int(info.mtime)
    stamp = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    exact = info.pax_headers.get("mtime", "")
    fraction = exact.partition(".")[2][:9].rstrip("0") if "." in exact else ""
    return f"{stamp}{'.' + fraction if fraction else ''}Z"


def zinfo(span_size: int, points: Sequence[Checkpoint]) -> bytes:
    """soci's gzip zinfo v2 blob: the checkpoints' offsets and windows, little-endian."""
    parts = [struct.pack("<iq", len(points), span_size)]
    for point in points:
        parts.append(struct.pack("<qqB", point.compressed, point.uncompressed, 0))
        parts.append(point.window)
    return b"".join(parts)


def ztoc_bytes(blob_path: Path, span_size: int, spans: Sequence[int]) -> bytes:
    """The ztoc of the tool's gzip layer `blob_path`, cut at `spans` every `span_size` bytes
    of tar (builder.layers.gzipped's format: checkpoints at full flushes, bit offset 0)."""
    if not spans or spans[0] != GZIP_HEADER:
        raise UserError(f"{blob_path}: its spans do not start after the gzip header")
    with blob_path.open("rb") as blob:
        read = read_layer(blob, span_size, spans)
    # A span that starts in the record padding after the end-of-archive blocks would be past
    # the archive as soci counts it: its size (the archive's end minus its start) not positive.
    # The span before it runs to the blob's end instead (rare: a second pass).
    inside = [start for index, start in enumerate(spans) if index * span_size < read.tar_size]
    if len(inside) < len(spans):
        spans = inside
        with blob_path.open("rb") as blob:
            read = read_layer(blob, span_size, spans)
    points = [
        Checkpoint(compressed, index * span_size, read.windows[index])
        for index, compressed in enumerate(spans)
    ]
    blob_size = blob_path.stat().st_size
    info = zinfo(span_size, points)
    return _flatbuffer(read.files, read.tar_size, blob_size, info, read.span_digests)


def _flatbuffer(
    files: Sequence[FileEntry],
    tar_size: int,
    blob_size: int,
    checkpoint_blob: bytes,
    digests: Sequence[str],
) -> bytes:
    """The Ztoc table, built in the order soci's own marshaler builds it."""
    builder = flatbuffers.Builder(0)
    version = builder.CreateString(ZTOC_VERSION)
    tool = builder.CreateString(BUILD_TOOL)
    metadata = [0] * len(files)
    for index in reversed(range(len(files))):
        metadata[index] = _file_metadata(builder, files[index])
    toc_vector = _offsets_vector(builder, metadata)
    builder.StartObject(1)  # TOC
    builder.PrependUOffsetTRelativeSlot(0, toc_vector, 0)
    toc_table = builder.EndObject()
    checkpoint_vector = builder.CreateByteVector(checkpoint_blob)
    digest_vector = _offsets_vector(builder, [builder.CreateString(d) for d in digests])
    builder.StartObject(4)  # CompressionInfo (algorithm: gzip, the schema's default)
    builder.PrependInt32Slot(1, len(digests) - 1, 0)
    builder.PrependUOffsetTRelativeSlot(2, digest_vector, 0)
    builder.PrependUOffsetTRelativeSlot(3, checkpoint_vector, 0)
    info = builder.EndObject()
    builder.StartObject(6)  # Ztoc
    builder.PrependUOffsetTRelativeSlot(0, version, 0)
    builder.PrependUOffsetTRelativeSlot(1, tool, 0)
    builder.PrependUOffsetTRelativeSlot(4, toc_table, 0)
    builder.PrependInt64Slot(2, blob_size, 0)
    builder.PrependInt64Slot(3, tar_size, 0)
    builder.PrependUOffsetTRelativeSlot(5, info, 0)
    builder.Finish(builder.EndObject())
    return bytes(builder.Output())


def _file_metadata(builder: flatbuffers.Builder, entry: FileEntry) -> int:
    name = _text(builder, entry.name)
    kind = _text(builder, entry.type)
    linkname = _text(builder, entry.linkname)
    uname = _text(builder, entry.uname)
    gname = _text(builder, entry.gname)
    mod_time = _text(builder, entry.mod_time)
    xattrs = []
    for key, value in entry.xattrs:
        key_string, value_string = _text(builder, key), _text(builder, value)
        builder.StartObject(2)  # Xattr
        builder.PrependUOffsetTRelativeSlot(0, key_string, 0)
        builder.PrependUOffsetTRelativeSlot(1, value_string, 0)
        xattrs.append(builder.EndObject())
    xattr_vector = _offsets_vector(builder, xattrs)
    builder.StartObject(14)  # FileMetadata
    builder.PrependUOffsetTRelativeSlot(0, name, 0)
    builder.PrependUOffsetTRelativeSlot(1, kind, 0)
    builder.PrependInt64Slot(2, entry.offset, 0)
    builder.PrependInt64Slot(3, entry.size, 0)
    builder.PrependUOffsetTRelativeSlot(4, linkname, 0)
    builder.PrependInt64Slot(5, entry.mode, 0)
    builder.PrependUint32Slot(6, entry.uid, 0)
    builder.PrependUint32Slot(7, entry.gid, 0)
    builder.PrependUOffsetTRelativeSlot(8, uname, 0)
    builder.PrependUOffsetTRelativeSlot(9, gname, 0)
    builder.PrependUOffsetTRelativeSlot(10, mod_time, 0)
    builder.PrependInt64Slot(11, entry.devmajor, 0)
    builder.PrependInt64Slot(12, entry.devminor, 0)
    builder.PrependUOffsetTRelativeSlot(13, xattr_vector, 0)
    return int(builder.EndObject())


def _text(builder: flatbuffers.Builder, text: str) -> int:
    """A tar's string as its bytes: tarfile keeps a name or a PAX value that is not UTF-8 (a
    binary capability xattr, say) as surrogate escapes, and soci stores Go's raw bytes."""
    return int(builder.CreateString(text, errors="surrogateescape"))


def _offsets_vector(builder: flatbuffers.Builder, offsets: Sequence[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return int(builder.EndVector())


@dataclass(frozen=True)
class LayerZtoc:
    """One indexed layer: the image layer's descriptor and its ztoc's bytes."""

    layer: Descriptor
    ztoc: bytes


@dataclass(frozen=True)
class SociIndex:
    """A SOCI index to attach to an image: its ztocs, and the manifest naming them."""

    ztocs: tuple[LayerZtoc, ...]
    artifact_type: str = SOCI_INDEX

    def blobs(self) -> tuple[bytes, ...]:
        """What the registry must hold before the manifest: the `{}` config and the ztocs."""
        return (EMPTY_CONFIG, *(one.ztoc for one in self.ztocs))

    def manifest(self, subject: Descriptor) -> bytes:
        """The index manifest as soci 0.4's MarshalIndex writes it (Go's field order)."""
        layers = [
            {
                "mediaType": ZTOC_MEDIA_TYPE,
                "digest": digest_of(one.ztoc),
                "size": len(one.ztoc),
                "annotations": {
                    LAYER_DIGEST: one.layer.digest,
                    LAYER_MEDIA_TYPE: one.layer.media_type,
                },
            }
            for one in self.ztocs
        ]
        document = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": SOCI_INDEX, "digest": digest_of(EMPTY_CONFIG), "size": 2},
            "layers": layers,
            "subject": {
                "mediaType": subject.media_type,
                "digest": subject.digest,
                "size": subject.size,
            },
            "annotations": {BUILD_TOOL_ANNOTATION: BUILD_TOOL},
        }
        return json.dumps(document, separators=(",", ":")).encode()


def indexed_layers(manifest: bytes) -> dict[str, str]:
    """A SOCI index manifest's ztocs by the image layer they describe (layer → ztoc digest)."""
    try:
        document = json.loads(manifest)
        if document["config"]["mediaType"] != SOCI_INDEX:
            raise ValueError("not a SOCI index")
        found: dict[str, str] = {}
        for layer in document["layers"]:
            described = str(layer["annotations"][LAYER_DIGEST])
            if described in found:  # which of the two a snapshotter uses is anyone's guess
                raise ValueError(f"two ztocs for layer {described}")
            found[described] = str(layer["digest"])
        return found
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"not a SOCI index manifest: {error}") from None


def entry_of(info: tarfile.TarInfo) -> FileEntry:
    kind = TYPES.get(info.type)
    if kind is None:
        raise tarfile.TarError(f"tar entry {info.name!r}: type {info.type!r} has no ztoc type")
    return FileEntry(
        name=info.name + ("/" if info.isdir() else ""),
        type=kind,
        offset=info.offset_data,
        size=info.size,
        linkname=info.linkname,
        mode=info.mode,
        uid=info.uid,
        gid=info.gid,
        uname=info.uname,
        gname=info.gname,
        mod_time=_mod_time(info),
        devmajor=info.devmajor,
        devminor=info.devminor,
        xattrs=tuple(sorted(info.pax_headers.items())),
    )
