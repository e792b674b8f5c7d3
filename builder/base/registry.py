"""Probe a base image through its registry alone: no engine, no container, no pull to disk.

A small OCI distribution client (stdlib urllib) resolves `repo:tag` or `repo@digest` to a
manifest (for an index: the linux/amd64 entry and the linux/arm64 one when present), reads the
config blob (Env, User) and streams every layer once, applying whiteouts in layer order, to
collect what the engine probe reads inside a container: the distributions on PYTHONPATH, the
sonames of the loader directories and cache, the dpkg package list, python and glibc versions.
The result is cached by the manifest (or index) digest, so a repeat probe asks the registry
only what the tag names now.

Credentials: BSI_REGISTRY_USER/BSI_REGISTRY_PASSWORD (or REGISTRY_USERNAME/REGISTRY_PASSWORD),
else a basic `auth` entry of the Docker config file's `auths`; credential helpers are not run.
"""

from __future__ import annotations

import base64
import email.parser
import hashlib
import ipaddress
import json
import os
import posixpath
import re
import struct
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from builder.analysis.debian import packages_providing
from builder.analysis.target import ARCHES, Arch, BaseProfile
from builder.cache import Cache
from builder.errors import UserError
from builder.image.publish import AUTH_HINT, DIGEST_RE, registry_credentials, registry_host

RECORD_KIND = "registry-probe"
RECORD_VERSION = 1  # bump when the collected facts change shape or meaning
TIMEOUT = 60  # seconds per request (a layer is streamed; this bounds each read)
MAX_LIBRARY = 256 << 20  # a shared library read whole to find its DT_SONAME
MAX_TEXT = 64 << 20  # METADATA, dpkg status and lists, ld.so.cache
DOCKER_HUB = "registry-1.docker.io"
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = frozenset(MANIFEST_TYPES[:2])
ZSTD_TYPES = ("zstd",)  # media types tarfile cannot stream

LIBRARY = re.compile(r"[^/]+\.so(\.[^/]*)?$")
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
DPKG_STATUS = "var/lib/dpkg/status"
DPKG_INFO = "var/lib/dpkg/info/"
LD_CACHE = "etc/ld.so.cache"
LD_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
DEBIAN_VERSION = re.compile(r"^(?:\d+:)?(\d+\.\d+(?:\.\d+)?)")
LIBC_FILE = re.compile(r"^libc-(\d+\.\d+)\.so$")
LIBC_BANNER = re.compile(rb"release version (\d+\.\d+)")
SHT_DYNAMIC, DT_SONAME = 6, 14
SYMLINK_HOPS = 40


# ---------------------------------------------------------------------------------------------
# References and credentials
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    host: str  # as the user and the Docker config name it: docker.io, 127.0.0.1:5000
    repository: str  # path on the registry: library/python
    reference: str  # tag or sha256:… digest

    @property
    def api_host(self) -> str:
        return DOCKER_HUB if self.host == "docker.io" else self.host

    @property
    def is_digest(self) -> bool:
        return self.reference.startswith("sha256:")


def parse_reference(image: str) -> Reference:
    """`host:5000/a/b:tag`, `a/b@sha256:…`, `python:3.13` -> host, repository, tag or digest."""
    name, _, digest = image.partition("@")
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name[: -len(last)] + last.split(":", 1)[0], last.split(":", 1)[1]
    host = registry_host(name)
    path = name.split("/", 1)[1] if name.startswith(host + "/") else name
    if host == "docker.io":
        path = path.removeprefix("index.docker.io/")
        if "/" not in path:
            path = f"library/{path}"
    if digest and not DIGEST_RE.fullmatch(digest):
        raise UserError(f"base image {image}: {digest!r} is not a sha256 digest")
    if not path:
        raise UserError(f"base image {image}: no repository in the reference")
    return Reference(host, path, digest or tag or "latest")


def _loopback(host: str) -> bool:
    name = urllib.parse.urlsplit(f"//{host}").hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _docker_config_auth(host: str) -> tuple[str, str] | None:
    """A basic `auth` entry for `host` in the Docker config file, if any (helpers are skipped)."""
    directory = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    wanted = {host, "index.docker.io", DOCKER_HUB} if host == "docker.io" else {host}
    for key, entry in (config.get("auths") or {}).items():
        server = key.split("://", 1)[-1].split("/", 1)[0]
        if server not in wanted or not isinstance(entry, dict) or not entry.get("auth"):
            continue
        try:
            user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            continue
        if sep and user:
            return user, password
    return None


