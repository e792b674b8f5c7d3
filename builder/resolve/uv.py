"""Resolve the requirements for the target interpreter and platform, not for this host.

uv evaluates markers for the target and, with `--only-binary :all:`, picks only versions
that have a wheel for it. The base image's /app/deps distributions are constraints: a
requirement that contradicts one fails here, naming the base's pin. A distribution that
has only a source release is built on the host when it is pure Python, and refused when
it compiles code, naming the newest version that does have a usable wheel.

Versions are chosen as pip chooses them: a prerelease only when the requirement names one or
no final release satisfies it. uv also falls back to a prerelease when a conflict rules out
every final release; such a pick is refused for that distribution and the set pinned again, so
the conflict is what the run reports. A conflict with a distribution the base pins is said with
its way out: the override line that lets the set resolve, found by resolving with it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
import tempfile
import time
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from builder.cache import Cache
from builder.errors import UserError
from builder.resolve.direct.fetch import Fetched, fetch_all, refuse_unfit
from builder.resolve.index import (
    UV,
    build_options,
    build_pure_wheel,
    built_source,
    compiled_code_evidence,
    download,
    index_files,
    run_uv,
    uv_python,
    wheelhouse_files,
)
from builder.resolve.origins import as_given, origins_of, with_sources
from builder.resolve.requirements import RequirementSet, check_override_file
from builder.resolve.resolution import LockedPackage, RemoteFile, Resolution, redact
from builder.resolve.stale import (
    StalePick,
    admitted,
    held_back_notes,
    index_listings,
    parse_pins,
    parse_via,
    pinned_notes,
    requested_held_notes,
    stale_picks,
    unwanted_prereleases,
)
from builder.resolve.target import Arch, BaseFacts, BaseProfile, Target
from builder.resolve.unresolvable import (
    BaseConflict,
    base_way_out,
    check_against_base,
    implicated_pins,
    not_found,
    origin,
    unresolvable,
    wanted_of,
)
from builder.retry import Retries

NEEDS_SOURCE_BUILD = re.compile(r"Wheels are required for `([^`]+)`")
# uv's hint when a specifier names a prerelease that `--prerelease-package NAME=disallow` refused
PRERELEASE_NAMED = re.compile(r"`([^`]+)` was requested with a pre-release marker")
MAX_SOURCE_ROUNDS = 10
RESOLUTION_TTL_SECONDS = 3600


def _uv_compile_command(
    requirements_in: Path, target: Target[BaseFacts], arch: Arch, requirements: RequirementSet
) -> list[str]:
    """`uv pip compile` for the target, wheels only, from the indexes the requirements name.

    One home for what every resolution asks of uv, so a probe resolves exactly as the lock does.
    """
    command = [UV, "pip", "compile", str(requirements_in)]
    command += ["--python-platform", arch.uv_platform, "--python-version", target.python_version]
    command += ["--only-binary", ":all:", "--no-header", "--quiet", *uv_python()]
    if requirements.no_index:
        command += ["--no-index"]
    for location in requirements.find_links:
        command += ["--find-links", location]
    if requirements.index_url:
        command += ["--index-url", requirements.index_url]
    for extra in requirements.extra_index_urls:
        command += ["--extra-index-url", extra]
    if requirements.torch_backend:
        command += ["--torch-backend", requirements.torch_backend]
    return command


def _uv_compile(
    compiler: _Compiler, annotated: bool = False, overrides: Sequence[Path] = ()
) -> subprocess.CompletedProcess[str]:
    """uv's pylock for the set; `annotated`: its requirements.txt with `# via` on stdout;
    `overrides` besides the run's own; the compiler's `no_prereleases`: distributions whose
    prereleases uv may not take."""
    workdir, target, arch = compiler.workdir, compiler.target, compiler.arch
    command = [
        *_uv_compile_command(workdir / "requirements.in", target, arch, compiler.requirements),
        *("--constraint", str(workdir / "constraints.txt")),
        *("--find-links", str(compiler.find_links)),
    ]
    if annotated:
        command += ["--format", "requirements.txt", "--annotation-style", "line"]
        command += ["--emit-index-annotation"]
    else:
        command += ["--format", "pylock.toml"]
        command += ["--output-file", str(workdir / f"pylock.{arch.name}.toml")]
    for override in (*compiler.overrides, *overrides):
        command += ["--override", str(override)]
    for name in compiler.no_prereleases:
        command += ["--prerelease-package", f"{name}=disallow"]
    return run_uv(command, compiler.cache)


def _wheel_file(entry: dict, cache: Cache) -> RemoteFile:
    # uv lists index and --find-links wheels alike by URL, a direct one by its path
    url = entry["url"] if "url" in entry else Path(entry["path"]).absolute().as_uri()
    filename = urllib.parse.unquote(url.rsplit("/", 1)[1])
    sha256 = entry["hashes"]["sha256"]
    source = built_source(sha256, cache) if url.startswith("file:") else None
    return RemoteFile(filename, url, sha256, entry.get("size"), built_from=source)


class _WheelsExist(Exception):
    """uv hinted at building a distribution whose matching release has a usable wheel: the
    resolution failed for another reason (a conflict), which its own explanation gives."""


def newest_usable_version(
    name: str, target: Target[BaseFacts], arch: Arch, requirements: RequirementSet, cache: Cache
) -> str | None:
    """The newest release of `name` with a wheel the target accepts, by asking the resolver."""
    with tempfile.TemporaryDirectory(prefix="bsi-probe-") as temp:
        workdir = Path(temp)
        (workdir / "requirements.in").write_text(f"{name}\n")
        (workdir / "constraints.txt").write_text("")
        command = [
            *_uv_compile_command(workdir / "requirements.in", target, arch, requirements),
            "--no-deps",
        ]
        result = run_uv(command, cache)
    match = re.search(r"^\S+==(\S+)", result.stdout, re.M)
    return match.group(1) if result.returncode == 0 and match else None


def _specifier_for(name: str, requirements: RequirementSet) -> SpecifierSet:
    specifier = SpecifierSet()
    for requirement in (*requirements.requirements, *requirements.constraints):
        if requirement.name == name:
            specifier &= requirement.requirement.specifier
    return specifier


def _release_files(
    name: str, requirements: RequirementSet, retries: Retries | None
) -> list[RemoteFile]:
    """Every file of `name` the set may build from: its wheelhouses', then its indexes' (none
    with --no-index)."""
    files = wheelhouse_files(requirements.find_links, name)
    if not requirements.no_index:
        files += index_files(requirements.indexes(), name, retries)
    return files


def _build_options(requirements: RequirementSet) -> list[str]:
    """Where `uv build` takes build backends from, for this set (builder.resolve.index)."""
    return build_options(requirements.no_index, requirements.find_links)


def _build_from_source(
    name: str,
    target: Target[BaseFacts],
    arch: Arch,
    requirements: RequirementSet,
    cache: Cache,
    find_links: Path,
    retries: Retries | None,
) -> str:
    """Build the newest matching pure-Python sdist of `name` into `find_links`; refuse others."""
    specifier = _specifier_for(name, requirements)
    files = _release_files(name, requirements, retries)
    wheeled: set[Version] = set()
    sdists: dict[Version, RemoteFile] = {}
    for file in files:
        try:
            if file.filename.endswith(".whl"):
                wheeled.add(parse_wheel_filename(file.filename)[1])
            else:
                sdists[parse_sdist_filename(file.filename)[1]] = file
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
    candidates = sorted(admitted(specifier, sdists), reverse=True)
    usable = newest_usable_version(name, target, arch, requirements, cache)
    suggestion = (
        f"newest version with a usable wheel: {usable}"
        if usable
        else ("no version has a usable wheel")
    )
    wanted = f"{name}{specifier}" if specifier else name
    if not candidates:
        raise UserError(
            f"{origin(requirements, name)}: no release matching {wanted} has a wheel for"
            f" CPython {target.python_version} on {arch.machine}; {suggestion}"
        )
    version = candidates[0]
    if usable is not None and specifier.contains(usable) and Version(usable) >= version:
        raise _WheelsExist(name)  # uv tried older releases, sdist-only: not why it failed
    if version in wheeled:  # wheels exist, just not for us: compiled for other targets
        raise UserError(
            f"{origin(requirements, name)}: {name}=={version} has no wheel for"
            f" cp{''.join(map(str, target.python_tuple))} manylinux {arch.machine} and its"
            f" source compiles native code; {suggestion}"
        )
    requirements.check_hashes([sdists[version]])  # before its build backend runs here
    sdist = download(sdists[version], cache, requirements.indexes(), retries)
    evidence = compiled_code_evidence(sdist)
    if evidence:
        raise UserError(
            f"{origin(requirements, name)}: {name}=={version} has only a source distribution"
            f" and it compiles native code ({evidence}); {suggestion}"
        )
    wheel, _ = build_pure_wheel(sdist, sdists[version], cache, _build_options(requirements))
    link = find_links / wheel.name
    if not link.exists():
        link.symlink_to(wheel)
    return f"{name}=={version}"


def _resolution_key(
    requirements: RequirementSet,
    target: Target[BaseProfile],
    arch: Arch,
    overrides: Sequence[Path],
    fetched: Sequence[Fetched] = (),
) -> str:
    """Everything a resolution depends on, hashed: a change in any of it means a new one
    (a direct requirement by what it pinned: a file's sha256, a ref's commit)."""
    facts = {
        "schema": 6,
        "direct": [asdict(f.source) | {"wheel": f.wheel.name} for f in fetched],
        "find_links": [redact(location) for location in requirements.find_links],
        "no_index": requirements.no_index,
        "overrides": [path.read_text() for path in overrides],
        "uv": metadata.version("uv"),
        "arch": arch.name,
        "requirements": [str(r) for r in requirements.requirements],
        "constraints": [str(c) for c in requirements.constraints],
        "indexes": requirements.indexes(),
        "torch_backend": requirements.torch_backend,
        "base": target.base.to_dict(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _cached(
    cache: Cache, key: str, target: Target[BaseFacts], arch: Arch, fetched: Sequence[Fetched]
) -> Resolution | None:
    record = cache.get_record("resolution", key)
    if not record or time.time() - record["at"] > RESOLUTION_TTL_SECONDS:
        return None
    packages, provided = _packages(tomllib.loads(record["pylock"]), target, cache)
    built_here = [w for p in packages for w in p.wheels if w.url.startswith("file:")]
    direct = frozenset(f.wheel.name for f in fetched)
    if any(not _still_there(w, cache, direct) for w in built_here):
        return None  # a wheel built from source (or its record) has left the cache: resolve again
    return Resolution(
        arch,
        _with_origins(packages, record["origins"]),
        provided,
        tuple(record["built"]),
        record["pylock"],
        tuple(record["warnings"]),
    )


def _still_there(wheel: RemoteFile, cache: Cache, direct: frozenset[str]) -> bool:
    """Whether a local wheel of a cached resolution can still be used: one built here from an
    sdist is in the cache with its record; any other (a wheelhouse's, a `direct` requirement's
    in the cache) is on disk where uv found it."""
    if wheel.built_from is not None:
        return cache.find_blob(wheel.sha256, wheel.filename) is not None
    local = Path(urllib.parse.unquote(urllib.parse.urlsplit(wheel.url).path))
    in_cache = local.is_relative_to(cache.root)
    return local.is_file() and (not in_cache or wheel.filename in direct)


def resolve(
    requirements: RequirementSet,
    target: Target[BaseProfile],
    arch: Arch,
    cache: Cache,
    refresh: bool = False,
    overrides: Sequence[Path] = (),
    retries: Retries | None = None,
    pinned: Callable[[Resolution], None] | None = None,
) -> Resolution:
    """Pin every distribution for `arch` with the wheels usable there, base pins as constraints.

    `overrides` are uv override files (`uv pip compile --override`): they replace what the
    dependencies ask for, or drop a dependency with a never-true marker. An identical
    resolution from the last hour is reused (no index traffic at all on a rerun); `refresh`
    forces a new one, as every platform-upgrade rebuild does. The tool's own index requests
    (listings, sources) try again on faults as the run's `retries` say; uv retries its own.

    `pinned` gets the set as uv first pins it, without the check for newer releases that
    follows (every name's listing: most of a large set's resolution, 17 of 21 s for 165
    distributions). That check changes the pins only when it builds a fresher pure-Python
    source, so a caller may start fetching meanwhile and compare the pins it returns
    (`same_pins`). A reused resolution calls nothing: it is returned at once.
    """
    for path in overrides:  # a FIFO would block the key's read, and uv, forever
        check_override_file(path)
    check_against_base(requirements, target, arch)
    fetched = refuse_unfit(fetch_all(requirements, cache, retries), target, arch)
    key = _resolution_key(requirements, target, arch, overrides, fetched)
    if not refresh and (found := _cached(cache, key, target, arch, fetched)):
        return with_sources(found, requirements.find_links, fetched)
    with tempfile.TemporaryDirectory(prefix="bsi-resolve-") as temp:
        compiler = _Compiler(Path(temp), requirements, target, arch, cache, overrides, retries)
        compiler.prepare(fetched)
        first = (
            None
            if pinned is None
            else lambda found: pinned(with_sources(found, requirements.find_links, fetched))
        )
        resolution, origins = _resolve_with(compiler, first)
    record = dict(
        at=time.time(),
        built=list(resolution.built_from_source),
        pylock=resolution.pylock,
        warnings=list(resolution.warnings),
        origins=origins,
    )
    cache.put_record("resolution", key, record)
    return with_sources(resolution, requirements.find_links, fetched)


@dataclass(frozen=True)
class _Compiler:
    """One resolution's inputs and scratch directory: what each of its uv runs, and each build
    of a source release it asks for, needs."""

    workdir: Path
    requirements: RequirementSet
    target: Target[BaseProfile]
    arch: Arch
    cache: Cache
    overrides: Sequence[Path]
    retries: Retries | None
    # distributions whose prereleases pip would not take (`_refuse_prereleases`), grown per round
    no_prereleases: list[str] = field(default_factory=list)
    # refused ones a dependency turned out to ask for by a prerelease specifier: uv's pick stands
    named_prereleases: list[str] = field(default_factory=list)

    @property
    def find_links(self) -> Path:
        """Where wheels built from source releases wait for uv."""
        return self.workdir / "built"

    @property
    def output(self) -> Path:
        return self.workdir / f"pylock.{self.arch.name}.toml"

    def prepare(self, fetched: Sequence[Fetched] = ()) -> None:
        """The requirements (a direct one at its `fetched` wheel), the constraints (the base's
        pins first) and the built-wheel folder."""
        self.find_links.mkdir()
        (self.workdir / "requirements.in").write_text(
            _requirement_lines(self.requirements, fetched)
        )
        (self.workdir / "constraints.txt").write_text(
            "".join(f"{line}\n" for line in self.target.base.constraints())
            + "".join(f"{c.requirement}\n" for c in self.requirements.constraints)
        )

    def compile(
        self, annotated: bool = False, overrides: Sequence[Path] = ()
    ) -> subprocess.CompletedProcess[str]:
        """uv's pin of the set (with `overrides` besides the run's own)."""
        return _uv_compile(self, annotated=annotated, overrides=overrides)

    def build(self, name: str) -> str:
        """Build `name`'s pure-Python source release for uv to find: "name==version"."""
        return _build_from_source(
            name,
            self.target,
            self.arch,
            self.requirements,
            self.cache,
            self.find_links,
            self.retries,
        )

    def unresolvable(self, stderr: str) -> UserError:
        way_out = None if not_found(stderr) else _base_way_out(self, stderr)
        return way_out or unresolvable(stderr, self.requirements, self.target, self.arch)


