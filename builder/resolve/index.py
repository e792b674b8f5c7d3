"""Get files from the package index into the content-addressed cache.

Downloads stream to disk in chunks and are checked against the sha256 the resolver locked;
a file already in the cache is never downloaded again. Index credentials given in an index
URL (`https://user:token@host/simple`) are sent only to that host and never printed.

An index has bad days as a registry does (a CDN's 5xx or 429, a dropped connection, a body cut
short): a listing or a download that faults is made again from its start, under the registry's
retry policy (builder.retry), and fails with the last fault only after its tries. A file that
does not hash to its lock is fetched again too (a cut or mangled body), then refused.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import os
import re
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache, partial
from html.parser import HTMLParser
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import unquote, urljoin

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from uv import find_uv_bin

from builder.cache import CHUNK, Cache, sha256_of
from builder.data import shipped_text
from builder.errors import UserError, shown
from builder.resolve.requirements import DEFAULT_INDEX
from builder.resolve.resolution import AUTH_FAILED, RemoteFile, authentication_failed, redact
from builder.retry import Faulted, Retries, Service, SteadyBody, reason, retryable, unresolvable

# Found once, at import: sysconfig, which find_uv_bin reads, is not thread-safe to initialize.
UV = find_uv_bin()
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
LINK_MAX = 4096  # bytes of a zip member holding a link's target (PATH_MAX)
BUILD_EPOCH = "315532800"  # 1980-01-01, the oldest time a zip (a wheel) can hold
# Files whose presence in a source distribution means it compiles native code.
COMPILED_SOURCES = re.compile(
    r"\.(c|cc|cpp|cxx|h|hpp|pyx|pxd|f|f90|rs|go|cu)$|(^|/)(Cargo\.toml|CMakeLists\.txt|meson\.build)$"
)


def authorization(url: str, indexes: Sequence[str]) -> str | None:
    """The Basic authorization for a request of `url`: from its own credentials, else from
    those of the last index at its origin (`_same_origin`: an http index's serve its https
    upgrade too). An index's never go to another host or port, nor over plain http when the
    index is https (a page may list its files anywhere)."""
    for candidate in (url, *reversed(indexes)):
        parts = urllib.parse.urlsplit(candidate)
        if parts.username is not None and _same_origin(candidate, url):
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return None


T = TypeVar("T")
# What a try of an index request may fail with and be tried again: no answer (refused, reset,
# closed, timed out, a trickle: builder.retry.Stalled), a body cut short, a retryable status
# (HTTPError is a URLError), a file not matching its lock (ValueError from the cache's writer).
INDEX_FAULTS = (urllib.error.URLError, OSError, http.client.HTTPException, ValueError)


def _index_fault(error: Exception) -> Faulted | None:
    """How a retry line names `error`'s answer, and its `Retry-After`; None when it is not one
    to try again (an answer for good, a name that does not resolve, or no fault of the index's
    at all)."""
    if not isinstance(error, INDEX_FAULTS):
        return None
    if isinstance(error, urllib.error.HTTPError):
        if not retryable(error.code):
            return None
        return Faulted(str(error.code), error.headers.get("Retry-After") if error.headers else None)
    if unresolvable(error):
        return None  # a name that does not resolve: seconds will not change it
    return Faulted(reason(error))


def retried(attempt: Callable[[], T], url: str, retries: Retries | None = None) -> T:
    """`attempt()` (a request to `url`) until it does not fault, through the run's one retry
    loop (builder.retry): bounded by its tries (not the registry's budget), each retry said and
    recorded as an index's. The last fault is raised as it is (the caller names it in its one
    line)."""
    retries = retries or Retries()
    parts = urllib.parse.urlsplit(url)
    where = (parts.netloc.rpartition("@")[2], f"GET {parts.path[:160]}")
    return retries.attempt(where, attempt, _index_fault, service=Service.INDEX)


def tls_context() -> ssl.SSLContext:
    """The verifying TLS context for the environment's trust store, one for the whole run.

    urllib makes a new context for each connection when it is given none, and each one loads
    the CA bundle again: about 20 ms of CPU a request, under the GIL; a set's listings and
    downloads number in the hundreds. The trust store is read from the environment as urllib
    would (SSL_CERT_FILE, SSL_CERT_DIR): another one gets its own context.
    """
    return _context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@cache
def _context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    del cert_file, cert_dir  # they key the cache; create_default_context reads them itself
    return ssl.create_default_context()


ADDRESS_TTL = 300.0  # seconds a host's looked-up addresses serve the run's new connections
# (host, port) -> (fresh until, the addresses: family and socket address, in the order tried)
_Address = tuple[socket.AddressFamily, tuple[Any, ...]]
_addresses: dict[tuple[str, int], tuple[float, tuple[_Address, ...]]] = {}
_addresses_lock = threading.Lock()
_lookup_locks: dict[tuple[str, int], threading.Lock] = {}  # one lookup of a host at a time
_lookup_failures: dict[tuple[str, int], tuple[float, OSError]] = {}  # when it last failed, how


def open_request(request: urllib.request.Request, timeout: float = 120):
    """urllib's `urlopen` of `request` for an index or a file host: the run's one TLS context
    (`tls_context`), the environment's proxies as urllib reads them, each host's addresses
    looked up once for the run's new connections (`_connect`), and no credential carried to
    another host by a redirect (`_CredentialsStay`)."""
    opener = urllib.request.build_opener(
        _HTTPHandler(), _HTTPSHandler(context=tls_context()), _CredentialsStay()
    )
    return opener.open(request, timeout=timeout)


class _CredentialsStay(urllib.request.HTTPRedirectHandler):
    """Redirects that drop the index's credentials when they lead to another origin, and the
    proxy's always.

    urllib copies a request's headers into the one a redirect makes, `Authorization` too: a
    private index that sends its files to a CDN or a bucket (a common layout) would hand the
    index's password to it. The same origin keeps them (`/simple/x` to `/simple/x/`). The
    proxy's `Proxy-Authorization` is a plain header too: copied to a host the environment
    reaches without the proxy (NO_PROXY), it would go there; the proxy handler adds it again
    to each request that goes through the proxy."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        made = super().redirect_request(req, fp, code, msg, headers, newurl)
        if made is None:
            return None
        made.remove_header("Proxy-authorization")  # as urllib's ProxyHandler spells it
        if not _same_origin(req.full_url, made.full_url):
            made.remove_header("Authorization")
        return made


