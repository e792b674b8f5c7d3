"""Read pip-style requirement files into named requirements with their origin.

Accepted: named requirements with optional extras, specifiers, markers and `--hash` options,
nested `-r`/`-c` files, index options (`--index-url`, `--extra-index-url`, `--no-index`,
`--find-links`/`-f`), `--require-hashes`, and direct requirements: a local wheel, sdist or
project directory, a URL, a git repository (builder.resolve.direct.lines). Editable
requirements are refused, naming the file and line (nothing to edit in an image). Error lines
quote user input only through `excerpt`, which is short and masked: a requirements file may
be anything (`-r /proc/self/environ`, `-r .env`), and the error lands in CI logs. `${VAR}` is
substituted only in the `user:password@` of an http(s) URL, and what it gave is remembered to
be masked (builder.reporter); only a regular file is read, never a FIFO that would block.
"""

from __future__ import annotations

import codecs
import locale
import os
import re
import shlex
import stat
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, cast, runtime_checkable

from packaging.markers import Marker, UndefinedComparison, default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, Specifier
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

from builder.errors import UserError
from builder.reporter import excerpt, remember, remember_credentials
from builder.resolve.direct.lines import (
    DirectSource,
    from_url,
    is_direct_url,
    local_path,
    named,
    path_name,
    url_name,
)
from builder.resolve.index_options import index_url
from builder.resolve.resolution import SourceKind
from builder.resolve.target import ARCHES, Target, shipped_facts

T = TypeVar("T")
DEFAULT_INDEX = "https://pypi.org/simple"
ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# an http(s) URL's `user:password@`, the one place a `${VAR}` is substituted
USERINFO = re.compile(r"(?i)(?:git\+)?https?://(?P<userinfo>[^/?#]*)@")
MAX_NESTING = 50  # -r/-c depth; deeper is a generated loop, not a real project
MAX_FILE_BYTES = 10 * 1024 * 1024
# Byte-order marks, longest first: the UTF-32-LE mark starts with the UTF-16-LE one.
BOMS = (
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
)
ARCHIVES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz")
FILE_KINDS = (
    (stat.S_IFIFO, "a FIFO"),
    (stat.S_IFCHR, "a character device"),
    (stat.S_IFBLK, "a block device"),
    (stat.S_IFSOCK, "a socket"),
    (stat.S_IFDIR, "a directory"),
)
VERSION_VARIABLES = ("python_version", "python_full_version", "implementation_version")
MARKER_COMPARISON = re.compile(
    r'(\w+) (===|==|!=|<=|>=|~=|<|>) "([^"]*)"|"([^"]*)" (===|==|!=|<=|>=|~=|<|>) (\w+)'
)
SHA256 = re.compile(r"sha256:([0-9a-fA-F]{64})")
# `NAME=value`, `export name=value`: an environment file's line, which no requirement is
# (`foo=1` is rather a mistyped pin: its error quotes it, masked)
SHELL_ASSIGNMENT = re.compile(r"export\s+[A-Za-z_]\w*\s*=|[A-Z_][A-Z0-9_]*\s*=(?!=)")
# a run of 20+ letters and digits with no separator, a digit among them: an API token
# (`ghp_…`, an AWS key, a hex digest), which no distribution's name is (`excerpt` masks the same
# runs); it would be sent to the index as a project's name
TOKEN_LIKE = re.compile(r"(?=[A-Za-z0-9]*[A-Za-z])(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{20,}")
OPTION_NAME = re.compile(r"--?[a-z][a-z-]{0,30}")
# `name[extras] @ URL ; marker`: a direct requirement with a name
NAMED_URL = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*\s*(?:\[[^\]]*\])?)\s*@\s*(\S+)\s*(?:;(.*))?$")


def _option_name(option: str) -> str:
    """An option as written when it looks like one (`--find-links`), else a redacted excerpt."""
    return option if OPTION_NAME.fullmatch(option) else excerpt(option)