def _requirement_lines(requirements: RequirementSet, fetched: Sequence[Fetched]) -> str:
    """requirements.in: each named requirement as written, each direct one at its wheel."""
    wheels = {f.requirement.origin: f.line() for f in fetched}
    return "".join(
        f"{wheels.get(r.origin, str(r.requirement))}\n" for r in requirements.requirements
    )


@dataclass(frozen=True)
class _Compiled:
    """A set uv pinned: the packages to install, what the base provides, uv's lock, and what
    was built from source on the way (in the order built)."""

    packages: tuple[LockedPackage, ...]
    provided: tuple[str, ...]
    pylock: str
    built: tuple[str, ...]


def _compile_set(compiler: _Compiler) -> _Compiled:
    """uv's pin of the set, in rounds: each failed round names the distributions uv needs
    built from source, each built before the next round; up to MAX_SOURCE_ROUNDS."""
    built: list[str] = []
    for _ in range(MAX_SOURCE_ROUNDS):
        result = compiler.compile()
        if result.returncode != 0 and not _prereleases_named(compiler, result.stderr):
            built += _source_round(compiler, result.stderr)
        if result.returncode != 0:
            continue
        pylock = compiler.output.read_text()
        packages, provided = _packages(tomllib.loads(pylock), compiler.target, compiler.cache)
        if not _refuse_prereleases(compiler, packages):
            return _Compiled(packages, provided, pylock, tuple(built))
    raise compiler.unresolvable(result.stderr)


