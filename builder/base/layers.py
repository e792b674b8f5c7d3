"""The merged filesystem of an image, read from its layer tars as they stream past.

Each layer is applied in order with its whiteouts (`.wh.<name>` hides a lower path,
`.wh..wh..opq` empties a lower directory), keeping only what the base facts need: symlinks,
shared libraries (their soname, via `builder.inspect.elf`), METADATA of the distributions on
PYTHONPATH, the dpkg status and file lists, and ld.so.cache. `facts()` then reports what the
engine probe's in-container script reports, from the merged tree. A layer is gunzipped here,
not by tarfile, so the bytes it inflates to are counted and cut off at MAX_UNPACKED: a small
gzip bomb in a hostile base cannot keep the probe inflating.
"""

from __future__ import annotations

import email.parser
import gzip
import io
import posixpath
import re
import struct
import sys
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import IO, Any

from builder.base.profile import DEBIAN_VERSION, ArchFacts, installed_packages
from builder.digest import Readable
from builder.inspect.elf import read_elf
from builder.resolve.target import Arch

MAX_LIBRARY = 256 << 20  # a shared library read whole to find its DT_SONAME
MAX_TEXT = 64 << 20  # METADATA, dpkg status and lists, ld.so.cache
MAX_UNPACKED = 8 << 30  # the tar bytes one layer may unpack to; a gzip bomb would go on forever
GZIP_MAGIC = b"\x1f\x8b"
READ_CHUNK = 1 << 20  # bytes per read while unpacking: few Python-level calls per layer
LIBRARY = re.compile(r"[^/]+\.so(\.[^/]*)?$")
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
DPKG_STATUS = "var/lib/dpkg/status"
DPKG_INFO = "var/lib/dpkg/info/"
LD_CACHE = "etc/ld.so.cache"
LD_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
LIBC_FILE = re.compile(r"^libc-(\d+\.\d+)\.so$")
LIBC_BANNER = re.compile(rb"release version (\d+\.\d+)")
ELF64_LE = b"\x7fELF\x02\x01"  # the engine probe reads these only (x86_64, aarch64)
SYMLINK_HOPS = 40


class Kind(StrEnum):
    """What a file of a base layer is read as, and what its entry holds."""

    LINK = "link"  # a symlink: its target
    LIB = "lib"  # a shared library: its soname or None, and libc's version (libc.so.6) or None
    META = "meta"  # a Python distribution's metadata: (name, version)
    TEXT = "text"  # dpkg's status, or a package's file list (its library paths only)
    LIST = "list"  # read as a package's file list, kept as TEXT
    LDCACHE = "ldcache"  # ld.so.cache: [(name, path)]
    OTHER = "other"  # a non-directory nobody reads: it hides what it replaces, then is dropped


# An entry is (kind, value...): (LINK, target), (LIB, soname, libc version), (META, (name,
# version)), (TEXT, str), (LDCACHE, [(name, path)]), (OTHER, None); never LIST.
Entry = tuple[Any, ...]


