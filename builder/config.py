"""The pipeline config file, and the one record of a run's settings built from it and the flags.

`PipelineConfig` is the file as written; `RunSettings` is what one run is asked, made once
(`merge`: the flags over the config; `settings_of`: a `rebuild`'s, the config alone) and read
by the planning. `Settings` is that record resolved once the plan exists (a `rebuild` plans
against the next base, so some values are known only then): the asked settings whole, with the
values derived from them and the plan (the platform version, the local tag) computed here
once; it is what the producers, the delivery and the publisher are handed, and what the plan
document carries to a runner's `part` and `merge` (builder.orchestration.runners). Adding an
option is the flag, the config key and a field of `RunSettings`. A config file gives
everything a CI job needs, so it runs one short command:

    # build-sandbox-image.toml
    requirements = ["requirements.txt"]
    base-repository = "registry.example.com/sandbox/runtime"
    platform-version = "1.4.2"
    architectures = ["amd64"]       # optional, as --arch: default every arch the base offers
    repository = "registry.example.com/sandbox/runtime-extended"
    template = "sandbox-template.yaml"
    apt-ca-bundle = "corp-ca.pem"   # optional, as --apt-ca-bundle: a BuildKit secret only
    apt-auth = "apt-auth.conf"      # optional, as --apt-auth
    bytecode = false                # optional, as --no-bytecode: ship no .pyc (default true)
    sign-key = "cosign.key"         # optional, as --sign-key: sign what is pushed (cosign format)
    soci = false                    # optional, as --no-soci: attach no SOCI index (default true)
    without-programs = ["ffmpeg"]   # optional, as --without-program: never install these
                                    # programs' packages (names of programs or of packages)
    torch-backend = "cpu"           # optional, as --torch-backend: PyTorch's CPU build from
                                    # its own index (uv's --torch-backend), no CUDA wheels
    cache-max = "5GB"               # optional, as --cache-max: the cache's bound at the end of
                                    # every build (default: the smaller of 20 GB and 10 % of
                                    # its file system; 0: unbounded)
    wheel-max = "16GiB"             # optional, as --wheel-max: the most a wheel may unpack to
                                    # (default 8 GiB; 0: unbounded)
    cache-from = ["registry.example/team/sandbox:latest"]
                                    # optional, as --cache-from: images this tool pushed whose
                                    # build facts and layers seed the cache (default: the one
                                    # the state last pushed)

    [engines]                       # optional, as --engine ARCH=URL (a flag wins for its arch)
    arm64 = "ssh://builder@arm64-host"

Relative paths are relative to the config file. `state` (default: the config's name with
`.state.json`) records what was last built and pushed, so a rebuild can say what changed.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from builder.cache.bound import parse_size
from builder.engines.connection import EngineURL
from builder.engines.per_arch import known_arch
from builder.errors import UserError
from builder.files import refuse_link, refuse_links_below, write_whole
from builder.oci.name import TAG_RE, ImageRef
from builder.reporter import redact_credentials
from builder.resolve.index_options import torch_backend
from builder.resolve.requirements import find_links, read_regular

KNOWN_KEYS = frozenset(
    {
        "requirements",
        "constraints",
        "base-repository",
        "platform-version",
        "architectures",
        "skip-modules",
        "find-links",
        "no-index",
        "repository",
        "template",
        "container",
        "warm-pools",
        "output",
        "state",
        "apt-ca-bundle",
        "apt-auth",
        "bytecode",
        "soci",
        "engines",
        "sign-key",
        "without-programs",
        "torch-backend",
        "cache-max",
        "wheel-max",
        "cache-from",
    }
)
MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; a device or a dump is refused
# setting -> BuildKit secret id
APT_SECRETS = MappingProxyType({"apt-ca-bundle": "apt-ca", "apt-auth": "apt-auth"})
VERSION_LINE = re.compile(r'^(platform-version\s*=\s*)(["\'])(.*?)\2', re.M)


@dataclass(frozen=True)
class PipelineConfig:
    """The config file, as written: each setting typed, paths made relative to the file.

    Not the run's settings: `merge` lays the flags over it into the one `RunSettings`."""

    path: Path
    requirements: tuple[Path, ...]
    constraints: tuple[Path, ...]
    base_repository: ImageRef  # parsed here, where the text enters
    platform_version: str
    architectures: tuple[str, ...]  # empty: every arch the base offers (as without a config)
    repository: ImageRef | None  # parsed here, where the text enters
    template: Path | None
    container: str | None
    warm_pools: tuple[Path, ...]
    output: Path
    state: Path
    apt_secrets: Mapping[str, Path] = field(default_factory=dict)  # BuildKit secret id -> file
    bytecode: bool = True  # compile the extras' .pyc into bytecode layers
    engines: Mapping[str, EngineURL] = field(default_factory=dict)  # arch -> its own engine
    sign_key: Path | None = None  # cosign's encrypted key or a PKCS#8 PEM (builder.sign.keys)
    soci: bool = True  # attach a SOCI index (lazy loading) to each pushed arch image
    without_programs: tuple[str, ...] = ()  # programs (or packages) never to install
    skip_modules: tuple[str, ...] = ()  # fnmatch patterns of modules deep imports leave out
    torch_backend: str | None = None  # uv's --torch-backend (builder.resolve.index_options)
    find_links: tuple[str, ...] = ()  # wheelhouses: directories (relative to it) or URLs
    no_index: bool = False  # only wheelhouses and direct requirements, no package index
    cache_max: int | None = None  # bytes; None: the default bound, 0: unbounded
    wheel_max: int | None = None  # bytes a wheel may unpack to; None: the default, 0: unbounded
    cache_from: tuple[ImageRef, ...] = ()  # images whose build facts seed the cache

    @property
    def base_image(self) -> ImageRef:
        return self.base_image_for(self.platform_version)

    def base_image_for(self, platform_version: str) -> ImageRef:
        return self.base_repository.with_tag(platform_version)