def _prereleases_named(compiler: _Compiler, stderr: str) -> bool:
    """Whether the set failed because a refused prerelease is what a dependency's specifier
    names (`bsi-lib>=2.0rc1`: pip takes it then); those are allowed again for the next round."""
    named = [n for n in compiler.no_prereleases if n in PRERELEASE_NAMED.findall(stderr)]
    for name in named:
        compiler.no_prereleases.remove(name)
        compiler.named_prereleases.append(name)
    return bool(named)


def _refuse_prereleases(compiler: _Compiler, packages: Sequence[LockedPackage]) -> bool:
    """Whether uv took prereleases pip would not (then they are refused for the next round):
    read from the releases the set may take of each prerelease it pinned (a direct
    requirement's own file aside)."""
    requirements = compiler.requirements
    direct = {r.name for r in requirements.direct()}
    picks = {
        p.name: p.version
        for p in packages
        if Version(p.version).is_prerelease
        and p.name not in direct
        and p.name not in compiler.no_prereleases
        and p.name not in compiler.named_prereleases
    }
    if not picks:
        return False
    listings = {name: _release_files(name, requirements, compiler.retries) for name in picks}
    specifiers = {name: _specifier_for(name, requirements) for name in picks}
    unwanted = unwanted_prereleases(picks, specifiers, listings, compiler.target, compiler.arch)
    compiler.no_prereleases.extend(unwanted)
    if unwanted:  # uv keeps the versions of an existing output file
        compiler.output.unlink()
    return bool(unwanted)