@dataclass(frozen=True)
class NamedRequirement:
    requirement: Requirement
    origin: str  # "file:line", for messages
    hashes: frozenset[str] = frozenset()  # sha256 hex digests given with --hash
    direct: DirectSource | None = None  # a path, URL or repository instead of an index

    @property
    def name(self) -> str:
        return canonicalize_name(self.requirement.name)

    def applies(self, environment: dict[str, str]) -> bool:
        marker: Marker | None = self.requirement.marker
        return marker is None or marker.evaluate(environment)

    def __str__(self) -> str:
        return str(self.requirement)


class IndexFile(Protocol):
    """What the hash check needs of a file (builder.resolve.index.RemoteFile)."""

    @property
    def filename(self) -> str: ...

    @property
    def sha256(self) -> str: ...


@runtime_checkable
class BuiltWheel(IndexFile, Protocol):
    """A wheel that knows the sdist it was built from on the host (None: it came as a wheel)."""

    @property
    def built_from(self) -> IndexFile | None: ...


class Once:
    """A value made once for a requirement set, however many arches resolve it (in parallel):
    a run's direct requirements are read, downloaded or built once, so every arch gets the
    same files, and a branch is asked for its commit once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: list[object] = []

    def get(self, make: Callable[[], T]) -> T:
        """The value, made by `make` the first time (a failure is not kept: each caller sees it)."""
        with self._lock:
            if not self._made:
                self._made.append(make())
            return cast(T, self._made[0])


@dataclass(frozen=True)
class RequirementSet:
    requirements: tuple[NamedRequirement, ...]
    constraints: tuple[NamedRequirement, ...]
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    # pip's hash-checking mode: on with --require-hashes or as soon as any line has a --hash.
    hash_checking: bool = False
    # uv's --torch-backend (`cpu`): the PyTorch family from PyTorch's own index for that build,
    # everything else from the indexes above (None: PyPI's torch, with its CUDA wheels)
    torch_backend: str | None = None
    # wheelhouses (directories or pages of links: --find-links), searched like an index
    find_links: tuple[str, ...] = ()
    no_index: bool = False  # --no-index: no index at all, only find-links and direct sources
    fetched: Once = field(default_factory=Once, compare=False, repr=False)  # direct ones' wheels

    def direct(self) -> tuple[NamedRequirement, ...]:
        """The requirements that name a path, URL or repository rather than an index project."""
        return tuple(r for r in self.requirements if r.direct is not None)

    def indexes(self) -> tuple[str, ...]:
        """Every index to search, the main one (PyPI unless replaced) first."""
        return (self.index_url or DEFAULT_INDEX, *self.extra_index_urls)

    def hashes_for(self, name: str) -> frozenset[str]:
        """Every sha256 the files allow for distribution `name` (empty: none given)."""
        name = canonicalize_name(name)
        return frozenset(
            digest
            for entry in (*self.requirements, *self.constraints)
            if entry.name == name
            for digest in entry.hashes
        )

    def check_hashes(self, files: Iterable[IndexFile]) -> None:
        """In hash-checking mode, refuse any file to install whose sha256 was not given.

        Like pip, dependencies need hashes too: an unpinned dependency would otherwise be
        whatever the index serves, which is what the hashes promise to rule out. As in pip,
        the hash is the one of the file fetched from the index: for a wheel built here, its
        sdist's (the wheel itself stays pinned by its own sha256 in the lock).
        """
        if not self.hash_checking:
            return
        direct = {r.name for r in self.direct()}  # their own hashes are checked when fetched
        for file in files:
            if _name_version(file.filename)[0] in direct:
                continue
            source = file.built_from if isinstance(file, BuiltWheel) else None
            fetched = source or file
            built = f" (built here into {file.filename}, sha256:{file.sha256})" if source else ""
            name, version = _name_version(fetched.filename)
            allowed = self.hashes_for(name)
            if not allowed:
                raise UserError(
                    f"{name}=={version}: no --hash given for it, and hash-checking mode is on"
                    " (--require-hashes or a --hash in the requirements); add its hash"
                )
            if fetched.sha256.lower() not in allowed:
                kind = "wheel" if fetched.filename.endswith(".whl") else "sdist"
                given = ", ".join(f"sha256:{digest}" for digest in sorted(allowed)[:3])
                raise UserError(
                    f"{name}=={version}: the {kind} {fetched.filename} has"
                    f" sha256:{fetched.sha256}{built}, which is not among the hashes given"
                    f" ({given})"
                )


def _name_version(filename: str) -> tuple[str, str]:
    """A wheel's or an sdist's normalized name and version, from its file name."""
    if filename.endswith(".whl"):
        name, version = parse_wheel_filename(filename)[:2]
    else:
        name, version = parse_sdist_filename(filename)
    return name, str(version)


def _decode(path: Path, data: bytes) -> str:
    """Text as pip reads it: a byte-order mark decides, else UTF-8, else the locale's encoding."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom) :].decode(encoding)
            except UnicodeDecodeError:
                raise UserError(f"{path}: not valid {encoding} after its byte-order mark") from None
    if b"\0" in data:
        raise UserError(f"{path}: binary data (NUL bytes), not a requirements file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        fallback = locale.getpreferredencoding(False)
        if codecs.lookup(fallback).name != "utf-8":
            try:
                return data.decode(fallback)
            except UnicodeDecodeError:
                pass
        line = data.count(b"\n", 0, error.start) + 1
        raise UserError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[error.start]:02x}); save it as UTF-8"
        ) from None