def load_config(path: Path) -> PipelineConfig:
    """The config at `path`; a setting unknown, missing or of the wrong type is one error
    naming the file and the setting, and so is a file it names for the tool to write (the
    state, the template, the output) reached through a symlink below its directory."""
    table = _Table(path, *_read(path))
    here = path.parent
    base_repository = table.repository("base-repository")
    if base_repository is None:
        raise UserError(f"{path}: 'base-repository' is empty")
    config = PipelineConfig(
        path=path,
        requirements=table.paths("requirements"),
        constraints=table.paths("constraints"),
        base_repository=base_repository,
        platform_version=table.version(),
        architectures=table.names("architectures", "names"),
        repository=table.repository("repository"),
        template=table.path("template"),
        container=table.text("container"),
        warm_pools=table.paths("warm-pools"),
        output=here / str(table.text("output", "sandbox-image")),
        state=here / str(table.text("state", f"{path.stem}.state.json")),
        apt_secrets={
            secret: file for key, secret in APT_SECRETS.items() if (file := table.path(key))
        },
        bytecode=table.switch("bytecode"),
        engines=table.engines(),
        sign_key=table.path("sign-key"),
        soci=table.switch("soci"),
        without_programs=table.names("without-programs", "program names"),
        skip_modules=table.names("skip-modules", "module patterns"),
        torch_backend=table.torch_backend(),
        find_links=tuple(
            find_links(value, f"{path}: 'find-links'", here)
            for value in table.names("find-links", "directories or URLs")
        ),
        no_index=table.switch("no-index", default=False),
        cache_max=_size(table.data.get("cache-max"), f"{path}: 'cache-max'"),
        wheel_max=_size(table.data.get("wheel-max"), f"{path}: 'wheel-max'"),
        cache_from=table.references("cache-from"),
    )
    for written in (config.state, config.template, config.output):
        if written is not None:
            refuse_links_below(here, written)
    return config


