"""Direct requirements made into wheels in the cache, ready for the resolver.

Each path, URL or repository a requirements file names (builder.resolve.direct.lines)
becomes one wheel: a wheel is used as it is (its tags are the resolver's to check); an sdist,
or a project directory or repository export, of a pure-Python project is built once on the
host as index sdists are (builder.resolve.index.build_pure_wheel), and refused in one line when
it compiles native code. The resolver is then given the wheel by its path in the cache
(`name @ file://…`), so it never sees a URL's credentials, and each distribution keeps its
`Source` for the records.

A URL is fetched with its credentials sent to its own host only (not along a redirect), and
checked against its `--hash` when the line gives one; the sha256 is recorded either way.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from builder.cache import CHUNK, Cache, sha256_of
from builder.errors import UserError
from builder.resolve.direct.lines import DirectSource
from builder.resolve.direct.trees import refuse_links_out
from builder.resolve.direct.vcs import export, resolve_commit
from builder.resolve.index import (
    COMPILED_SOURCES,
    INDEX_FAULTS,
    authorization,
    build_options,
    build_pure_wheel,
    build_tree,
    compiled_code_evidence,
    open_request,
    retried,
)
from builder.resolve.requirements import NamedRequirement, RequirementSet, check_regular
from builder.resolve.resolution import (
    AUTH_FAILED,
    RemoteFile,
    Source,
    SourceKind,
    authentication_failed,
    redact,
)
from builder.resolve.target import Arch, BaseFacts, Target
from builder.retry import Retries, SteadyBody

SKIPPED_DIRECTORIES = frozenset({".git", ".hg", ".venv", "venv", "__pycache__", "node_modules"})


@dataclass(frozen=True)
class Fetched:
    """A direct requirement's wheel in the cache and where it came from."""

    requirement: NamedRequirement
    wheel: Path
    source: Source

    def line(self) -> str:
        """The requirement as the resolver gets it: the name, extras and marker, at the wheel."""
        requirement = self.requirement.requirement
        extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        marker = f" ; {requirement.marker}" if requirement.marker else ""
        return f"{requirement.name}{extras} @ {self.wheel.as_uri()}{marker}"


@dataclass(frozen=True)
class _Fetching:
    """What every fetch of one run shares: the cache, its retries, uv build's sources."""

    cache: Cache
    retries: Retries | None
    options: Sequence[str]  # builder.resolve.index.build_options


def fetch_all(
    requirements: RequirementSet, cache: Cache, retries: Retries | None = None
) -> tuple[Fetched, ...]:
    """Every direct requirement as a wheel in the cache, in order; once for a requirement set,
    whichever of its arches asks first."""
    run = _Fetching(cache, retries, build_options(requirements.no_index, requirements.find_links))
    return requirements.fetched.get(lambda: tuple(fetch(r, run) for r in requirements.direct()))


def refuse_unfit(
    fetched: tuple[Fetched, ...], target: Target[BaseFacts], arch: Arch
) -> tuple[Fetched, ...]:
    """`fetched`, once no wheel in it is one the target's `arch` cannot install where its line
    applies (refused naming the line): a wheel for one arch is that arch's, as a marker says."""
    environment = target.marker_environment(arch)
    for one in fetched:
        tags = frozenset(parse_wheel_filename(one.wheel.name)[3])
        if one.requirement.applies(environment) and target.tag_rank(arch, tags) is None:
            raise UserError(
                f"{one.requirement.origin}: {one.wheel.name} does not install on CPython"
                f" {target.python_version} {arch.machine}; keep it to its arch with a marker"
                " (`; platform_machine == '…'`) or give a wheel for each"
            )
    return fetched


def fetch(requirement: NamedRequirement, run: _Fetching) -> Fetched:
    """One direct requirement's wheel: read, downloaded or built; checked against its name."""
    source = requirement.direct
    assert source is not None
    if source.kind is SourceKind.VCS:
        wheel, record = _from_repository(source, run)
    elif source.kind is SourceKind.URL:
        wheel, record = _from_url(requirement, source, run)
    else:
        wheel, record = _from_path(requirement, source, run)
    built = canonicalize_name(parse_wheel_filename(wheel.name)[0])
    if built != requirement.name:
        raise UserError(
            f"{source.origin}: {source.shown} is the project {built}, not {requirement.name}"
        )
    return Fetched(requirement, wheel, record)


def _checked(requirement: NamedRequirement, source: DirectSource, sha256: str) -> None:
    """Refuse a file whose sha256 is not among the line's `--hash`es (when it gives any)."""
    if requirement.hashes and sha256 not in requirement.hashes:
        given = ", ".join(f"sha256:{h}" for h in sorted(requirement.hashes)[:3])
        raise UserError(
            f"{source.origin}: {source.shown} has sha256:{sha256}, not the --hash given ({given})"
        )