def _base_way_out(compiler: _Compiler, stderr: str) -> UserError | None:
    """A failure that the base's pins cause, said with its way out: the override lines that
    let the set resolve (found by resolving with every pin uv names as an override), and each
    conflict of the releases the set then takes (the newest, not one of uv's old fallbacks).
    Only a pin some taken release conflicts with is named: the others changed nothing. None
    when overriding the pins uv names does not resolve the set."""
    pins = implicated_pins(stderr, compiler.target)
    resolved = _resolves_overriding(compiler, pins)
    if resolved is None:
        return None
    pinned = parse_pins(resolved)
    via = parse_via(resolved)
    conflicts = [
        conflict
        for name, version in sorted(pins.items())
        for dependent in via.get(name, ())
        if dependent in pinned
        and dependent not in compiler.target.base.distributions
        and (conflict := _conflict(compiler, f"{dependent}=={pinned[dependent]}", name, version))
    ]
    needed = {conflict.name: conflict.pinned for conflict in conflicts}
    return base_way_out(conflicts, needed, compiler.arch) if conflicts else None


def _resolves_overriding(compiler: _Compiler, pins: Mapping[str, str]) -> str | None:
    """The annotated pin of the set with `pins` as override lines, or None when it fails."""
    if not pins:
        return None
    override = compiler.workdir / "base-pins.override.txt"
    override.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    result = compiler.compile(annotated=True, overrides=[override])
    return result.stdout if result.returncode == 0 else None