def _same_origin(before: str, after: str) -> bool:
    """Whether credentials for `before` may go with a request of `after`: the same scheme,
    host and port, or the upgrade of an http origin to https on the default ports (as pip's
    requests allows); never to another host or port, nor from https to plain http."""
    old, new = _origin(before), _origin(after)
    return old == new or (old == ("http", new[1], 80) and new == ("https", old[1], 443))


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def _connect(
    address: tuple[str, int], timeout: float | None = None, source: tuple[str, int] | None = None
) -> socket.socket:
    """A connection to `address` through the host's remembered addresses, each tried in turn.

    urllib opens a connection for every request, and each one asks the resolver again: a
    set's listings and downloads are hundreds of lookups. A resolver that stalls (glibc waits
    5 s for an answer it lost; on the test machine one lookup in about 20) then costs more than
    the bytes: 29 of the 30 s the 40-library set's 421 MB took. So a host is looked up once
    and its addresses serve new connections for ADDRESS_TTL. An address that does not answer
    goes to the back for the connections after it; when none answers they are forgotten, so
    the retry that follows looks the host up again.
    """
    host, port = address
    failure: OSError | None = None
    for family, found in _looked_up(host, port):
        try:
            connection = _opened(family, found, timeout, source)
        except OSError as error:
            failure = error
            _tried_last(host, port, (family, found))
            continue
        return connection
    with _addresses_lock:
        _addresses.pop((host, port), None)
    assert failure is not None  # a lookup gives an address or raises
    raise failure