def _credentials(host: str) -> tuple[str, str] | None:
    found = registry_credentials(host)
    if found:
        return found["username"], found["password"]
    return _docker_config_auth(host)


# ---------------------------------------------------------------------------------------------
# The distribution API client
# ---------------------------------------------------------------------------------------------
class _Unauthorized(Exception):
    pass


class RegistryClient:
    """GETs and HEADs on one repository, with basic or bearer-token authentication."""

    def __init__(self, ref: Reference, image: str) -> None:
        self.ref = ref
        self.image = image
        self.scheme = "http" if _loopback(ref.api_host) else "https"
        proxies: dict[str, str] | None = {} if _loopback(ref.api_host) else None
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
        self.credentials = _credentials(ref.host)
        # Basic credentials go with the first request (they are this host's own), which saves
        # a 401 round trip; a registry that wants tokens answers with its Bearer challenge.
        self.authorization = _basic(*self.credentials) if self.credentials else None

    def url(self, kind: str, reference: str) -> str:
        return f"{self.scheme}://{self.ref.api_host}/v2/{self.ref.repository}/{kind}/{reference}"

    def open(self, url: str, accept: str | None = None, method: str = "GET") -> Any:
        """The response to `url`; raises UserError naming the image on any failure."""
        for attempt in range(2):
            request = urllib.request.Request(url, method=method)
            if accept:
                request.add_header("Accept", accept)
            if self.authorization:  # never forwarded to a redirect target (blob storage)
                request.add_unredirected_header("Authorization", self.authorization)
            try:
                return self.opener.open(request, timeout=TIMEOUT)
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
                exc.close()
                if exc.code == 401 and attempt == 0 and self._authenticate(challenge):
                    continue
                raise UserError(self._http_error(exc.code, url)) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise UserError(
                    f"base image {self.image}: registry {self.ref.api_host} is unreachable: "
                    f"{reason}"
                ) from None
        raise AssertionError("unreachable")

    def _http_error(self, code: int, url: str) -> str:
        if code in (401, 403):
            hint = AUTH_HINT.format(host=self.ref.host)
            how = "with the given credentials" if self.credentials else "without credentials"
            return (
                f"base image {self.image}: registry {self.ref.api_host} refused access "
                f"({code} unauthorized {how}) — {hint}"
            )
        if code == 404:
            what = "manifest" if "/manifests/" in url else "blob"
            return (
                f"base image {self.image}: not found in registry {self.ref.api_host} "
                f"(no {what} {url.rsplit('/', 1)[-1]} in {self.ref.repository})"
            )
        return f"base image {self.image}: registry {self.ref.api_host} answered {code} for {url}"

    def _authenticate(self, challenge: str) -> bool:
        """Set the Authorization header a 401 challenge asks for; False if there is none."""
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.credentials or (self.authorization or "").startswith("Basic "):
                return False
            self.authorization = _basic(*self.credentials)
            return True
        if scheme.lower() != "bearer":
            return False
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        realm = fields.pop("realm", "")
        if not realm:
            return False
        query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in ("service",)})
        scope = fields.get("scope") or f"repository:{self.ref.repository}:pull"
        url = f"{realm}?{query}&scope={urllib.parse.quote(scope, safe=':/,')}"
        request = urllib.request.Request(url)
        if self.credentials:
            request.add_unredirected_header("Authorization", _basic(*self.credentials))
        try:
            with self.opener.open(request, timeout=TIMEOUT) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise UserError(self._http_error(exc.code, url)) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UserError(
                f"base image {self.image}: token service {realm} failed: "
                f"{getattr(exc, 'reason', exc)}"
            ) from None
        token = answer.get("token") or answer.get("access_token")
        if not token:
            return False
        self.authorization = f"Bearer {token}"
        return True

    def head_manifest(self) -> str | None:
        """The digest the registry serves for the reference, from one HEAD request."""
        with self.open(self.url("manifests", self.ref.reference), ", ".join(MANIFEST_TYPES),
                       method="HEAD") as response:  # fmt: skip
            digest = response.headers.get("Docker-Content-Digest")
        return digest if digest and DIGEST_RE.fullmatch(digest) else None

    def manifest(self, reference: str) -> tuple[dict[str, Any], str]:
        """A manifest or index and its digest (checked against the body)."""
        with self.open(self.url("manifests", reference), ", ".join(MANIFEST_TYPES)) as response:
            body = response.read(MAX_TEXT)
            served = response.headers.get("Docker-Content-Digest")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        for expected in (reference if reference.startswith("sha256:") else None, served):
            if expected and expected != digest:
                raise UserError(
                    f"base image {self.image}: the registry sent a manifest hashing to "
                    f"{digest}, not {expected}"
                )
        try:
            return json.loads(body), digest
        except ValueError:
            raise UserError(f"base image {self.image}: the manifest is not JSON") from None

    def blob(self, digest: str) -> Any:
        return self.open(self.url("blobs", digest))

    def json_blob(self, digest: str) -> dict[str, Any]:
        with self.blob(digest) as response:
            body = response.read(MAX_TEXT)
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise UserError(f"base image {self.image}: blob {digest} does not match its digest")
        return json.loads(body)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class _HashingReader:
    """Hashes a streamed blob as tarfile reads it, so a corrupt layer is noticed."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        return data

    def drain(self) -> str:
        while self.read(1 << 20):
            pass
        return "sha256:" + self.digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# The merged filesystem of one image, as far as the probe needs it
# ---------------------------------------------------------------------------------------------
# An entry is (kind, value): ("link", target), ("lib", soname or None, libc version or None),
# ("meta", (name, version)), ("text", str) for dpkg status and lists, ("ldcache", [(name, path)]),
# ("other", None) for a non-directory nobody reads (it hides what it replaces, then is dropped).
Entry = tuple[Any, ...]


@dataclass
class Layers:
    """Entries of interest after applying each layer and its whiteouts in order."""

    arch: Arch
    pythonpath: list[str]
    entries: dict[str, Entry] = field(default_factory=dict)

    def wanted(self, path: str) -> str | None:
        """What to read from a regular file at `path` (normalized, no leading slash)."""
        parent, name = posixpath.split(path)
        if path in (DPKG_STATUS, LD_CACHE):
            return "text" if path == DPKG_STATUS else "ldcache"
        if parent == DPKG_INFO.rstrip("/") and name.endswith(".list"):
            return "list"
        if LIBRARY.match(name) and parent in self.library_dirs():
            return "lib"
        if name in ("METADATA", "PKG-INFO"):
            info, package_dir = posixpath.basename(parent), posixpath.dirname(parent)
            if info.endswith((".dist-info", ".egg-info")) and package_dir in self.pythonpath:
                return "meta"
        return None

    def library_dirs(self) -> tuple[str, ...]:
        return (f"lib/{self.arch.triplet}", f"usr/lib/{self.arch.triplet}", "usr/local/lib")

    def apply(self, stream: IO[bytes]) -> None:
        """Read one layer tar (streamed) and lay it over the entries so far."""
        added: dict[str, Entry] = {}
        present: set[str] = set()  # every path this layer holds: it replaces the lower one
        hidden: set[str] = set()  # whiteouts: these paths and all under them go
        opaque: set[str] = set()  # directories whose lower contents go
        with tarfile.open(fileobj=stream, mode="r|*") as archive:
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
                    added[path] = ("link", member.linkname)
                elif member.islnk():
                    target = added.get(_normalize(member.linkname))
                    added[path] = target if target else ("other", None)
                elif member.isreg():
                    added[path] = self._read(archive, member, path)
                else:
                    added[path] = ("other", None)
        self._overlay(added, present, hidden, opaque)

    def _read(self, archive: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> Entry:
        kind = self.wanted(path)
        if kind is None:
            return ("other", None)
        limit = MAX_LIBRARY if kind == "lib" else MAX_TEXT
        if member.size > limit:
            return ("other", None)
        handle = archive.extractfile(member)
        data = handle.read() if handle else b""
        if kind == "lib":
            name = posixpath.basename(path)
            banner = LIBC_BANNER.search(data) if name == "libc.so.6" else None
            return ("lib", elf_soname(data, name), banner.group(1).decode() if banner else None)
        if kind == "meta":
            headers = email.parser.BytesHeaderParser().parsebytes(data)
            return ("meta", (headers.get("Name") or "", headers.get("Version") or ""))
        if kind == "ldcache":
            return ("ldcache", ld_cache_entries(data))
        text = data.decode("utf-8", "replace")
        if kind == "list":  # only the library paths matter: keep the record small
            text = "\n".join(p for p in text.splitlines() if LIBRARY.match(posixpath.basename(p)))
        return ("text", text)

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
        self.entries.update((p, e) for p, e in added.items() if e[0] != "other")

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
            if entry and entry[0] == "link" and hops < SYMLINK_HOPS:
                hops += 1
                target = entry[1]
                if target.startswith("/"):
                    resolved = []
                parts = [p for p in target.split("/") if p] + parts
                continue
            resolved.append(part)
        return "/".join(resolved)

    def facts(self) -> dict[str, Any]:
        """The same facts the engine probe's script prints, read from the merged layers."""
        status = self.entries.get(DPKG_STATUS)
        installed = _installed(status[1] if status and status[0] == "text" else "")
        owned: set[str] = set()
        for path, entry in self.entries.items():
            if path.startswith(DPKG_INFO) and entry[0] == "text":
                owned.update(self.realpath(p) for p in entry[1].splitlines())
        found: list[tuple[str, str]] = []  # (soname, path), as the engine's script collects
        ldcache = self.entries.get(LD_CACHE)
        if ldcache and ldcache[0] == "ldcache":
            found.extend((name, target.lstrip("/")) for name, target in ldcache[1])
        libc_banner = None
        directories = {self.realpath(d) for d in self.library_dirs()}
        for path in sorted(self.entries):
            parent, name = posixpath.split(path)
            if parent not in directories or name.startswith(".") or not LIBRARY.match(name):
                continue
            target = self.entries.get(self.realpath(path))
            if target and target[0] == "lib":
                if target[1]:
                    found.append((target[1], path))
                libc_banner = libc_banner or target[2]
            elif self.entries[path][0] == "link":  # a target outside the library directories
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
            if entry[0] != "meta" or not path.startswith(prefix):
                continue
            name, version = entry[1]
            if name and posixpath.dirname(posixpath.dirname(path)) + "/" == prefix:
                found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), version)
        return found