def _read(path: Path) -> tuple[dict[str, object], str]:
    """The TOML at `path`, with every required setting and no unknown one, and its text."""
    try:
        raw, _ = read_regular(path, "pipeline config", MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise UserError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; not a config")
        text = raw.decode()
        data = tomllib.loads(text)
    except OSError as error:
        raise UserError(f"{path}: cannot read config ({error.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{path}: not valid TOML ({error})") from None
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        raise UserError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    for key in ("requirements", "base-repository", "platform-version"):
        if key not in data:
            raise UserError(f"{path}: missing setting {key!r}")
    return data, text


@dataclass(frozen=True)
class _Table:
    """The config's settings read one by one: each reader checks its value's type and names
    the setting (and the file) when it is wrong, saying what it found. Values are read as
    written: nothing is turned into a string or a list on the operator's behalf."""

    file: Path
    data: Mapping[str, object]
    source: str = ""  # the file's text, to quote a value as written

    def paths(self, key: str) -> tuple[Path, ...]:
        return tuple(self.file.parent / v for v in self.names(key, "paths", empty=True))

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is not None and not isinstance(value, str):
            raise UserError(f"{self.file}: {key!r} must be a string, {self.found(key, value)}")
        return value

    def version(self) -> str:
        """platform-version, a tag as written: unquoted, 1.10 is the TOML number 1.1."""
        value = self.text("platform-version") or ""
        if not TAG_RE.fullmatch(value):
            raise UserError(f"{self.file}: 'platform-version' {value[:80]!r} is not a valid tag")
        return value

    def found(self, key: str, value: object) -> str:
        """What the config gives `key` instead, and how to write it quoted when that is it."""
        written = redact_credentials(_written(self.source, key) or repr(value))
        kind = _kind(value)
        if isinstance(value, bool | int | float) or kind == "a date":
            return f'not {kind} ({written}): write it quoted, {key} = "{written}"'
        return f"not {kind} ({written[:80]})"

    def path(self, key: str) -> Path | None:
        """A file named relative to the config; None when the setting is absent or empty."""
        value = self.text(key)
        return self.file.parent / value if value else None

    def names(self, key: str, what: str, empty: bool = False) -> tuple[str, ...]:
        """A list of names (`what` says of what, in the error); non-empty unless `empty`."""
        value = self.data.get(key, [])
        if isinstance(value, str):
            shown = redact_credentials(value[:80])
            raise UserError(
                f"{self.file}: {key!r} must be a list of {what}, not a string:"
                f' write {key} = ["{shown}"]'
            )
        if not isinstance(value, list):
            raise UserError(
                f"{self.file}: {key!r} must be a list of {what}, {self.found(key, value)}"
            )
        wrong = [v for v in value if not isinstance(v, str) or not (v or empty)]
        if wrong:
            raise UserError(
                f"{self.file}: {key!r} must be a list of {what}:"
                f" {redact_credentials(repr(wrong[0])[:80])} is not one"
            )
        return tuple(value)

    def switch(self, key: str, default: bool = True) -> bool:
        """A setting that is `default` unless the config says otherwise."""
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise UserError(
                f"{self.file}: {key!r} must be true or false (unquoted), not {_kind(value)}"
            )
        return value

    def repository(self, key: str) -> ImageRef | None:
        value = self.text(key)
        return self._references(key, (value,), repository=True)[0] if value else None

    def references(self, key: str) -> tuple[ImageRef, ...]:
        """A list of image references (tags or digests)."""
        return self._references(key, self.names(key, "image references"), repository=False)

    def _references(
        self, key: str, values: Sequence[str], repository: bool
    ) -> tuple[ImageRef, ...]:
        """Each of `values` parsed (the config's one parse site); a repository takes neither
        tag nor digest."""
        what = f"{self.file}: {key}"
        found = tuple(ImageRef.parse(value, what) for value in values)
        if repository and (named := next((r for r in found if r.tag or r.digest), None)):
            raise UserError(
                f"{what} {named.as_written!r}: give a repository without a tag or digest"
            )
        return found

    def engines(self) -> dict[str, EngineURL]:
        """[engines]: arch -> its engine's URL (relative paths are the config's)."""
        engines = self.data.get("engines", {})
        if not isinstance(engines, dict) or not all(isinstance(v, str) for v in engines.values()):
            raise UserError(f"{self.file}: [engines] must map arches to engine URLs")
        return {
            known_arch(arch, f"{self.file}: [engines]"): EngineURL.parse(
                url, f"{self.file}: [engines] {arch}", self.file.parent
            )
            for arch, url in engines.items()
        }

    def torch_backend(self) -> str | None:
        backend = self.text("torch-backend")
        return torch_backend(backend, f"{self.file}: torch-backend") if backend else None


def _kind(value: object) -> str:
    """A TOML value's type, as an operator calls it."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a table" if isinstance(value, dict) else "a date"


def _written(text: str, key: str) -> str | None:
    """The value of the top-level `key` as the file writes it (None when not on one line)."""
    line = re.search(
        rf"""^[ \t]*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')[ \t]*=[ \t]*"""
        r"""([^#\r\n]*?)[ \t]*(?:#.*)?$""",
        text,
        re.M,
    )
    return line.group(1) if line else None