def _opened(
    family: socket.AddressFamily,
    address: tuple[Any, ...],
    timeout: float | None,
    source: tuple[str, int] | None,
) -> socket.socket:
    """A stream socket connected to `address` as the resolver gave it (an IPv6 one with its
    scope, which a bare address string loses), as socket.create_connection makes one."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if timeout is None or isinstance(timeout, int | float):  # not http.client's "default"
            sock.settimeout(timeout)
        if source is not None:
            sock.bind(source)
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _tried_last(host: str, port: int, failed: _Address) -> None:
    with _addresses_lock:
        remembered = _addresses.get((host, port))
        if remembered is not None and failed in remembered[1]:
            rest = tuple(one for one in remembered[1] if one != failed)
            _addresses[(host, port)] = (remembered[0], (*rest, failed))


def _looked_up(host: str, port: int) -> tuple[_Address, ...]:
    """`host`'s stream addresses, from the run's memory while fresh, else the resolver's: one
    lookup of a host at a time, so the downloads that start together do not each ask it; and
    those that waited for a lookup that failed share its failure rather than each asking in
    turn (a resolver that is down would cost each of them its timeout, one after another)."""
    key = (host, port)
    asked = time.monotonic()
    with _addresses_lock:
        lock = _lookup_locks.setdefault(key, threading.Lock())
    with lock:
        now = time.monotonic()
        with _addresses_lock:
            remembered, failed = _addresses.get(key), _lookup_failures.get(key)
        if remembered is not None and remembered[0] > now:
            return remembered[1]
        if failed is not None and failed[0] >= asked:  # it failed while this one waited
            raise failed[1]
        try:
            answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            with _addresses_lock:
                _lookup_failures[key] = (time.monotonic(), error)
            raise
        found = tuple(dict.fromkeys((answer[0], answer[4]) for answer in answers))
        with _addresses_lock:
            _addresses[key] = (now + ADDRESS_TTL, found)
            _lookup_failures.pop(key, None)
        return found


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _connect


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _connect  # the TLS name stays the host's: SNI, verification


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self.tls = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self.tls)


def _open(url: str, indexes: Sequence[str], accept: str | None = None):
    request = urllib.request.Request(redact(url))
    auth = authorization(url, indexes)
    if auth:
        request.add_header("Authorization", auth)
    if accept:
        request.add_header("Accept", accept)
    return open_request(request)


def download(
    file: RemoteFile, cache: Cache, indexes: Sequence[str] = (), retries: Retries | None = None
) -> Path:
    """The cached copy of `file`, downloading it (streamed, hash-checked) only if missing,
    trying again on faults as the run's `retries` say."""
    return cache.made_once(
        "download",
        file.sha256,
        lambda: cache.find_blob(file.sha256, file.filename),
        lambda: _fetch(file, cache, indexes, retries),
    )


def _fetch(file: RemoteFile, cache: Cache, indexes: Sequence[str], retries: Retries | None) -> Path:
    """Stream `file` into the cache, checking its hash; one line naming it when that fails."""
    try:
        if file.url.startswith("file://"):
            source = Path(urllib.parse.unquote(urllib.parse.urlsplit(file.url).path))
            with cache.writing_blob(file.sha256, file.filename) as out, source.open("rb") as src:
                shutil.copyfileobj(src, out, CHUNK)
        else:
            retried(lambda: _download_once(file, cache, indexes), file.url, retries)
    except ValueError as error:
        raise UserError(str(error)) from None
    except INDEX_FAULTS as error:
        raise UserError(
            f"{file.filename}: download from {redact(file.url)} failed ({error})"
        ) from None
    return cache.blob_path(file.sha256, file.filename)


def _download_once(file: RemoteFile, cache: Cache, indexes: Sequence[str]) -> None:
    """One try: the whole file, from its first byte (a partial file is never kept)."""
    with (
        cache.writing_blob(file.sha256, file.filename) as out,
        _open(file.url, indexes) as response,
    ):
        shutil.copyfileobj(SteadyBody(response), out, CHUNK)  # a file cut short: its hash


