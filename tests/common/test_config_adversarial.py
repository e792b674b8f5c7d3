"""Config, build state and Docker config files of the wrong shape: one error naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from support.credhelp import write_docker_config
from support.registryhelp import forget_credentials

from builder.base.platforms import select_arches
from builder.cli.app import main
from builder.config import RunSettings, load_config, merge, set_platform_version, settings_of
from builder.credentials import lookup
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.orchestration import commands
from builder.publish.state import load_state
from builder.resolve.target import REFERENCE_BASE

BASE = 'requirements = ["r.txt"]\nbase-repository = "reg.example/rt"\nplatform-version = "1.0"\n'
DEFAULT_BASE = ImageRef.parse(REFERENCE_BASE)  # what the CLI passes when --base-image is not given


def _config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "bsi.toml"
    path.write_text(BASE + extra)
    return path


@pytest.mark.parametrize(
    ("extra", "culprit"),
    [
        ("output = 5\n", "'output' must be a string"),
        ("state = true\n", "'state' must be a string"),
        ("template = [1]\n", "'template' must be a string"),
        ('repository = {a = "b"}\n', "'repository' must be a string"),
        ('architectures = "amd64"\n', "'architectures' must be a list of names"),
        ("apt-ca-bundle = 1\n", "'apt-ca-bundle' must be a string"),
        ('bytecode = "no"\n', "'bytecode' must be true or false"),
        ('skip-modules = "pkg.*"\n', "'skip-modules' must be a list of module patterns"),
        ('no-index = "yes"\n', "'no-index' must be true or false"),
        ("find-links = [1]\n", "'find-links' must be a list of directories or URLs"),
    ],
)
def test_settings_of_the_wrong_type_name_the_setting(tmp_path, extra, culprit):
    with pytest.raises(UserError, match=culprit):
        load_config(_config(tmp_path, extra))


VERSIONLESS = 'requirements = ["r.txt"]\nbase-repository = "reg.example/rt"\n'


@pytest.mark.parametrize(
    ("written", "message"),
    [
        (
            "1.10",
            "'platform-version' must be a string, not a number (1.10):"
            ' write it quoted, platform-version = "1.10"',
        ),
        ("2", 'not a number (2): write it quoted, platform-version = "2"'),
        ("2026-01-01", 'not a date (2026-01-01): write it quoted, platform-version = "2026-01-01"'),
        ("true", "not true or false (true)"),
        ('["1.4"]', 'must be a string, not a list (["1.4"])'),
        ('"1.4 beta"', "'platform-version' '1.4 beta' is not a valid tag"),
        ('""', "'platform-version' '' is not a valid tag"),
    ],
)
def test_a_platform_version_not_written_as_a_tag_is_refused(
    tmp_path: Path, written: str, message: str
) -> None:
    """`platform-version = 1.10` is the TOML number 1.1: read as written, it is refused in
    one line that says to quote it, never turned into the base `runtime:1.1`."""
    path = tmp_path / "bsi.toml"
    path.write_text(f"{VERSIONLESS}platform-version = {written}   # the new platform\n")
    with pytest.raises(UserError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: 'platform-version' ")
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("container = 2\n", "'container' must be a string, not a number (2): write it quoted"),
        ("torch-backend = false\n", "'torch-backend' must be a string, not true or false"),
        (
            'requirements = "r.txt"\n',
            "'requirements' must be a list of paths, not a string:"
            ' write requirements = ["r.txt"]',
        ),
        ("without-programs = 3\n", "'without-programs' must be a list of program names, not a"),
        ('warm-pools = ["a.yaml", 1]\n', "'warm-pools' must be a list of paths: 1 is not one"),
        ("soci = 0\n", "'soci' must be true or false (unquoted), not a number"),
        (
            'find-links = "https://ci:hunter2@mirror.example/w/"\n',
            'write find-links = ["https://***@mirror.example/w/"]',
        ),
    ],
)
def test_a_setting_of_the_wrong_shape_says_what_it_found(
    tmp_path: Path, extra: str, message: str
) -> None:
    text = (
        BASE + extra
        if not extra.startswith("requirements")
        else BASE.replace('requirements = ["r.txt"]\n', extra)
    )
    path = tmp_path / "bsi.toml"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        load_config(path)
    assert message in str(caught.value) and "hunter2" not in str(caught.value)


def test_bytecode_is_on_unless_the_config_turns_it_off(tmp_path):
    assert load_config(_config(tmp_path)).bytecode is True
    assert load_config(_config(tmp_path, "bytecode = false\n")).bytecode is False


def test_platform_version_is_never_written_as_toml_syntax(tmp_path):
    """A version ending the quoted string would add settings to the config."""
    path = _config(tmp_path)
    config = load_config(path)
    with pytest.raises(UserError, match="is not a valid tag"):
        set_platform_version(config, '2.0"\nrepository = "evil.example/x')
    assert path.read_text() == BASE
    set_platform_version(config, "2.0")
    assert load_config(path).platform_version == "2.0"


@pytest.mark.parametrize("content", [b"[1, 2]", b'"state"', b"\xff\xfe{", b'{"packages": 1}'])
def test_build_state_of_another_shape_is_unreadable(tmp_path, content):
    path = tmp_path / "bsi.state.json"
    path.write_bytes(content)
    with pytest.raises(UserError, match="unreadable build state"):
        load_state(path)


def test_docker_config_auth_that_is_not_text_is_no_login(monkeypatch, tmp_path):
    forget_credentials(monkeypatch, tmp_path / "home")
    auths = {"reg.example": {"auth": 12345}, "other.example": {"auth": ["x"]}}
    write_docker_config(tmp_path / "cfg", {"auths": auths}, monkeypatch)
    assert lookup("reg.example") is None
    assert lookup("other.example") is None


def test_apt_secrets_in_a_config_are_relative_to_it_and_flags_win(tmp_path):
    config = load_config(_config(tmp_path, 'apt-ca-bundle = "ca.pem"\napt-auth = "a/auth.conf"\n'))
    assert config.apt_secrets == {
        "apt-ca": tmp_path / "ca.pem",
        "apt-auth": tmp_path / "a/auth.conf",
    }
    assert load_config(_config(tmp_path)).apt_secrets == {}
    from_config = merge(RunSettings((), DEFAULT_BASE), config, output_given=False, base_given=False)
    assert from_config.apt_secrets == config.apt_secrets
    flags = RunSettings((), DEFAULT_BASE, apt_secrets={"apt-ca": tmp_path / "flag.pem"})
    merged = merge(flags, config, output_given=False, base_given=False)
    assert merged.apt_secrets == {"apt-ca": tmp_path / "flag.pem"}


def test_find_links_of_a_config_are_relative_to_it_and_no_index_is_off_unless_said(tmp_path):
    (tmp_path / "wheels").mkdir()
    plain = load_config(_config(tmp_path))
    assert (plain.find_links, plain.no_index) == ((), False)
    extra = 'find-links = ["wheels", "https://mirror.example/w/"]\nno-index = true\n'
    config = load_config(_config(tmp_path, extra))
    assert config.find_links == (str(tmp_path / "wheels"), "https://mirror.example/w/")
    flags = RunSettings((), DEFAULT_BASE, find_links=("/srv/more",))
    merged = merge(flags, config, output_given=False, base_given=False)
    assert (merged.find_links, merged.no_index) == ((*config.find_links, "/srv/more"), True)
    with pytest.raises(UserError, match=r"bsi.toml: 'find-links': .*'gone' does not exist"):
        load_config(_config(tmp_path, 'find-links = ["gone"]\n'))


def test_skip_modules_of_the_config_and_the_flags_both_apply(tmp_path):
    config = load_config(_config(tmp_path, 'skip-modules = ["IPython.*", "pkg.osx"]\n'))
    flags = RunSettings((), DEFAULT_BASE, skip_modules=("pkg.osx", "numba.pycc*"))
    merged = merge(flags, config, output_given=False, base_given=False)
    assert merged.skip_modules == ("IPython.*", "pkg.osx", "numba.pycc*")


def test_the_config_s_base_wins_over_the_default_and_a_given_flag_over_the_config(tmp_path):
    """--base-image always has a value (the default is parsed as a given one is): only whether
    the operator gave it decides between it and the config's base."""
    config = load_config(_config(tmp_path))
    flags = RunSettings((), DEFAULT_BASE)
    assert merge(flags, None, output_given=False, base_given=False).base_image == DEFAULT_BASE
    from_config = merge(flags, config, output_given=False, base_given=False)
    assert from_config.base_image.as_written == "reg.example/rt:1.0"
    given = RunSettings((), ImageRef.parse("other.example/rt:2"))
    merged = merge(given, config, output_given=False, base_given=True)
    assert merged.base_image.as_written == "other.example/rt:2"
    defaulted = merge(flags, config, output_given=False, base_given=True)  # typed out, as given
    assert defaulted.base_image == DEFAULT_BASE