def _normalize(name: str) -> str:
    return posixpath.normpath("/" + name).lstrip("/") if name not in ("", ".", "./") else ""


def _under(path: str, prefixes: set[str]) -> bool:
    parent = posixpath.dirname(path)
    while parent:
        if parent in prefixes:
            return True
        parent = posixpath.dirname(parent)
    return False


def _installed(status: str) -> dict[str, str]:
    """Package -> version for every `install ok installed` stanza of a dpkg status file."""
    packages = {}
    for stanza in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1)
            for line in stanza.splitlines()
            if ": " in line and not line.startswith(" ")
        )
        if fields.get("Status") == "install ok installed" and "Package" in fields:
            packages[fields["Package"].split(":")[0]] = fields.get("Version", "")
    return packages


def _glibc(installed: Mapping[str, str], library_paths: Iterable[str], banner: str | None) -> str:
    match = DEBIAN_VERSION.match(installed.get("libc6", ""))
    if match:
        return match.group(1)
    for path in library_paths:
        match = LIBC_FILE.match(posixpath.basename(path))
        if match:
            return match.group(1)
    return banner or ""


def elf_soname(data: bytes, name: str) -> str | None:
    """DT_SONAME of a 64-bit little-endian ELF, its file name if it has none, None if not ELF.

    The same rule as the engine probe's script, on bytes already in memory.
    """
    if data[:6] != b"\x7fELF\x02\x01":
        return None
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize) for i in range(shnum)
        ]
        for _, kind, _, _, offset, size, link, _ in sections:
            if kind != SHT_DYNAMIC:
                continue
            for i in range(offset, offset + size - 15, 16):
                tag, value = struct.unpack_from("<qQ", data, i)
                if tag == DT_SONAME:
                    start = sections[link][4] + value
                    return data[start : start + 256].split(b"\0", 1)[0].decode()
        return name
    except (struct.error, IndexError, UnicodeDecodeError):
        return None


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
    except (struct.error, UnicodeDecodeError):
        return []