def download_all(
    files: Sequence[RemoteFile], cache: Cache, indexes: Sequence[str] = (), workers: int = 8
) -> dict[str, Path]:
    """Download in parallel; sha256 -> cached path."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        started = start_downloads(files, cache, indexes, pool)
        return {sha256: future.result() for sha256, future in started.items()}


def start_downloads(
    files: Sequence[RemoteFile],
    cache: Cache,
    indexes: Sequence[str],
    pool: ThreadPoolExecutor,
    retries: Retries | None = None,
    check: Callable[[Path], object] | None = None,
) -> dict[str, Future[Path]]:
    """Start each distinct file's download on `pool`: sha256 -> its cached path, when done.

    A caller can work on each wheel as it arrives (inspection) instead of after the last one.
    `check` is run on each file before its future says it is here (builder.inspect.members'
    bounds): what refuses it fails the future, so nothing that waits on it reads the file.
    """
    unique = {file.sha256: file for file in files}
    return {
        sha256: pool.submit(_download_checked, file, cache, indexes, retries, check)
        for sha256, file in unique.items()
    }


def _download_checked(
    file: RemoteFile,
    cache: Cache,
    indexes: Sequence[str],
    retries: Retries | None,
    check: Callable[[Path], object] | None,
) -> Path:
    path = download(file, cache, indexes, retries)
    if check is not None:
        check(path)
    return path


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def index_files(
    indexes: Sequence[str], name: str, retries: Retries | None = None
) -> list[RemoteFile]:
    """Every file with a sha256 that the indexes list for a project (PEP 691, or PEP 503 HTML),
    each listing tried again on faults as the run's `retries` say."""
    files: list[RemoteFile] = []
    for index in indexes or (DEFAULT_INDEX,):
        page = f"{index.rstrip('/')}/{canonicalize_name(name)}/"
        try:
            content_type, body = retried(partial(_listing, page, indexes), page, retries)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                continue
            if error.code in AUTH_FAILED:
                status = f"{error.code} {error.reason}"
                raise UserError(f"{name}: {authentication_failed(index, status)}") from None
            raise UserError(f"{name}: index {redact(index)} answered {error.code}") from None
        except INDEX_FAULTS as error:
            why = error.reason if isinstance(error, urllib.error.URLError) else error
            raise UserError(f"{name}: index {redact(index)} unreachable ({why})") from None
        if SIMPLE_JSON in content_type:  # PEP 691 names each file: no URL to take apart
            entries = [
                (
                    entry["url"],
                    entry.get("hashes", {}).get("sha256"),
                    entry.get("upload-time"),
                    bool(entry.get("yanked")),
                    entry.get("filename"),
                )
                for entry in json.loads(body)["files"]
            ]
        else:
            parser = _Anchors()
            parser.feed(body.decode("utf-8", "replace"))
            entries = []
            for link in parser.links:
                url, _, fragment = link.partition("#")
                sha256 = fragment[7:] if fragment.startswith("sha256=") else None
                entries.append((url, sha256, None, False, None))
        for url, sha256, uploaded, yanked, named in entries:
            if not sha256:
                continue
            # urljoin and urlsplit cost ~30 us a file: 0.8 s for the ~25,000 a set lists
            absolute = url if url.startswith(("https://", "http://")) else urljoin(page, url)
            filename = named or unquote(urllib.parse.urlsplit(absolute).path.rsplit("/", 1)[1])
            files.append(RemoteFile(filename, absolute, sha256, None, uploaded, yanked))
    return files


def wheelhouse_files(locations: Sequence[str], name: str) -> list[RemoteFile]:
    """Every wheel and sdist of project `name` in the wheelhouse directories among `locations`
    (a page of links is uv's to read): what a set may build from besides its indexes, and all
    it may build from with `--no-index`."""
    wanted = canonicalize_name(name)
    found = []
    for location in locations:
        directory = Path(location)
        if location.startswith(("http://", "https://")) or not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.is_file() and _project_of(path.name) == wanted:
                found.append(RemoteFile(path.name, path.as_uri(), sha256_of(path)))
    return found


def _project_of(filename: str) -> str | None:
    """The normalized project a wheel's or sdist's file name names; None for anything else."""
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[0])
        return str(parse_sdist_filename(filename)[0])
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None