@dataclass
class Layers:
    """Entries of interest after applying each layer and its whiteouts in order."""

    arch: Arch
    pythonpath: list[str]
    entries: dict[str, Entry] = field(default_factory=dict)

    def wanted(self, path: str) -> Kind | None:
        """What to read from a regular file at `path` (normalized, no leading slash)."""
        parent, name = posixpath.split(path)
        if path in (DPKG_STATUS, LD_CACHE):
            return Kind.TEXT if path == DPKG_STATUS else Kind.LDCACHE
        if parent == DPKG_INFO.rstrip("/") and name.endswith(".list"):
            return Kind.LIST
        if LIBRARY.match(name) and parent in self.library_dirs():
            return Kind.LIB
        if name in ("METADATA", "PKG-INFO"):
            info, package_dir = posixpath.basename(parent), posixpath.dirname(parent)
            if info.endswith((".dist-info", ".egg-info")) and package_dir in self.pythonpath:
                return Kind.META
        return None

    def library_dirs(self) -> tuple[str, ...]:
        return (f"lib/{self.arch.triplet}", f"usr/lib/{self.arch.triplet}", "usr/local/lib")

    def apply(self, stream: Readable) -> None:
        """Read one layer blob (a tar, gzipped or not; streamed) and lay it over the entries."""
        added: dict[str, Entry] = {}
        present: set[str] = set()  # every path this layer holds: it replaces the lower one
        hidden: set[str] = set()  # whiteouts: these paths and all under them go
        opaque: set[str] = set()  # directories whose lower contents go
        with tarfile.open(fileobj=unpacked(stream), mode="r|") as archive:
            for member in archive:
                path = _normalize(member.name)
                if not path:
                    continue
                parent, name = posixpath.split(path)
                if name == OPAQUE:
                    opaque.add(parent)
                    continue
                if name.startswith(WHITEOUT):
                    hidden.add(posixpath.join(parent, name[len(WHITEOUT) :]))
                    continue
                present.add(path)
                if member.isdir():
                    continue
                if member.issym():
                    added[path] = (Kind.LINK, member.linkname)
                elif member.islnk():
                    target = added.get(_normalize(member.linkname))
                    added[path] = target if target else (Kind.OTHER, None)
                elif member.isreg():
                    added[path] = self._read(archive, member, path)
                else:
                    added[path] = (Kind.OTHER, None)
        self._overlay(added, present, hidden, opaque)

    def _read(self, archive: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> Entry:
        kind = self.wanted(path)
        if kind is None:
            return (Kind.OTHER, None)
        limit = MAX_LIBRARY if kind == Kind.LIB else MAX_TEXT
        if member.size > limit:
            return (Kind.OTHER, None)
        handle = archive.extractfile(member)
        data = handle.read() if handle else b""
        if kind == Kind.LIB:
            name = posixpath.basename(path)
            banner = LIBC_BANNER.search(data) if name == "libc.so.6" else None
            return (Kind.LIB, soname(data, name), banner.group(1).decode() if banner else None)
        if kind == Kind.META:
            headers = email.parser.BytesHeaderParser().parsebytes(data)
            return (Kind.META, (headers.get("Name") or "", headers.get("Version") or ""))
        if kind == Kind.LDCACHE:
            return (Kind.LDCACHE, ld_cache_entries(data))
        text = data.decode("utf-8", "replace")
        if kind == Kind.LIST:  # only the library paths matter: keep the record small
            text = "\n".join(p for p in text.splitlines() if LIBRARY.match(posixpath.basename(p)))
        return (Kind.TEXT, text)

    def _overlay(
        self,
        added: Mapping[str, Entry],
        present: set[str],
        hidden: set[str],
        opaque: set[str],
    ) -> None:
        # A whiteout, an opaque directory or a non-directory in this layer removes the lower
        # path and everything beneath it; the layer's own entries then go on top.
        gone_below = hidden | opaque | set(added)
        for path in list(self.entries):
            if path in hidden or path in present or _under(path, gone_below):
                del self.entries[path]
        self.entries.update((p, e) for p, e in added.items() if e[0] != Kind.OTHER)

    # -- reading the merged tree --------------------------------------------------------------
    def realpath(self, path: str) -> str:
        """`path` with every symlink the image holds resolved (relative to its root)."""
        parts = [p for p in path.split("/") if p]
        resolved: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            if part == ".":
                continue
            candidate = "/".join([*resolved, part])
            entry = self.entries.get(candidate)
            if entry and entry[0] == Kind.LINK and hops < SYMLINK_HOPS:
                hops += 1
                target = entry[1]
                if target.startswith("/"):
                    resolved = []
                parts = [p for p in target.split("/") if p] + parts
                continue
            resolved.append(part)
        return "/".join(resolved)

    def facts(self) -> ArchFacts:
        """The same facts the engine probe's script prints, read from the merged layers."""
        status = self.entries.get(DPKG_STATUS)
        installed = installed_packages(status[1] if status and status[0] == Kind.TEXT else "")
        owned: set[str] = set()
        for path, entry in self.entries.items():
            if path.startswith(DPKG_INFO) and entry[0] == Kind.TEXT:
                owned.update(self.realpath(p) for p in entry[1].splitlines())
        found: list[tuple[str, str]] = []  # (soname, path), as the engine's script collects
        ldcache = self.entries.get(LD_CACHE)
        if ldcache and ldcache[0] == Kind.LDCACHE:
            found.extend((name, target.lstrip("/")) for name, target in ldcache[1])
        libc_banner = None
        directories = {self.realpath(d) for d in self.library_dirs()}
        for path in sorted(self.entries):
            parent, name = posixpath.split(path)
            if parent not in directories or name.startswith(".") or not LIBRARY.match(name):
                continue
            target = self.entries.get(self.realpath(path))
            if target and target[0] == Kind.LIB:
                if target[1]:
                    found.append((target[1], path))
                libc_banner = libc_banner or target[2]
            elif self.entries[path][0] == Kind.LINK:  # a target outside the library directories
                found.append((name, path))
        return {
            "glibc": _glibc(installed, [p for _, p in found], libc_banner),
            "distributions": {d: self._distributions(d) for d in self.pythonpath},
            "sonames": sorted({name for name, _ in found}),
            "unpackaged": sorted(
                {name for name, path in found if self.realpath(path) not in owned}
            ),
            "packages": sorted(installed),
            "python_packages": {
                name: version
                for name, version in installed.items()
                if re.fullmatch(r"python3\.\d+(-minimal)?", name)
            },
            "python3_link": self.realpath("usr/bin/python3"),
        }

    def _distributions(self, directory: str) -> dict[str, str]:
        found: dict[str, str] = {}
        prefix = directory.strip("/") + "/"
        for path in sorted(self.entries):
            entry = self.entries[path]
            if entry[0] != Kind.META or not path.startswith(prefix):
                continue
            name, version = entry[1]
            if name and posixpath.dirname(posixpath.dirname(path)) + "/" == prefix:
                found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), version)
        return found


