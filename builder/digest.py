"""A blob's bytes as they stream, and their sha256 and size: the one home of both.

Every part of the tool that moves a blob hashes it on the way instead of reading it back: a
download into the cache (checked against its lock), a layer tar written (its diff ID), the tar
read while it is gzipped (checked against its diff ID) and the gzip written (its digest), a
registry blob read (checked against its digest), an upload's stream (the digest the upload
is committed under), a ztoc's spans. `Sha256` is what they count with: the hash and the size
of the bytes given in pieces, as a hex digest or as the `sha256:<hex>` an OCI descriptor
carries. `HashingReader` and `HashingWriter` pass a stream's bytes through, counting them;
a file's (`builder.files.sha256_of`) is counted with `Sha256` too. Pure: it opens nothing.

`Readable` is what every reader of a blob's bytes takes: a file, a registry's verified blob
stream, a gzip stream. It lives here, beside errors and the retry policy at the bottom of the
package, so that the OCI core, the cache and the base's layer reader name one protocol.

Imports nothing of the project (the OCI core and the cache import it).
"""

from __future__ import annotations

import hashlib
from typing import IO, Protocol

CHUNK = 1 << 20  # bytes read at a time from a file


class Readable(Protocol):
    """A stream of a blob's bytes: `size` bytes at most, fewer only at its end, all with -1."""

    def read(self, size: int = -1, /) -> bytes: ...


class Sha256:
    """The sha256 and the size of bytes given in pieces."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.size = 0  # bytes given so far

    @classmethod
    def of(cls, data: bytes) -> Sha256:
        """The sha256 and size of `data`, whole in memory (a manifest, a config)."""
        found = cls()
        found.update(data)
        return found

    @classmethod
    def read_from(cls, source: Readable, chunk: int = 1 << 20) -> Sha256:
        """The sha256 and size of what `source` reads to its end, `chunk` bytes at a time."""
        found = cls()
        while data := source.read(chunk):
            found.update(data)
        return found

    def update(self, data: bytes) -> None:
        self._hash.update(data)
        self.size += len(data)

    @property
    def hex(self) -> str:
        """The hex digest: how the cache and a lock name a file."""
        return self._hash.hexdigest()

    @property
    def digest(self) -> str:
        """`sha256:<hex>`: how an OCI descriptor, a diff ID and a ztoc name bytes."""
        return f"sha256:{self.hex}"


class HashingReader:
    """A reader that hashes what passes through it from `source`."""

    def __init__(self, source: Readable) -> None:
        self.source = source
        self.sha256 = Sha256()

    def read(self, size: int = -1, /) -> bytes:
        data = self.source.read(size)
        self.sha256.update(data)
        return data


class HashingWriter:
    """A write-only stream that hashes what passes through it to `sink`."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.sha256 = Sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self.sink.write(data)

    def flush(self) -> None:
        self.sink.flush()