def _read_text(path: Path) -> tuple[str, tuple[int, int]]:
    """The decoded file and its identity (device, inode) for finding include cycles."""
    try:
        data, status = read_regular(path, "requirements file", MAX_FILE_BYTES + 1)
    except OSError as error:
        raise UserError(f"{path}: cannot read requirements file ({error.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UserError(
            f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; not a requirements file"
        )
    return _decode(path, data), (status.st_dev, status.st_ino)


def read_regular(path: Path, what: str, limit: int) -> tuple[bytes, os.stat_result]:
    """Up to `limit` bytes of the regular file at `path`, and its status; anything else (a
    FIFO, a device) refused as `check_regular` says, without an open that could wait. An
    OSError is the caller's to word."""
    check_regular(path, what)
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO swapped in: no wait
    with open(descriptor, "rb") as file:
        status = os.fstat(file.fileno())
        check_regular(path, what, status)
        return file.read(limit), status


def check_override_file(path: Path) -> None:
    """An override file (`--override`) as uv will read it: a regular file of at most
    MAX_FILE_BYTES holding no `${VAR}`. uv reads it itself and would substitute any variable of
    the runner's environment anywhere in a line (a path, a host) and print it unmasked, so a
    variable there is refused, naming it and never its value; credentials belong in a
    requirements file's URL (where this tool substitutes and masks them)."""
    try:
        data, _ = read_regular(path, "uv override file", MAX_FILE_BYTES + 1)
    except OSError as error:
        raise UserError(f"{path}: cannot read uv override file ({error.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UserError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; not an override file")
    for number, line in enumerate(_decode(path, data).splitlines(), 1):
        if variable := ENV_VAR.search(line):
            raise UserError(
                f"{path}:{number}: ${{{variable[1]}}} is not substituted in an override file"
                " (give credentials in a requirements file's URL)"
            )