class Oversized(tarfile.TarError):
    """A layer unpacking to more than MAX_UNPACKED bytes: refused before inflating the rest."""


class _Capped(io.RawIOBase):
    """`stream` as a raw file the io and gzip machinery can read, failing past `limit` bytes."""

    def __init__(self, stream: Readable, limit: int) -> None:
        self.stream, self.limit, self.left = stream, limit, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(min(len(buffer), self.left + 1))
        if len(data) > self.left:
            raise Oversized(f"it unpacks to more than {_size(self.limit)}")
        self.left -= len(data)
        buffer[: len(data)] = data
        return len(data)


def unpacked(blob: Readable) -> IO[bytes]:
    """A layer blob's tar bytes: gunzipped if it is gzip, at most MAX_UNPACKED of them.

    The gzip stream is inflated here, not by tarfile, so every inflated byte is counted.
    """
    source = io.BufferedReader(_Capped(blob, sys.maxsize), READ_CHUNK)
    tar: Readable = source
    if source.peek(len(GZIP_MAGIC)).startswith(GZIP_MAGIC):
        tar = gzip.GzipFile(fileobj=source, mode="rb")
    return io.BufferedReader(_Capped(tar, MAX_UNPACKED), READ_CHUNK)


def _size(count: int) -> str:
    return f"{count >> 30} GiB" if count >= 1 << 30 else f"{count} bytes"


def _normalize(name: str) -> str:
    return posixpath.normpath("/" + name).lstrip("/") if name not in ("", ".", "./") else ""


def _under(path: str, prefixes: set[str]) -> bool:
    parent = posixpath.dirname(path)
    while parent:
        if parent in prefixes:
            return True
        parent = posixpath.dirname(parent)
    return False


def _glibc(installed: Mapping[str, str], library_paths: Iterable[str], banner: str | None) -> str:
    match = DEBIAN_VERSION.match(installed.get("libc6", ""))
    if match:
        return match.group(1)
    for path in library_paths:
        match = LIBC_FILE.match(posixpath.basename(path))
        if match:
            return match.group(1)
    return banner or ""


def ld_cache_entries(data: bytes) -> list[tuple[str, str]]:
    """(name, path) pairs of a glibc ld.so.cache (format 1.1), as `ldconfig -p` lists them."""
    start = data.find(LD_CACHE_MAGIC)
    if start < 0:
        return []
    try:
        count, _ = struct.unpack_from("<II", data, start + 20)
        entries = []
        for i in range(count):
            _, key, value = struct.unpack_from("<iII", data, start + 48 + 24 * i)
            entries.append((_cstring(data, key), _cstring(data, value)))
        return entries
    except (struct.error, ValueError):  # past the end, no NUL (str.index), not UTF-8
        return []


def _cstring(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode()


def soname(data: bytes, name: str) -> str | None:
    """DT_SONAME of a 64-bit little-endian ELF, its file name if it has none, None if not ELF.

    The rule of the engine probe's script, read with the inspect stage's ELF reader.
    """
    if data[:6] != ELF64_LE:
        return None
    try:
        return read_elf(io.BytesIO(data), name).soname or name
    except (ValueError, struct.error, UnicodeDecodeError):  # UnreadableElf is a ValueError
        return None
