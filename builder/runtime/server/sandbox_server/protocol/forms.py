"""multipart/form-data, read as a stream, and header parameters (``boundary``, ``filename``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from ..config import CHUNK
from ..errors import ApiError

DISPOSITION_PARAM = re.compile(r';\s*([^\s=;]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;]*))', re.DOTALL)


def disposition_params(value: str) -> dict[str, str]:
    """Parameters of a Content-Disposition/Content-Type header (quoted or RFC 5987 ``*=``).

    Quoted values are taken literally, as browsers and urllib3 2 send them; a backslash stays a
    backslash, so a path that contains one is refused rather than silently rewritten."""
    params: dict[str, str] = {}
    for match in DISPOSITION_PARAM.finditer(value):
        name, quoted, bare = match.group(1).lower(), match.group(2), match.group(3)
        text = quoted if quoted is not None else bare.strip()
        if name.endswith("*"):
            charset, _, encoded = text.partition("'")
            _, _, encoded = encoded.partition("'")
            try:
                text = unquote_to_bytes(encoded).decode(charset or "utf-8")
            except (LookupError, ValueError):  # UnicodeError from odd codecs included
                raise ApiError(400, f"cannot decode header parameter {name}") from None
            name = name[:-1]
            params[name] = text
        else:
            params.setdefault(name, text)
    return params


class Multipart:
    """Streaming multipart/form-data reader, so uploads go to disk without being held in memory."""

    def __init__(self, read: Callable[[int], bytes], boundary: bytes) -> None:
        self._read = read
        self._delimiter = b"\r\n--" + boundary
        self._buf = bytearray(b"\r\n")  # lets the first delimiter match like every later one

    def _fill(self) -> None:
        chunk = self._read(CHUNK)
        if not chunk:
            raise ApiError(400, "multipart body ends before its closing boundary")
        self._buf += chunk

    def copy_part(self, sink: Callable[[bytes], None] | None) -> None:
        """Pass the bytes up to the next delimiter to ``sink`` (or drop them) and consume it."""
        keep = len(self._delimiter) - 1
        while (index := self._buf.find(self._delimiter)) < 0:
            if len(self._buf) > keep:
                if sink is not None:
                    sink(bytes(self._buf[:-keep]))
                del self._buf[:-keep]
            self._fill()
        if sink is not None and index:
            sink(bytes(self._buf[:index]))
        del self._buf[: index + len(self._delimiter)]

    def _line(self) -> bytes:
        while (index := self._buf.find(b"\r\n")) < 0:
            if len(self._buf) > 16384:
                raise ApiError(400, "multipart header line too long")
            self._fill()
        line = bytes(self._buf[:index])
        del self._buf[: index + 2]
        return line

    def next_part(self) -> bool:
        """After a delimiter: True if a part follows, False at the closing ``--``."""
        while len(self._buf) < 2:
            self._fill()
        if self._buf[:2] == b"--":
            return False
        if self._line().strip(b" \t"):
            raise ApiError(400, "malformed multipart delimiter")
        return True

    def headers(self) -> dict[str, str]:
        """Headers of the current part, lower-cased names."""
        found: dict[str, str] = {}
        for _ in range(64):
            line = self._line()
            if not line:
                return found
            name, sep, value = line.partition(b":")
            if not sep:
                raise ApiError(400, "malformed multipart header")
            try:
                found[name.strip().lower().decode("ascii")] = value.strip().decode("utf-8")
            except UnicodeDecodeError:
                raise ApiError(400, "multipart header is not valid UTF-8") from None
        raise ApiError(400, "too many multipart headers")