def _cstring(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode()


# ---------------------------------------------------------------------------------------------
# probe_registry
# ---------------------------------------------------------------------------------------------
def probe_registry(image: str, cache: Cache) -> BaseProfile:
    """The profile of `image` read from its registry; cached by the manifest (index) digest."""
    ref = parse_reference(image)
    client = RegistryClient(ref, image)
    digest = ref.reference if ref.is_digest else client.head_manifest()
    record = _cached(cache, digest) if digest else None
    if record is None:
        top, digest = client.manifest(digest or ref.reference)
        record = _cached(cache, digest)  # a registry that gave no digest to the HEAD
        if record is None:
            record = {"version": RECORD_VERSION, "digest": digest, "arches": {}}
            for arch, manifest in _platform_manifests(client, top):
                record["arches"][arch.name] = _probe_manifest(client, manifest, arch)
            if not record["arches"]:
                raise UserError(
                    f"base image {image}: the registry has no linux/amd64 or linux/arm64 image"
                )
            cache.put_record(RECORD_KIND, digest.removeprefix("sha256:"), record)
    return _profile(image, record)


def _cached(cache: Cache, digest: str) -> dict[str, Any] | None:
    record = cache.get_record(RECORD_KIND, digest.removeprefix("sha256:"))
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    return record


def _platform_manifests(
    client: RegistryClient, top: dict[str, Any]
) -> Iterator[tuple[Arch, dict[str, Any]]]:
    """(arch, image manifest) for amd64 and arm64: from an index, or the one manifest's config."""
    media = top.get("mediaType") or ""
    if media in INDEX_TYPES or "manifests" in top:
        for arch in ARCHES.values():
            for entry in top.get("manifests") or []:
                platform = entry.get("platform") or {}
                variant = platform.get("variant")
                if (
                    platform.get("os") == "linux"
                    and platform.get("architecture") == arch.name
                    and variant in (None, "", "v8" if arch.name == "arm64" else "")
                ):
                    yield arch, client.manifest(entry["digest"])[0]
                    break
        return
    config = client.json_blob(top["config"]["digest"])
    top = {**top, "_config": config}
    config_arch = ARCHES.get(config.get("architecture") or "")
    if config_arch is None:
        supported = ", ".join(ARCHES)
        raise UserError(
            f"base image {client.image} is {config.get('architecture')}; supported: {supported}"
        )
    yield config_arch, top


def _probe_manifest(client: RegistryClient, manifest: dict[str, Any], arch: Arch) -> dict:
    """Config facts and layer facts of one image manifest."""
    config_blob = manifest.get("_config") or client.json_blob(manifest["config"]["digest"])
    config = config_blob.get("config") or {}
    env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
    pythonpath = env.get("PYTHONPATH", "")
    layers = Layers(arch, [d.strip("/") for d in pythonpath.split(":") if d])
    for layer in manifest.get("layers") or []:
        media = layer.get("mediaType") or ""
        if any(word in media for word in ZSTD_TYPES):
            raise UserError(f"base image {client.image}: layer type {media} is not supported")
        if "foreign" in media or "nondistributable" in media:
            continue  # Windows-style foreign layers are never served by the registry
        with client.blob(layer["digest"]) as response:
            reader = _HashingReader(response)
            try:
                layers.apply(reader)  # type: ignore[arg-type]
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise UserError(
                    f"base image {client.image}: layer {layer['digest']} is unreadable: {exc}"
                ) from None
            if reader.drain() != layer["digest"]:
                raise UserError(
                    f"base image {client.image}: layer {layer['digest']} does not match its digest"
                )
    facts = layers.facts()
    facts["python"] = env.get("PYTHON_VERSION") or _python_from_packages(facts)
    facts["user"] = config.get("User") or ""
    facts["pythonpath"] = pythonpath
    return facts


def _python_from_packages(facts: Mapping[str, Any]) -> str:
    """`python3.13` 3.13.5-2 -> 3.13.5; the one /usr/bin/python3 runs, else the newest."""
    versions = facts.get("python_packages") or {}
    runs = posixpath.basename(facts.get("python3_link") or "")
    names = sorted(versions, key=lambda n: [int(x) for x in re.findall(r"\d+", n)], reverse=True)
    names.sort(key=lambda n: n.removesuffix("-minimal") != runs)
    for name in names:
        match = DEBIAN_VERSION.match(versions[name])
        if match:
            return match.group(1)
    return ""


def _profile(image: str, record: Mapping[str, Any]) -> BaseProfile:
    """The engine probe's profile shape: facts from amd64 when present, sonames per arch."""
    arches = record["arches"]
    main = arches.get("amd64") or next(iter(arches.values()))
    pythonpath = main["pythonpath"]
    distributions: dict[str, str] = {}
    for directory in (d.strip("/") for d in pythonpath.split(":") if d):  # first wins
        for name, version in main["distributions"].get(directory, {}).items():
            distributions.setdefault(name, version)
    sonames = {}
    packages = {}
    for arch in ARCHES.values():
        facts = arches.get(arch.name)
        if facts:
            sonames[arch.name] = frozenset(facts["sonames"])
            packages[arch.name] = frozenset(facts["packages"])
        else:
            observed = frozenset(main["packages"])
            sonames[arch.name] = packages_providing(observed, arch) | frozenset(main["unpackaged"])
            packages[arch.name] = observed
    digest = record["digest"]
    return BaseProfile(
        image=image,
        python_version=main["python"],
        glibc=main["glibc"],
        user=main["user"],
        pythonpath=pythonpath,
        distributions=distributions,
        sonames=sonames,
        packages=packages,
        digest=digest,
        source=f"registry {digest.removeprefix('sha256:')[:12]}",
    )