def _size(value: object, what: str) -> int | None:
    """A size setting: a number of bytes, or a string as --cache-max takes it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UserError(f'{what} must be a size such as "20GB" (or 0 for unbounded)')
    return parse_size(str(value), what)


def set_platform_version(config: PipelineConfig, version: str) -> None:
    """Record the new platform version in the config, changing only that value.

    Only a valid image tag is written: it goes between quotes in TOML, where a quote or a
    newline would end the string and add settings of its own.
    """
    if not TAG_RE.fullmatch(version):
        raise UserError(f"{config.path}: platform version {version[:80]!r} is not a valid tag")
    refuse_link(config.path)
    text = config.path.read_text()
    updated, count = VERSION_LINE.subn(
        lambda m: f"{m.group(1)}{m.group(2)}{version}{m.group(2)}", text, count=1
    )
    if count != 1:
        raise UserError(f"{config.path}: no quoted platform-version line to update")
    write_whole(config.path, updated, durable=True)  # its mode kept, never through a link


def check_version_settable(config: PipelineConfig) -> None:
    """A rebuild's check before it builds anything: the config holds the quoted
    platform-version line `set_platform_version` rewrites once the new image is pushed."""
    try:
        text = config.path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{config.path}: cannot read config ({error})") from None
    if VERSION_LINE.search(text) is None:
        raise UserError(f"{config.path}: no quoted platform-version line to update")


@dataclass(frozen=True)
class RunSettings:
    """What one run is asked, from flags, a config file, or both: made once (`merge`,
    `settings_of`) and read by every step after. Every switch is named for what it turns on."""

    requirements: tuple[Path, ...]
    base_image: ImageRef  # the CLI's default when neither flag nor config names one
    constraints: tuple[Path, ...] = ()
    arches: tuple[str, ...] = ()  # empty: every arch the base offers
    output: Path = Path("sandbox-image")  # the build context's directory (report.json's)
    push_repository: ImageRef | None = None
    platform_version: str | None = None  # for labels and tags; default: the base image's tag
    template: Path | None = None
    container: str | None = None
    warm_pools: tuple[Path, ...] = ()
    apt_secrets: Mapping[str, Path] = field(default_factory=dict)  # BuildKit secret id -> file
    bytecode: bool = True  # compile the extras' .pyc into bytecode layers
    engines: Mapping[str, EngineURL] = field(default_factory=dict)  # arch -> its own engine
    sign_key: Path | None = None
    soci: bool = True  # attach a SOCI index to each pushed arch image
    without_programs: tuple[str, ...] = ()  # programs (or packages) never to install
    skip_modules: tuple[str, ...] = ()  # fnmatch patterns of modules deep imports leave out
    torch_backend: str | None = None  # uv's --torch-backend: PyTorch's own build (cpu)
    find_links: tuple[str, ...] = ()  # --find-links wheelhouses, beside the files' own
    no_index: bool = False  # --no-index: only wheelhouses and direct requirements
    cache_max: int | None = None  # bytes; None: the default bound, 0: unbounded
    # bytes a wheel may unpack to; None: builder.inspect.members.UNPACKED_MAX, 0: unbounded
    wheel_max: int | None = None
    cache_dir: Path | None = None  # None: the default cache (builder.cache.default_root)
    state: Path | None = None  # a config's run records what it pushed here, for `rebuild`
    refresh: bool = False  # ask the index again instead of trusting the cached answers
    overrides: tuple[Path, ...] = ()  # uv override files: replace or drop dependencies
    with_optional: bool = False  # also install what only on-demand plugins need
    build: bool = True  # build the images (else stop after writing the context)
    verify: bool = True  # verify the images (and gate a push on it)
    strict: bool = False  # a verification warning (a noisy import) fails it too
    tag: str | None = None  # the local tag; default sandbox-extension:x<extras>
    # images whose build facts seed the cache (builder.publish.cache_from); empty: the state's
    cache_from: tuple[ImageRef, ...] = ()


@dataclass(frozen=True)
class Settings:
    """A run's settings resolved: what it was asked, whole, and the two facts of its plan the
    rest follow from. Each derived value has its one function here; a runner's part and merge
    get the planning run's record from the plan document, their own flags laid over it."""

    asked: RunSettings
    base: ImageRef  # the plan's base reference: its tag is the default platform version
    extras_hash: str  # the plan's (builder.orchestration.prepare.extras_hash_of)
    part: str | None = None  # a runner's part: the one arch it builds (its images name it)

    @property
    def platform_version(self) -> str:
        """The platform version the image is built for: asked, else the base image's tag."""
        return self.asked.platform_version or self.base.tag or "latest"

    @property
    def local_tag(self) -> str:
        """What the engine calls the built images: --tag, else sandbox-extension:x<extras>
        (a part's: with its arch, and no --tag: its planning run built nothing to name)."""
        if self.part is not None:
            return f"sandbox-extension:x{self.extras_hash}-{self.part}"
        return self.asked.tag or f"sandbox-extension:x{self.extras_hash}"


