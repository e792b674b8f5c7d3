"""The one sha256-with-size of the tool (builder.digest): bytes given in pieces, a reader and a
writer that hash what passes through, a file read in chunks; each checked against hashlib's
digest of the same bytes whole."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from builder.digest import CHUNK, HashingReader, HashingWriter, Sha256
from builder.files import file_sha256, sha256_of

PIECES = (b"", b"a layer ", b"in", b"", b" pieces" * 1000)
WHOLE = b"".join(PIECES)


def test_pieces_hash_and_count_as_the_whole() -> None:
    found = Sha256()
    for piece in PIECES:
        found.update(piece)
    assert found.hex == hashlib.sha256(WHOLE).hexdigest()
    assert found.digest == f"sha256:{found.hex}" and found.size == len(WHOLE)
    assert Sha256.of(WHOLE).digest == found.digest and Sha256.of(WHOLE).size == len(WHOLE)
    empty = Sha256()
    assert (empty.size, empty.hex) == (0, hashlib.sha256(b"").hexdigest())


def test_a_reader_hashes_what_it_hands_over_and_nothing_more() -> None:
    reader = HashingReader(io.BytesIO(WHOLE))
    first = reader.read(5)
    assert first == WHOLE[:5] and reader.sha256.digest == Sha256.of(first).digest
    rest = reader.read()
    assert first + rest == WHOLE
    assert (reader.sha256.hex, reader.sha256.size) == (
        hashlib.sha256(WHOLE).hexdigest(),
        len(WHOLE),
    )


def test_a_writer_hashes_what_it_passes_on() -> None:
    sink = io.BytesIO()
    writer = HashingWriter(sink)
    counts = [writer.write(piece) for piece in PIECES]
    writer.flush()
    assert sink.getvalue() == WHOLE and counts == [len(piece) for piece in PIECES]
    assert (writer.sha256.hex, writer.sha256.size) == (
        hashlib.sha256(WHOLE).hexdigest(),
        len(WHOLE),
    )


def test_a_file_larger_than_a_chunk(tmp_path: Path) -> None:
    data = bytes(range(256)) * (CHUNK // 256 + 3)  # a chunk and then some
    path = tmp_path / "blob"
    path.write_bytes(data)
    found = file_sha256(path)
    assert (found.hex, found.size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert sha256_of(path) == found.hex