@pytest.mark.parametrize(
    ("config", "flags", "expected"),
    [
        (False, (), REFERENCE_BASE),
        (True, (), "reg.example/rt:1.0"),
        (True, ("--base-image", REFERENCE_BASE), REFERENCE_BASE),
        (True, ("--base-image", "other.example/rt:2"), "other.example/rt:2"),
    ],
)
def test_the_cli_tells_a_given_base_image_from_its_default(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    config: bool,
    flags: tuple[str, ...],
    expected: str,
) -> None:
    """The default --base-image is parsed like a given one; the config's base replaces only the
    default, never a flag the operator typed, even one equal to the default."""
    seen = []

    def build(settings: RunSettings, *_: object) -> None:
        seen.append(settings.base_image.as_written)
        raise UserError("stopped after the settings")

    monkeypatch.setattr(commands, "build", build)
    given = ("--config", str(_config(tmp_path))) if config else ("-r", "r.txt")
    args = [*given, *flags, "--no-build", "--cache-dir", str(tmp_path / "cache")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and seen == [expected], (result.output, seen)


@pytest.mark.parametrize("config", [False, True])
def test_the_default_arches_are_every_arch_the_base_offers_with_or_without_a_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: bool
) -> None:
    """A config that names no architectures asks what no --arch asks: every arch the base
    offers (builder.base.platforms.select_arches decides from the run's settings), for a build
    and for a config's rebuild alike; a config's architectures narrow as --arch does."""
    seen: list[tuple[str, ...]] = []

    def build(settings: RunSettings, *_: object) -> None:
        seen.append(settings.arches)
        raise UserError("stopped after the settings")

    monkeypatch.setattr(commands, "build", build)
    (tmp_path / "r.txt").write_text("six\n")
    given = ("--config", str(_config(tmp_path))) if config else ("-r", str(tmp_path / "r.txt"))
    result = CliRunner().invoke(main, [*given, "--no-build", "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 1 and len(seen) == 1, (result.output, seen)
    offered = ("amd64", "arm64")
    assert select_arches(seen[0], offered, "reg.example/rt:1.0") == offered
    if config:
        rebuilt = settings_of(load_config(_config(tmp_path)))
        assert select_arches(rebuilt.arches, offered, "reg.example/rt:1.0") == offered
        narrowed = load_config(_config(tmp_path, 'architectures = ["arm64"]\n'))
        assert select_arches(narrowed.architectures, offered, "reg.example/rt:1.0") == ("arm64",)