def check_regular(path: Path, what: str, status: os.stat_result | None = None) -> None:
    """Refuse a FIFO, a device, a socket or a directory given as a file to read: a FIFO would
    block the run forever, a device never end. `status`: the open file's (fstat), which
    closes the race of a file swapped between the check and the open."""
    mode = (status or os.stat(path)).st_mode
    if not stat.S_ISREG(mode):
        kind = dict(FILE_KINDS).get(stat.S_IFMT(mode), "not a regular file")
        raise UserError(f"{path}: {kind}, not a {what} (only a regular file is read)")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash continuations and strip comments, keeping the first line number."""
    lines, pending, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined = (pending + line).strip()
        pending = ""
        if joined:
            lines.append((start, joined))
    if pending.strip():
        lines.append((start, pending.strip()))
    return lines


def _expand(value: str, origin: str) -> str:
    """`value` with each `${VAR}` replaced by the variable's value, only inside the
    `user:password@` of an http(s) URL, where the docs say credentials go. Anywhere else (a
    path, a host, a name) it is refused, naming the variable and never its value: a team's file
    must not print, or send to a host of its choosing, what the CI runner holds. Each value
    substituted, and a password written in the URL, is remembered to be masked
    (builder.reporter)."""
    match = USERINFO.match(value)
    start, end = match.span("userinfo") if match else (0, 0)
    for variable in ENV_VAR.finditer(value):
        if not (start <= variable.start() and variable.end() <= end):
            raise _misplaced(variable, origin)

    def substitute(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in os.environ:
            raise UserError(f"{origin}: environment variable {name} is not set")
        remember(os.environ[name])
        return os.environ[name]

    remember_credentials(value)
    return ENV_VAR.sub(substitute, value)


def _misplaced(variable: re.Match[str], origin: str) -> UserError:
    """The refusal of a `${VAR}` outside a URL's credentials: its name, never its value."""
    return UserError(
        f"{origin}: ${{{variable[1]}}} is substituted only in the user:password@ of an http(s)"
        " URL (credentials), not in a path, a host or a name"
    )