def _conflict(compiler: _Compiler, release: str, name: str, pinned: str) -> BaseConflict | None:
    """What `release` ("botocore==1.44.30") asks of `name`, when the base's `pinned` version
    does not satisfy it, by resolving that release alone against that pin."""
    with tempfile.TemporaryDirectory(prefix="bsi-conflict-") as temp:
        workdir = Path(temp)
        (workdir / "requirements.in").write_text(f"{release}\n")
        (workdir / "constraints.txt").write_text(f"{name}=={pinned}\n")
        command = _uv_compile_command(
            workdir / "requirements.in", compiler.target, compiler.arch, compiler.requirements
        )
        command += ["--constraint", str(workdir / "constraints.txt"), "--no-annotate"]
        result = run_uv(command, compiler.cache)
    if result.returncode == 0:
        return None
    return BaseConflict(release, wanted_of(result.stderr, release, name), name, pinned)


def _source_round(compiler: _Compiler, stderr: str) -> list[str]:
    """Build what uv's failure says needs a source build ("name==version" each); a failure
    of anything else (or a release whose wheels exist after all) is the resolution's error."""
    needs_source = [canonicalize_name(n) for n in NEEDS_SOURCE_BUILD.findall(stderr)]
    if not needs_source or not_found(stderr):
        raise compiler.unresolvable(stderr)
    try:
        return [compiler.build(name) for name in needs_source]
    except _WheelsExist:
        raise compiler.unresolvable(stderr) from None