def merge(
    flags: RunSettings, config: PipelineConfig | None, *, output_given: bool, base_given: bool
) -> RunSettings:
    """Flags given on the command line win; the config fills in what they leave out.

    `output` and `base_image` always have a value (the CLI's default when no flag names one),
    so `output_given` and `base_given` say whether the operator gave the flag: a config's value
    wins over a default, a flag wins over the config. Only a config names a state file."""
    if config is None:
        return _replaceable(flags)
    config = with_flags(config, flags.engines, flags.cache_max)
    merged = replace(
        flags,
        requirements=flags.requirements or config.requirements,
        constraints=flags.constraints or config.constraints,
        arches=flags.arches or config.architectures,
        base_image=flags.base_image if base_given else config.base_image,
        output=flags.output if output_given else config.output,
        push_repository=flags.push_repository or config.repository,
        platform_version=flags.platform_version or config.platform_version,
        template=flags.template or config.template,
        container=flags.container or config.container,
        warm_pools=flags.warm_pools or config.warm_pools,
        apt_secrets=flags.apt_secrets or config.apt_secrets,
        bytecode=flags.bytecode and config.bytecode,
        engines=config.engines,  # the flags' over it (`with_flags`), as cache_max
        sign_key=flags.sign_key or config.sign_key,
        soci=flags.soci and config.soci,
        without_programs=tuple(dict.fromkeys(config.without_programs + flags.without_programs)),
        skip_modules=tuple(dict.fromkeys(config.skip_modules + flags.skip_modules)),
        torch_backend=flags.torch_backend or config.torch_backend,
        find_links=tuple(dict.fromkeys(config.find_links + flags.find_links)),
        no_index=flags.no_index or config.no_index,
        cache_max=config.cache_max,
        wheel_max=config.wheel_max if flags.wheel_max is None else flags.wheel_max,
        state=config.state,
        cache_from=flags.cache_from or config.cache_from,
    )
    return _replaceable(merged)


def _replaceable(settings: RunSettings) -> RunSettings:
    """`settings`, once neither file the run may replace (the state, the template) is a
    symlink: refused now, before any work, rather than after a push (builder.files)."""
    for path in (settings.state, settings.template):
        if path is not None:
            refuse_link(path)
    return settings


def settings_of(config: PipelineConfig) -> RunSettings:
    """A run's settings from the config alone (a `rebuild`'s): what `merge` fills in. The
    config itself is rewritten at the end (`set_platform_version`): not if it is a symlink."""
    refuse_link(config.path)
    return merge(
        RunSettings(config.requirements, config.base_image),
        config,
        output_given=False,
        base_given=False,
    )


def with_flags(
    config: PipelineConfig, engines: Mapping[str, EngineURL], cache_max: int | None
) -> PipelineConfig:
    """The config with the flags a config's run takes over it (`build --config` through
    `merge`, `rebuild` directly): per arch, an --engine wins over [engines]; --cache-max wins
    over cache-max."""
    if not engines and cache_max is None:
        return config
    over = config.cache_max if cache_max is None else cache_max
    return replace(config, engines={**config.engines, **engines}, cache_max=over)