def _from_path(
    requirement: NamedRequirement, source: DirectSource, run: _Fetching
) -> tuple[Path, Source]:
    path = Path(source.target)
    if path.is_dir():
        refuse_links_out(path, f"{source.origin}: {source.shown}")
        _refuse_native_tree(path, source)
        wheel, _ = build_tree(path, run.cache, source.origin, run.options)
        return wheel, Source(SourceKind.PATH, str(path))
    check_regular(path, "wheel or source distribution")  # a FIFO, /dev/zero: never ends
    sha256 = sha256_of(path)
    _checked(requirement, source, sha256)
    cached, _ = run.cache.add_blob(path, path.name)
    record = Source(SourceKind.PATH, str(path), sha256=sha256)
    return _wheel_of(cached, sha256, path.as_uri(), source, run), record


def _wheel_of(file: Path, sha256: str, url: str, source: DirectSource, run: _Fetching) -> Path:
    """The file itself when it is a wheel; the wheel built from it when it is a pure sdist."""
    if file.name.endswith(".whl"):
        return file
    if evidence := compiled_code_evidence(file):
        raise UserError(
            f"{source.origin}: {source.shown} compiles native code ({evidence}); only"
            " pure-Python projects are built here: give a wheel for the target"
        )
    origin = RemoteFile(file.name, redact(url), sha256)
    label = f"{source.origin}: {source.shown}"
    wheel, _ = build_pure_wheel(file, origin, run.cache, run.options, label)
    return wheel


def _refuse_native_tree(path: Path, source: DirectSource) -> None:
    """A project directory with native sources is refused, as an sdist with them is."""
    for root, directories, files in os.walk(path):
        directories[:] = [d for d in directories if d not in SKIPPED_DIRECTORIES]
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), path)
            if COMPILED_SOURCES.search(relative):
                raise UserError(
                    f"{source.origin}: {source.shown} compiles native code ({relative}); only"
                    " pure-Python projects are built here: give a wheel for the target"
                )


def _from_repository(source: DirectSource, run: _Fetching) -> tuple[Path, Source]:
    """The wheel of the commit `source`'s ref names now, built once per commit and directory."""
    commit = resolve_commit(source)
    location = f"git+{source.shown}"
    record = Source(SourceKind.VCS, location, "", commit, source.ref, source.subdirectory)
    key = hashlib.sha256(json.dumps([source.shown, commit, source.subdirectory]).encode())
    built = run.cache.get_record("vcs-built", key.hexdigest())
    if built and (found := run.cache.find_blob(built["sha256"], built["filename"])):
        return found, record
    with tempfile.TemporaryDirectory(prefix="bsi-export-") as temp:
        project = export(source, commit, Path(temp))
        _refuse_native_tree(project, source)
        wheel, sha256 = build_tree(project, run.cache, source.origin, run.options)
    run.cache.put_record("vcs-built", key.hexdigest(), {"filename": wheel.name, "sha256": sha256})
    return wheel, record


def _from_url(
    requirement: NamedRequirement, source: DirectSource, run: _Fetching
) -> tuple[Path, Source]:
    """The file at a URL (from the cache when its `--hash` is known and there), hash-checked."""
    filename = urllib.parse.unquote(urllib.parse.urlsplit(source.target).path.rsplit("/", 1)[-1])
    known = [(found, h) for h in requirement.hashes if (found := run.cache.find_blob(h, filename))]
    path, sha256 = known[0] if known else _download(source, filename, run.cache, run.retries)
    _checked(requirement, source, sha256)
    record = Source(SourceKind.URL, source.shown, sha256=sha256, subdirectory=source.subdirectory)
    return _wheel_of(path, sha256, source.target, source, run), record


def _download(
    source: DirectSource, filename: str, cache: Cache, retries: Retries | None
) -> tuple[Path, str]:
    """Stream the URL into a temporary file, then into the cache by its sha256."""
    with tempfile.TemporaryDirectory(prefix="bsi-url-") as temp:
        target = Path(temp) / filename
        try:
            retried(lambda: _download_once(source.target, target), source.shown, retries)
        except INDEX_FAULTS as error:
            why = getattr(error, "reason", None) or error
            if isinstance(error, urllib.error.HTTPError):
                why = f"HTTP {error.code} {error.reason}"
                if error.code in AUTH_FAILED:
                    why = authentication_failed(source.target, why)
            raise UserError(
                f"{source.origin}: download of {source.shown} failed ({redact(str(why))})"
            ) from None
        return cache.add_blob(target, filename)


def _download_once(url: str, target: Path) -> None:
    """One try, from the first byte; credentials only to the URL's own host (not redirected)."""
    request = urllib.request.Request(redact(url))
    if (auth := authorization(url, ())) is not None:
        request.add_unredirected_header("Authorization", auth)
    opened = open_request(request)
    with opened as response, target.open("wb") as out:
        body = SteadyBody(response)
        while chunk := body.read(CHUNK):
            out.write(chunk)