def _split(text: str, origin: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:  # "No closing quotation", "No escaped character"
        raise UserError(f"{origin}: {str(error).lower()} in {excerpt(text)}") from None


@dataclass
class _Reader:
    requirements: list[NamedRequirement] = field(default_factory=list)
    constraints: list[NamedRequirement] = field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    require_hashes: str | None = None  # origin of --require-hashes
    find_links: tuple[str, ...] = ()
    no_index: bool = False

    def read(
        self, path: Path, *, as_constraints: bool, seen: frozenset[tuple[int, int]] = frozenset()
    ) -> None:
        if len(seen) >= MAX_NESTING:
            raise UserError(f"{path}: -r/-c files nested more than {MAX_NESTING} deep")
        text, identity = _read_text(path)
        if identity in seen:
            raise UserError(f"{path}: requirement files include each other in a cycle")
        for number, line in _logical_lines(text):
            origin = f"{path}:{number}"
            if line.startswith("-"):
                self._option(path, line, origin, as_constraints, seen | {identity})
            else:
                entry = _parse_requirement(line, origin, path.parent)
                if as_constraints and entry.direct is not None:
                    raise UserError(
                        f"{origin}: a constraint names versions, not a file or repository:"
                        f" give {entry.name} @ … in a requirements file"
                    )
                (self.constraints if as_constraints else self.requirements).append(entry)

    def _option(
        self,
        path: Path,
        line: str,
        origin: str,
        as_constraints: bool,
        seen: frozenset[tuple[int, int]],
    ) -> None:
        words = _split(line, origin)
        option, equals, inline = words[0].partition("=")
        if option in ("--require-hashes", "--no-index"):
            self._flag(option, bool(equals) or len(words) > 1, origin)
            return
        values = [inline] if equals else words[1:]
        if not values or not values[0]:
            raise UserError(f"{origin}: option {_option_name(option)} needs a value")
        if len(values) > 1:
            raise UserError(f"{origin}: option {_option_name(option)} takes one value")
        value = _expand(values[0], origin)
        if option in ("-r", "--requirement", "-c", "--constraint"):
            constraints = as_constraints or option in ("-c", "--constraint")
            self.read(path.parent / value, as_constraints=constraints, seen=seen)
        elif option in ("-i", "--index-url"):
            self.index_url = index_url(value, option, origin)
        elif option == "--extra-index-url":
            self.extra_index_urls += (index_url(value, option, origin),)
        elif option in ("-f", "--find-links"):
            self.find_links += (find_links(value, origin, path.parent),)
        elif option in ("-e", "--editable"):
            raise UserError(
                f"{origin}: editable requirement {excerpt(value)} is not supported (nothing to"
                " edit in an image): name the path or URL without -e"
            )
        else:
            raise UserError(f"{origin}: option {_option_name(option)} is not supported")

    def _flag(self, option: str, valued: bool, origin: str) -> None:
        """An option without a value: `--require-hashes` or `--no-index`."""
        if valued:
            raise UserError(f"{origin}: option {option} takes no value")
        if option == "--no-index":
            self.no_index = True
        else:
            self.require_hashes = origin


def _hashes(options: list[str], origin: str) -> frozenset[str]:
    """The sha256 digests of a line's `--hash` options; any other option is an error."""
    digests = set()
    words = iter(options)
    for word in words:
        option, equals, value = word.partition("=")
        if option != "--hash":
            known = option in ("--config-settings", "--global-option", "--install-option")
            what = "is not supported" if known else "is unknown"
            raise UserError(f"{origin}: per-requirement option {_option_name(option)} {what}")
        if not equals:
            value = next(words, "")
        if not (match := SHA256.fullmatch(value)):
            raise UserError(
                f"{origin}: --hash takes sha256:<64 hex digits> (only sha256 hashes are supported)"
            )
        digests.add(match.group(1).lower())
    return frozenset(digests)


def _local_path(head: str) -> bool:
    """What pip would take for a local file or directory rather than a project name."""
    return "@" not in head and (
        head.startswith((".", "~"))
        or "/" in head
        or "\\" in head
        or head.lower().endswith(ARCHIVES)
    )


def _check_marker(requirement: Requirement, origin: str) -> None:
    """Refuse a marker that would silently compare as text or fail when evaluated."""
    if requirement.marker is None:
        return
    for match in MARKER_COMPARISON.finditer(str(requirement.marker)):
        variable, operator = match[1] or match[6], match[2] or match[5]
        value = match[3] if match[3] is not None else match[4]
        if variable in VERSION_VARIABLES and operator != "===":
            try:
                Specifier(f"{operator}{value}")
            except InvalidSpecifier:
                raise UserError(
                    f"{origin}: invalid marker: {variable} {operator} {excerpt(value)}"
                    " is not a version comparison"
                ) from None
    try:
        requirement.marker.evaluate(default_environment())  # type: ignore[arg-type]
    except UndefinedComparison as error:
        raise UserError(f"{origin}: invalid marker ({error})") from None


def find_links(value: str, origin: str, base: Path) -> str:
    """A `--find-links` location: a directory (relative to the file naming it), which must
    exist, or an http(s) URL (plain http only to this machine), kept with its credentials."""
    if is_direct_url(value):
        if not value.lower().startswith(("http://", "https://", "file://")):
            raise UserError(f"{origin}: --find-links takes a directory or an http(s) URL")
        if value.lower().startswith("file://"):
            return find_links(urllib.parse.unquote(urllib.parse.urlsplit(value).path), origin, base)
        remember_credentials(value)  # the flag's or the config's: no `${VAR}` was expanded there
        return from_url("--find-links", value, origin, base).target
    path = Path(os.path.normpath(base.absolute() / Path(value).expanduser()))
    if not path.is_dir():
        raise UserError(f"{origin}: --find-links directory {excerpt(value)} does not exist")
    return str(path)


def _direct_requirement(
    text: str, origin: str, base: Path, hashes: frozenset[str]
) -> NamedRequirement | None:
    """A line naming a path, URL or repository (None: a plain named requirement)."""
    name = ""
    if is_direct_url(text):
        head, _, marker = text.partition(" ;")  # a URL may hold a `;`: a marker follows a space
        url = _expand(head.strip(), origin)
        source = from_url("", url, origin, base)
        name = url_name(url, origin) if source.kind is not SourceKind.PATH else ""
    elif _local_path(text.partition(";")[0].strip()):
        head, _, marker = text.partition(";")
        source = local_path(_expand(head.strip(), origin), origin, base)
    elif match := NAMED_URL.match(text):
        name, marker = match[1], match[3] or ""
        source = from_url(match[1], _expand(match[2], origin), origin, base)
    else:
        return None
    requirement = named(name or path_name(Path(source.target), origin), marker.strip(), origin)
    _check_marker(requirement, origin)
    return NamedRequirement(requirement, origin, hashes, source)


def _parse_requirement(line: str, origin: str, base: Path) -> NamedRequirement:
    if SHELL_ASSIGNMENT.match(line):  # `-r .env`: never quote it, the value is a secret
        raise UserError(f"{origin}: not a requirement line (it looks like a NAME=value setting)")
    words = line.split()
    first_option = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
    text = " ".join(words[:first_option])
    hashes = _hashes(_split(" ".join(words[first_option:]), origin), origin)
    if direct := _direct_requirement(text, origin, base, hashes):
        return direct
    if variable := ENV_VAR.search(text):
        raise _misplaced(variable, origin)
    if re.search(r",\s*(;|$)", text):
        raise UserError(f"{origin}: invalid requirement {excerpt(text)} (trailing comma)")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as error:
        message, *rest = str(error).splitlines()
        caret = rest[-1].find("^") - 3 if rest else 0  # packaging indents its caret line by 4
        where = f" at column {caret}" if caret > 0 else ""
        raise UserError(
            f"{origin}: invalid requirement {excerpt(text)}{where}: {message}"
        ) from None
    if TOKEN_LIKE.search(requirement.name):  # `-r token.txt`: neither quote nor send it
        raise UserError(f"{origin}: not a requirement line (it looks like a token, not a name)")
    _check_marker(requirement, origin)
    return NamedRequirement(requirement, origin, hashes)


def _check_hash_mode(reader: _Reader) -> bool:
    """Whether hash-checking mode is on; if so, every requirement is pinned and hashed.

    A `--hash` on a direct requirement checks that file only: it names one file already, and
    a wheelhouse or repository beside it has no hashes to give."""
    entries = (*reader.requirements, *reader.constraints)
    hashed = next((r for r in entries if r.hashes and r.direct is None), None)
    if not (reader.require_hashes or hashed):
        return False
    why = f"--require-hashes at {reader.require_hashes}" if reader.require_hashes else ""
    if hashed and not why:
        why = f"a --hash at {hashed.origin}"
    for entry in reader.requirements:
        if entry.direct is not None:
            _check_direct_hash(entry, why)
            continue
        pinned = any(
            s.operator in ("==", "===") and "*" not in s.version
            for s in entry.requirement.specifier
        )
        if not (pinned and entry.hashes):
            raise UserError(
                f"{entry.origin}: {entry.name} needs an == pin and a --hash: hash-checking mode"
                f" is on ({why})"
            )
    return True


def _check_direct_hash(entry: NamedRequirement, why: str) -> None:
    """In hash-checking mode a URL needs its `--hash`: the file comes from elsewhere. A path is
    read here and a repository is pinned by its commit: they need none."""
    assert entry.direct is not None
    if entry.direct.kind is SourceKind.URL and not entry.hashes:
        raise UserError(
            f"{entry.origin}: {entry.name} @ {entry.direct.shown[:80]} needs a --hash:"
            f" hash-checking mode is on ({why})"
        )


def read_requirements(
    requirement_files: Sequence[Path], constraint_files: Sequence[Path] = ()
) -> RequirementSet:
    """Read every file (following nested -r/-c) into one requirement set."""
    reader = _Reader()
    for path in requirement_files:
        reader.read(path, as_constraints=False)
    for path in constraint_files:
        reader.read(path, as_constraints=True)
    if not reader.requirements:
        files = ", ".join(str(path) for path in requirement_files)
        raise UserError(f"{files}: no requirements found")
    return RequirementSet(
        requirements=tuple(reader.requirements),
        constraints=tuple(reader.constraints),
        index_url=reader.index_url,
        extra_index_urls=reader.extra_index_urls,
        hash_checking=_check_hash_mode(reader),
        find_links=tuple(dict.fromkeys(reader.find_links)),
        no_index=reader.no_index,
    )


def distribution_names(path: Path) -> list[str]:
    """Distribution names of a requirements file whose markers hold on the target (amd64)."""
    requirements = read_requirements([path])
    environment = Target(shipped_facts(), (ARCHES["amd64"],)).marker_environment(ARCHES["amd64"])
    return list(dict.fromkeys(r.name for r in requirements.requirements if r.applies(environment)))