def _listing(page: str, indexes: Sequence[str]) -> tuple[str, bytes]:
    """A project page's content type and whole body (one try; cut short or stalled, a fault)."""
    with _open(page, indexes, accept=f"{SIMPLE_JSON}, text/html;q=0.1") as response:
        body = SteadyBody(response).read()
        missing = getattr(response, "length", None)  # an HTTP answer's bytes still expected
        if missing:  # what http.client's own read() would have raised
            raise http.client.IncompleteRead(body, missing)
        return response.headers.get("Content-Type", ""), body


def compiled_code_evidence(sdist: Path) -> str | None:
    """The first member of a source distribution that shows it compiles native code."""
    try:
        if sdist.name.endswith(".zip"):
            with zipfile.ZipFile(sdist) as archive:
                names = archive.namelist()
        else:
            with tarfile.open(sdist) as archive:
                names = archive.getnames()
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as error:
        raise UserError(f"{sdist.name}: unreadable source distribution ({error})") from None
    return next((name for name in names if COMPILED_SOURCES.search(name)), None)


def _archive_links(sdist: Path) -> list[tuple[str, str, bool]]:
    """(member, target, hard) of each link a source distribution holds; ("member", "", False)
    for each other member, so that a path through a link is seen too."""
    if not sdist.name.endswith(".zip"):
        with tarfile.open(sdist) as archive:
            return [(m.name, m.linkname, m.islnk()) for m in archive.getmembers()]
    found = []
    with zipfile.ZipFile(sdist) as archive:
        for info in archive.infolist():
            link = stat.S_ISLNK(info.external_attr >> 16) and info.file_size <= LINK_MAX
            target = archive.read(info).decode(errors="surrogateescape") if link else ""
            found.append((info.filename.removesuffix("/"), target, False))
    return found


def link_out(members: Sequence[tuple[str, str, bool]]) -> tuple[str, str] | None:
    """The first (member, target) of an archive's `members` (`_archive_links`) that leads out
    of it once unpacked: an absolute or `..` path, a symbolic link whose target (from its own
    directory) or a hard link whose target (from the root) climbs out, or either of them or a
    member reached through another link. Judged on the names alone, before anything is
    unpacked: a link through a link could lead anywhere, so it is refused too."""
    links = {name.strip("/") for name, target, _ in members if target}
    for name, target, hard in members:
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if name.startswith("/") or ".." in parts:
            return name, name
        if any("/".join(parts[:end]) in links for end in range(1, len(parts))):
            return name, name  # under a linked directory
        if target and _climbs_out([] if hard else parts[:-1], target, links):
            return name, target
    return None


def _climbs_out(start: list[str], target: str, links: set[str]) -> bool:
    if target.startswith("/"):
        return True
    where = list(start)
    steps = [step for step in target.split("/") if step not in ("", ".")]
    for index, step in enumerate(steps):
        if step == "..":
            if not where:
                return True
            where.pop()
        else:
            where.append(step)
            if index < len(steps) - 1 and "/".join(where) in links:
                return True  # through another link: wherever that one leads
    return False


def _refuse_links_out(sdist: Path, label: str) -> None:
    """Refuse a source distribution with a link out of it (`link_out`): its build would read
    the host's file into the wheel. `label` names it (its requirement, or its file name)."""
    try:
        found = link_out(_archive_links(sdist))
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as error:
        raise UserError(f"{label}: unreadable source distribution ({error})") from None
    if found:
        member, target = found
        raise UserError(
            f"{label}: {shown(member)} links outside the source distribution ({shown(target)})"
        )


