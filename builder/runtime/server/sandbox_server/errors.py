"""Client-visible failures: each becomes a JSON ``{"error": ...}`` answer, never a traceback."""

from __future__ import annotations

import errno
import os


class ApiError(Exception):
    """A client-visible failure: becomes a JSON ``{"error": ...}`` response, never a traceback."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def os_error(exc: OSError) -> ApiError:
    """Turn a filesystem error caused by the client's path into the matching HTTP status."""
    code = exc.errno
    if code in (errno.ENOENT, errno.ENOTDIR):
        return ApiError(404, "no such file or directory")
    if code in (errno.EACCES, errno.EPERM, errno.ELOOP, errno.EROFS, errno.EXDEV):
        return ApiError(403, os.strerror(code))
    if code in (errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ, errno.EISDIR, errno.EEXIST):
        return ApiError(400, os.strerror(code))
    if code == errno.ENOTEMPTY:
        return ApiError(409, os.strerror(code))
    if code in (errno.ENOSPC, errno.EDQUOT):
        return ApiError(507, os.strerror(code))
    if code in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return ApiError(503, os.strerror(code), {"Retry-After": "1"})
    raise exc


def check_os_string(value: str, what: str) -> None:
    """Reject strings the OS cannot take (NUL, lone surrogates) as a 400 instead of a crash."""
    if "\x00" in value:
        raise ApiError(400, f"{what} contains a NUL byte")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise ApiError(400, f"{what} is not valid UTF-8") from None
