"""A command's output: spooled to unnamed files, and streamed back as a bounded JSON reply.

Output never sits in the server's memory whole: each stream is spooled (capped at
``--max-output`` raw bytes) and the reply is encoded chunk by chunk, each stream capped at half
of ``--max-reply`` encoded bytes, with notes saying what was cut.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

ENCODE_CHUNK = 64 * 1024
NOTE_RESERVE = 1024  # encoded bytes kept back in each stream's budget for the server's notes


class SpoolFactory:
    """Unnamed temporary files for command output, outside the workspace: O_TMPFILE files in
    the first writable directory of ``--spool-dir``, $TMPDIR, /tmp, /var/tmp; a memfd when
    none is (a read-only root filesystem)."""

    def __init__(self, configured: str | None, workspace: str) -> None:
        self.directory: str | None = None
        candidates = [configured] if configured else [os.environ.get("TMPDIR"), "/tmp", "/var/tmp"]
        for candidate in candidates:
            if not candidate:
                continue
            real = os.path.realpath(candidate)
            if os.path.commonpath([real, workspace]) == workspace:
                continue  # never spool where commands (and clients) can see or fill it
            try:
                os.close(os.open(real, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600))
            except OSError:
                continue
            self.directory = real
            break

    def new(self) -> IO[bytes]:
        if self.directory is not None:
            with contextlib.suppress(OSError):
                fd = os.open(self.directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
                return open(fd, "w+b")
        return open(os.memfd_create("sandbox-spool", os.MFD_CLOEXEC), "w+b")


class Capture:
    """Keeps the first ``limit`` bytes of a stream in a spool file and counts the rest."""

    def __init__(self, limit: int, spool: IO[bytes]) -> None:
        self.limit = limit
        self.spool = spool
        self.size = 0
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = max(self.limit - self.size, 0)
        if room:
            self.spool.write(chunk[:room])
            self.size += min(room, len(chunk))
        self.dropped += max(len(chunk) - room, 0)


def json_text(text: str) -> bytes:
    """``text`` as the inside of a JSON string (no quotes), UTF-8."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


class EncodedStream:
    """A spooled stream as the body of a JSON string, in chunks, at most ``budget`` bytes.

    Bytes are decoded as UTF-8 (invalid ones become U+FFFD) and escaped chunk by chunk, so no
    copy of the whole output is ever built. Encoding is deterministic: the reply is encoded once
    to learn its length and cut, then again to send it."""

    def __init__(self, spool: IO[bytes], budget: int) -> None:
        self.spool = spool
        self.budget = budget
        self.cut = False
        self.last = ""

    def chunks(self) -> Iterator[bytes]:
        self.spool.flush()
        self.spool.seek(0)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        used, self.cut, self.last = 0, False, ""
        while True:
            raw = self.spool.read(ENCODE_CHUNK)
            text = decoder.decode(raw, final=not raw)
            if text:
                piece = json_text(text)
                if used + len(piece) > self.budget:
                    room, keep = self.budget - used, len(text)
                    while keep > 0:
                        keep = min(keep - 1, keep * room // len(piece))
                        piece = json_text(text[:keep])
                        if len(piece) <= room:
                            break
                    if keep > 0:
                        self.last = text[keep - 1]
                        yield piece
                    self.cut = True
                    return
                used += len(piece)
                self.last = text[-1]
                yield piece
            if not raw:
                return


@dataclass
class Outcome:
    """What a command left: spooled output, exit status, and why it ended."""

    out: Capture
    err: Capture
    exit_code: int
    timed_out: bool
    timeout: float
    budget: int
    killed: int = 0
    message: str = ""  # stderr for commands that never started

    def close(self) -> None:
        self.out.spool.close()
        self.err.spool.close()

    def _pieces(self) -> Iterator[bytes]:
        stdout = EncodedStream(self.out.spool, self.budget)
        stderr = EncodedStream(self.err.spool, self.budget)
        yield b'{"stdout": "'
        yield from stdout.chunks()
        yield b'", "stderr": "'
        yield json_text(self.message)
        yield from stderr.chunks()
        last = stderr.last or self.message[-1:]
        notes = []
        for name, capture, encoded in (("stdout", self.out, stdout), ("stderr", self.err, stderr)):
            if capture.dropped:
                notes.append(f"{name} truncated: {capture.dropped} bytes dropped")
            if encoded.cut:
                notes.append(f"{name} truncated: reply limit of {self.budget} bytes reached")
        if self.timed_out:
            notes.append(f"timed out after {self.timeout:g}s; its processes were killed")
        for note in notes:
            separator = "\n" if last and last != "\n" else ""
            yield json_text(f"{separator}[sandbox] {note}\n")
            last = "\n"
        truncated = {
            "stdout": stdout.cut or self.out.dropped > 0,
            "stderr": stderr.cut or self.err.dropped > 0,
        }
        tail = {"exit_code": self.exit_code, "timed_out": self.timed_out, "truncated": truncated}
        yield b'", ' + json.dumps(tail).encode()[1:]

    def reply(self) -> tuple[int, Iterator[bytes]]:
        """(length, chunks) of the JSON reply, encoded without holding it in memory."""
        return sum(len(piece) for piece in self._pieces()), self._pieces()