def _annotations(compiler: _Compiler) -> str:
    """uv's `# via` and `# from` annotations of the set ("" when uv cannot give them)."""
    result = compiler.compile(annotated=True)
    return result.stdout if result.returncode == 0 else ""


def _resolve_with(
    compiler: _Compiler, first: Callable[[Resolution], None] | None = None
) -> tuple[Resolution, dict[str, str]]:
    """The resolution and the index each package came from: the set pinned (handed to
    `first` as it is), stale picks looked for, and pinned again when a fresher pure-Python
    source was built for one."""
    compiled = _compile_set(compiler)
    # uv keeps the versions of an existing output file: start afresh to pick up new wheels
    compiler.output.unlink()
    annotations = functools.cache(functools.partial(_annotations, compiler))  # once, if needed
    requirements = compiler.requirements
    origins = origins_of([p.name for p in compiled.packages], requirements, annotations)
    packages = _with_origins(compiled.packages, origins)
    if first is not None:
        first(
            Resolution(
                compiler.arch, packages, compiled.provided, tuple(compiled.built), compiled.pylock
            )
        )
    warnings, rebuilt = _fresher_sources(
        packages,
        requirements,
        compiler.target,
        compiler.arch,
        compiler.cache,
        compiler.find_links,
        annotations,
        compiler.retries,
    )
    built = [*compiled.built]
    if rebuilt:
        compiled = _compile_set(compiler)
        packages = _with_origins(compiled.packages, origins)
        fresh, notes = _rebuilt_notes(packages, rebuilt)
        built += [*compiled.built, *fresh]
        warnings += notes
    resolution = Resolution(
        compiler.arch, packages, compiled.provided, tuple(built), compiled.pylock, tuple(warnings)
    )
    return resolution, origins


def _rebuilt_notes(
    packages: Sequence[LockedPackage], rebuilt: Sequence[StalePick]
) -> tuple[list[str], list[str]]:
    """For each stale pick whose fresher source was built: "name==version" when the second
    pin took it (and a note saying so), else the stale pick's warning."""
    versions = {p.name: p.version for p in packages}
    built: list[str] = []
    warnings: list[str] = []
    for pick in rebuilt:
        if versions.get(pick.name) == pick.newest:
            built.append(f"{pick.name}=={pick.newest}")
            warnings.append(
                f"note: {pick.name}=={pick.newest} ({pick.newest_uploaded}) has only a"
                f" pure-Python source release: built on the host instead of the old"
                f" wheel {pick.chosen} ({pick.chosen_uploaded})"
            )
        else:
            warnings.append(pick.message())
    return built, warnings


