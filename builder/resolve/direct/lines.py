"""Requirement lines that name a file, a URL or a repository instead of an index project.

Pure parsing, apart from the fetching (builder.resolve.direct.fetch and .vcs), so a
requirements file is checked whole before anything is downloaded or cloned:

- a path: `./vendor/acme_auth-2.1-py3-none-any.whl`, `vendor/acme-auth-2.1.tar.gz`, `./tools`
  (relative to the file that names it) or `acme-auth @ file:///srv/wheels/…whl`;
- a URL: `acme-auth @ https://host/acme_auth-2.1-py3-none-any.whl` (plain http only to this
  machine), credentials from `${VAR}` in it;
- a repository: `acme-tools @ git+https://host/acme/tools@v1.4.0#subdirectory=lib`, also
  `git+ssh://` and `git+file://`; no ref means the default branch.

The URL as fetched keeps its credentials (they are needed to fetch it) and is never printed:
`shown` is what any message or record says.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)

from builder.errors import UserError
from builder.reporter import excerpt
from builder.resolve.resolution import SourceKind, redact

VCS_SCHEMES = ("git+https", "git+http", "git+ssh", "git+file")
# A ref git will take as a name and never as an option: no leading dash, no `..`, no spaces.
REF = re.compile(r"(?!-)(?!.*\.\.)[A-Za-z0-9._/+-]{1,200}")
SUBDIRECTORY = re.compile(r"(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9._/-]{1,200}")
SDISTS = (".tar.gz", ".zip", ".tgz", ".tar.bz2", ".tar.xz")


@dataclass(frozen=True)
class DirectSource:
    """What one direct requirement line asks for, checked but not fetched."""

    kind: SourceKind
    target: str = field(repr=False)  # an absolute path, or the URL with its credentials
    origin: str  # "file:line", for messages
    ref: str = ""  # VCS: the tag, branch or commit as written ("": the default branch)
    subdirectory: str = ""  # where the project is inside a repository or archive

    @property
    def shown(self) -> str:
        """What messages and records say: the path, or the URL without credentials."""
        return self.target if self.kind is SourceKind.PATH else redact(self.target)


def is_direct_url(text: str) -> bool:
    """Whether `text` (a line's requirement part) starts with a URL rather than a name."""
    return re.match(r"^[a-z][a-z0-9+.-]*://", text, re.I) is not None


def from_url(name: str, url: str, origin: str, base: Path) -> DirectSource:
    """`name @ url`'s source: a file, a download or a repository, refused when not usable."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "file":
        path = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
        return local_path(str(path), origin, base)
    if scheme in VCS_SCHEMES:
        return _vcs(url, origin)
    if scheme in ("http", "https"):
        _check_http(url, scheme, origin)
        if _fragment(url, origin):
            raise UserError(f"{origin}: {name}: subdirectory= is for git repositories only")
        return DirectSource(SourceKind.URL, url, origin)
    if not scheme:  # `name @ ./vendor/x.whl`, as uv accepts
        return local_path(url, origin, base)
    raise UserError(
        f"{origin}: {name}: URL scheme {scheme or '(none)'!r} is not supported (https, http to"
        " this machine, file, git+https, git+ssh, git+file)"
    )


def local_path(text: str, origin: str, base: Path) -> DirectSource:
    """A path line (relative to the file naming it), which must exist."""
    path = Path(os.path.normpath(base.absolute() / Path(text).expanduser()))
    if not path.exists():
        raise UserError(f"{origin}: local path {excerpt(text)} does not exist")
    if not (path.is_dir() or path.name.endswith((".whl", *SDISTS))):
        raise UserError(
            f"{origin}: local path {excerpt(text)} is not a wheel, a source archive or a directory"
        )
    return DirectSource(SourceKind.PATH, str(path), origin)


def path_name(path: Path, origin: str) -> str:
    """The project name a wheel's or sdist's file name, or a directory's pyproject.toml, gives."""
    try:
        if path.name.endswith(".whl"):
            return str(parse_wheel_filename(path.name)[0])
        if path.is_file():
            return str(parse_sdist_filename(path.name)[0])
    except (InvalidWheelFilename, InvalidSdistFilename):
        raise UserError(f"{origin}: {path.name!r} is not a valid wheel or sdist name") from None
    try:
        name = tomllib.loads((path / "pyproject.toml").read_text())["project"]["name"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        name = None
    if not isinstance(name, str):
        raise UserError(
            f"{origin}: {path.name!r} has no [project] name in a pyproject.toml;"
            " name it: `name @ file://…`"
        )
    return name


def url_name(url: str, origin: str) -> str:
    """The project name of a bare URL line: from the wheel or sdist file name it ends in."""
    if url.lower().startswith("git+"):
        raise UserError(f"{origin}: a repository needs a name: `name @ {redact(url)[:60]}`")
    last = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not last.endswith((".whl", *SDISTS)):
        raise UserError(f"{origin}: a URL that is not a wheel or sdist needs a name: `name @ URL`")
    return path_name(Path(last), origin)


def named(name_part: str, marker: str, origin: str) -> Requirement:
    """The requirement a direct line stands for in the resolution: its name, extras, marker."""
    text = f"{name_part}; {marker}" if marker else name_part
    try:
        return Requirement(text)
    except InvalidRequirement as error:
        raise UserError(f"{origin}: invalid requirement ({str(error).splitlines()[0]})") from None


def _check_http(url: str, scheme: str, origin: str) -> None:
    """Plain http only to this machine: elsewhere the file and any credentials travel in clear."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if scheme == "http" and not _loopback(host):
        raise UserError(
            f"{origin}: {redact(url)[:80]}: plain http is allowed only to this machine; use https"
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _fragment(url: str, origin: str) -> str:
    """The `subdirectory=` of a URL's fragment ("" when none); `egg=` is accepted and ignored."""
    fields = urllib.parse.parse_qs(urllib.parse.urlsplit(url).fragment)
    unknown = set(fields) - {"subdirectory", "egg", "sha256"}
    if unknown:
        raise UserError(f"{origin}: unknown URL fragment {excerpt(sorted(unknown)[0])}")
    subdirectory = fields.get("subdirectory", [""])[0]
    if subdirectory and not SUBDIRECTORY.fullmatch(subdirectory):
        raise UserError(f"{origin}: subdirectory {excerpt(subdirectory)} is not a relative path")
    return subdirectory.rstrip("/")


def _vcs(url: str, origin: str) -> DirectSource:
    """`git+scheme://host/path@ref#subdirectory=…` → the repository URL, ref and subdirectory."""
    parts = urllib.parse.urlsplit(url[len("git+") :])
    path, at, ref = parts.path.rpartition("@") if "@" in parts.path else (parts.path, "", "")
    if at and not REF.fullmatch(ref):
        raise UserError(f"{origin}: git ref {excerpt(ref)} is not a tag, branch or commit name")
    if parts.scheme == "http":
        _check_http(url[len("git+") :], "http", origin)
    if parts.scheme != "file" and not parts.hostname:
        raise UserError(f"{origin}: {redact(url)[:80]}: no host in the repository URL")
    repository = urllib.parse.urlunsplit(parts._replace(path=path, query="", fragment=""))
    subdirectory = _fragment(url, origin)
    return DirectSource(SourceKind.VCS, repository, origin, ref, subdirectory)