def build_pure_wheel(
    sdist: Path,
    source: RemoteFile,
    cache: Cache,
    options: Sequence[str] = (),
    label: str = "",
) -> tuple[Path, str]:
    """Build a pure-Python sdist into a wheel on the host, cached by the sdist's hash, once no
    link in it leads out (`_refuse_links_out`; `label` names it, its file name by default).

    The wheel's sdist is recorded by the wheel's hash, for `built_source` to find. `options`
    say where its build backend comes from (`build_options`), PyPI when none.
    """
    _refuse_links_out(sdist, label or sdist.name)
    record = cache.get_record("built", source.sha256)
    if record and (found := cache.find_blob(record["sha256"], record["filename"])):
        path, sha256 = found, str(record["sha256"])
    else:
        path, sha256 = _build(sdist, cache, options=options)
        cache.put_record("built", source.sha256, {"filename": path.name, "sha256": sha256})
    origin = {"filename": source.filename, "url": redact(source.url), "sha256": source.sha256}
    cache.put_record("built-from", sha256, origin)
    return path, sha256


def _build(
    sdist: Path, cache: Cache, label: str = "", options: Sequence[str] = ()
) -> tuple[Path, str]:
    """`sdist` (or a project directory) built into a pure wheel in the cache; `label` names it
    in an error (its file name when not given). Built at a fixed SOURCE_DATE_EPOCH, so the same
    source gives the same wheel (a rebuild of a pinned commit is no change)."""
    label = label or sdist.name
    with tempfile.TemporaryDirectory(prefix="bsi-build-") as out:
        result = run_uv(
            [UV, "build", "--wheel", "--quiet", *options, "--out-dir", out, str(sdist)],
            cache,
            {"SOURCE_DATE_EPOCH": BUILD_EPOCH},
            runs_project_code=True,
        )
        wheels = list(Path(out).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            last = (result.stderr.strip().splitlines() or ["no wheel produced"])[-1]
            raise UserError(f"{label}: building a wheel from source failed ({redact(last)})")
        tags = parse_wheel_filename(wheels[0].name)[3]
        if any(tag.abi != "none" or tag.platform != "any" for tag in tags):
            raise UserError(f"{label}: the source distribution builds compiled code")
        return cache.add_blob(wheels[0], wheels[0].name)


def build_tree(
    project: Path, cache: Cache, label: str, options: Sequence[str] = ()
) -> tuple[Path, str]:
    """A pure-Python project directory (a local one, a repository's export) built into a wheel
    in the cache, its sha256; `label` (file:line) names it when the build fails."""
    return _build(project, cache, label, options)


def build_options(no_index: bool, find_links: Sequence[str]) -> list[str]:
    """`uv build`'s sources for build backends: an air-gapped set (`--no-index`) takes them
    from its wheelhouses only, as it takes everything else; otherwise PyPI, as pip would."""
    if not no_index:
        return []
    return ["--no-index", *(f"--find-links={location}" for location in find_links)]


def built_source(wheel_sha256: str, cache: Cache) -> RemoteFile | None:
    """The sdist a wheel in the cache was built from (`build_pure_wheel`), if it was."""
    record = cache.get_record("built-from", wheel_sha256)
    if not record:
        return None
    return RemoteFile(record["filename"], record["url"], record["sha256"])


def uv_python() -> list[str]:
    """`--python` naming this interpreter, for `uv pip compile`.

    Left to itself uv runs every python on PATH to find one (behind pyenv shims about 0.6 s of
    a 1 s resolution). With --python-version and --python-platform given and wheels only, the
    interpreter only fills in the CPython markers, so any CPython gives the same lock.
    """
    return ["--python", sys.executable] if sys.executable else []


# uv retries a request that failed on the network or with a 5xx/429 this many times, with
# backoff (UV_HTTP_RETRIES; its default is 3). Set explicitly so that the resolution weathers an
# index's bad day as the registry client does, and an operator's own setting still wins.
UV_HTTP_RETRIES = "5"


def uv_environment(uv_cache: Path) -> Mapping[str, str]:
    """uv's environment: its retries, never an interpreter download (none can be reached), no
    configuration file of its own, and its cache `uv_cache`, inside the tool's
    (builder.cache.Cache.uv_cache): under --cache-dir and the bound, not in ~/.cache/uv."""
    return {
        "UV_HTTP_RETRIES": UV_HTTP_RETRIES,
        **os.environ,
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_CACHE_DIR": str(uv_cache),
        # the tool's options are uv's only settings: a uv.toml or pyproject [tool.uv] in the
        # team's folder (or the runner's ~/.config/uv) must not swap the index or add one
        "UV_NO_CONFIG": "1",
    }


# uv's options that may carry a URL's user:password@, each with its variable and the separator
# of that variable's list (uv's own): given there, no other user of the runner reads them in
# the process table (`ps`, /proc/PID/cmdline), which anyone may; the environment only its owner.
_LOCATION_OPTIONS = MappingProxyType(
    {
        "--index-url": ("UV_INDEX_URL", ""),
        "--extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
        "--find-links": ("UV_FIND_LINKS", ","),
    }
)


def credentials_off_command(command: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """`command` with every option of a kind in `_LOCATION_OPTIONS` moved to uv's environment
    when one of its values holds credentials (the whole kind, so uv keeps their order); a kind
    whose values its separator would split stays on the command line."""
    values: dict[str, list[str]] = {}
    for option, value in itertools.pairwise(command):
        if option in _LOCATION_OPTIONS:
            values.setdefault(option, []).append(value)
    moved = {
        option
        for option, found in values.items()
        if any("@" in urllib.parse.urlsplit(value).netloc for value in found)
        and _joinable(found, _LOCATION_OPTIONS[option][1])
    }
    kept: list[str] = []
    skip = False
    for index, word in enumerate(command):
        if skip:
            skip = False
        elif word in moved and index + 1 < len(command):
            skip = True
        else:
            kept.append(word)
    env = {
        _LOCATION_OPTIONS[option][0]: _LOCATION_OPTIONS[option][1].join(values[option])
        for option in moved
    }
    return kept, env


def _joinable(values: Sequence[str], separator: str) -> bool:
    """Whether uv reads `values` back whole from one variable joined by `separator` ("": a
    variable of one value)."""
    return len(values) == 1 if not separator else not any(separator in v for v in values)


# What a source build's backend may see of the runner's environment: what reaching an index
# takes (the search path, the locale, TLS trust, proxies) and uv's own settings; never the
# variables a CI runner keeps its keys and passwords in.
_BUILD_ENVIRONMENT = re.compile(
    r"PATH|HOME|LANG|LC_[A-Z]+|TZ|TMPDIR|SSL_CERT_(?:FILE|DIR)|NETRC|UV_[A-Z0-9_]+"
    r"|(?i:(?:http|https|no|all)_proxy)"
)


def run_uv(
    command: Sequence[str],
    cache: Cache,
    env: Mapping[str, str] | None = None,
    *,
    runs_project_code: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run uv (its output captured) with its cache in `cache`, held while it runs so that a
    prune meanwhile leaves it; `env` is set under uv's environment. Index and link locations
    that hold credentials go to uv through its environment (`credentials_off_command`).
    `runs_project_code`: uv runs a project's build backend (`uv build`), code the team wrote,
    so it gets only `_BUILD_ENVIRONMENT`'s variables of the runner's."""
    argv, locations = credentials_off_command(command)
    with cache.uv_cache() as uv_cache:
        environment = {**(env or {}), **uv_environment(uv_cache), **locations}
        if runs_project_code:
            environment = {
                name: value
                for name, value in environment.items()
                if _BUILD_ENVIRONMENT.fullmatch(name) or name in (env or {}) or name in locations
            }
        return subprocess.run(argv, capture_output=True, text=True, env=environment)


def builder_pip(cache: Cache, indexes: Sequence[str]) -> Path:
    """The pinned pip wheel the builder stage runs, from the cache or the index."""
    pinned = tomllib.loads(shipped_text("builder-tools.toml"))["pip"]
    found = cache.find_blob(pinned["sha256"], pinned["filename"])
    if found:
        return found
    listed = {f.filename: f for f in index_files(indexes, "pip")}
    if pinned["filename"] not in listed:
        raise UserError(f"{pinned['filename']}: the builder's pinned pip is not on the index")
    url = listed[pinned["filename"]].url
    return download(RemoteFile(pinned["filename"], url, pinned["sha256"]), cache, indexes)