def _with_origins(
    packages: Sequence[LockedPackage], origins: Mapping[str, str]
) -> tuple[LockedPackage, ...]:
    return tuple(replace(package, index=origins.get(package.name, "")) for package in packages)


def _fresher_sources(
    packages: Sequence[LockedPackage],
    requirements: RequirementSet,
    target: Target[BaseFacts],
    arch: Arch,
    cache: Cache,
    find_links: Path,
    annotations: Callable[[], str],
    retries: Retries | None,
) -> tuple[list[str], list[StalePick]]:
    """Warnings for stale picks, and the picks whose newer pure-Python source is now built
    into `find_links` (so that resolving again prefers it); notes for versions another
    distribution holds back (uv's `annotations`, asked for only then). Each is looked up
    on the index it came from: what uv could have chosen (builder.resolve.origins)."""
    if requirements.no_index:
        return [], []  # no index to ask: the wheelhouses and direct sources are what there is
    locked = {
        p.name: p.version for p in packages if not any(w.url.startswith("file:") for w in p.wheels)
    }
    specifiers = {name: _specifier_for(name, requirements) for name in locked}
    indexes = requirements.indexes()
    where = {p.name: as_given(p.index, indexes) for p in packages if p.name in locked}
    try:  # one request a name, for both checks
        listings = index_listings(locked, indexes, retries, where)
    except UserError as error:  # the check informs: the resolution itself stands
        return [f"note: newer releases not checked: {error}"], []
    warnings = pinned_notes(
        locked, {r.name: r.requirement.specifier for r in requirements.requirements}, listings
    )
    stale, held = stale_picks(locked, specifiers, listings, target, arch)
    if held:
        dependents = parse_via(annotations())
        warnings += held_back_notes(held, dependents)
        warnings += requested_held_notes(
            held, dependents, {r.name for r in requirements.requirements}
        )
    rebuilt = []
    for pick in stale:
        if pick.sdist is None:
            warnings.append(pick.message())
            continue
        try:
            why_not = _build_fresher(pick, pick.sdist, requirements, cache, find_links, retries)
        except UserError as error:  # the check informs: the wheel the resolver chose stands
            why_not = f"; its source was not built: {error}"
        if why_not:
            warnings.append(f"{pick.message()}{why_not}")
        else:
            rebuilt.append(pick)
    return warnings, rebuilt


def _build_fresher(
    pick: StalePick,
    source: RemoteFile,
    requirements: RequirementSet,
    cache: Cache,
    find_links: Path,
    retries: Retries | None,
) -> str:
    """Build the newer pure-Python `source` into `find_links` (so that resolving again prefers
    it); what keeps the older wheel when it may not be built, else "". Raises on a failure."""
    requirements.check_hashes([source])  # before its build backend runs here
    sdist = download(source, cache, requirements.indexes(), retries)
    if compiled_code_evidence(sdist):
        return " that compiles native code"
    wheel, _ = build_pure_wheel(sdist, source, cache, _build_options(requirements))
    link = find_links / wheel.name
    if not link.exists():
        link.symlink_to(wheel)
    return ""


def _packages(
    lock: dict, target: Target[BaseFacts], cache: Cache
) -> tuple[tuple[LockedPackage, ...], tuple[str, ...]]:
    packages, provided = [], []
    for entry in lock.get("packages", []):
        name = canonicalize_name(entry["name"])
        if name in target.base.distributions:
            provided.append(f"{name}=={entry['version']}")
            continue
        archive = entry.get("archive", {})
        direct = [archive] if archive.get("path", "").endswith(".whl") else []
        wheels = tuple(_wheel_file(wheel, cache) for wheel in entry.get("wheels", direct))
        packages.append(LockedPackage(name, entry["version"], wheels))
    return tuple(packages), tuple(provided)
