"""A run's settings, resolved once (builder.config.Settings): a flag and a config key reach the
one record, and what follows from it and the plan is derived in one place."""

from __future__ import annotations

from pathlib import Path

from builder.config import RunSettings, Settings, load_config, merge, with_flags
from builder.engines.per_arch import engine_flags
from builder.oci.name import ImageRef
from builder.publish.publisher import Target, target_of

CONFIG = (
    'requirements = ["r.txt"]\nbase-repository = "reg.example/rt"\nplatform-version = "1.0"\n'
    'repository = "reg.example/team/rt"\nskip-modules = ["pkg.osx"]\nsoci = false\n'
    'cache-max = "1GB"\n[engines]\narm64 = "ssh://arm"\namd64 = "ssh://amd"\n'
)
EXTRAS = "ab" * 6
BASE = ImageRef.parse("reg.example/rt:1.0")


def _resolved(tmp_path: Path, flags: RunSettings) -> Settings:
    path = tmp_path / "bsi.toml"
    path.write_text(CONFIG)
    asked = merge(flags, load_config(path), output_given=False, base_given=False)
    return Settings(asked, asked.base_image, EXTRAS)


def test_a_flag_and_a_config_key_reach_the_one_record(tmp_path: Path) -> None:
    flags = RunSettings(
        (),
        ImageRef.parse("cli.example/default:9"),  # the CLI's default: the config's base wins
        skip_modules=("numba.pycc*",),
        strict=True,
        engines=engine_flags(["arm64=ssh://other"]),
        cache_max=5,
    )
    settings = _resolved(tmp_path, flags)
    assert settings.asked.requirements == (tmp_path / "r.txt",)  # the config's, by its place
    assert settings.asked.skip_modules == ("pkg.osx", "numba.pycc*")  # both
    assert (settings.asked.strict, settings.asked.soci) == (True, False)  # a flag, a key
    engines = {arch: url.url for arch, url in settings.asked.engines.items()}
    assert engines == {"arm64": "ssh://other", "amd64": "ssh://amd"}  # per arch, the flag wins
    assert settings.asked.cache_max == 5
    assert settings.platform_version == "1.0"  # the config's
    assert settings.local_tag == f"sandbox-extension:x{EXTRAS}"
    repository = ImageRef.parse_repository("reg.example/team/rt")
    target = Target(repository, f"1.0-x{EXTRAS}", {"a": "b"}, soci=False, base=BASE)
    assert target_of(settings, {"a": "b"}) == target


def test_a_rebuild_lays_its_flags_over_its_config_by_the_build_s_rule(tmp_path: Path) -> None:
    """`rebuild --engine --cache-max` and `build --config` share `with_flags`: one rule."""
    path = tmp_path / "bsi.toml"
    path.write_text(CONFIG)
    config = load_config(path)
    engines = engine_flags(["arm64=ssh://other"])
    rebuilt = with_flags(config, engines, 5)
    built = _resolved(tmp_path, RunSettings((), BASE, engines=engines, cache_max=5)).asked
    assert (rebuilt.engines, rebuilt.cache_max) == (built.engines, built.cache_max)
    assert with_flags(config, {}, None) is config
    assert with_flags(config, {}, 0).cache_max == 0  # 0 is given: unbounded


def test_what_follows_from_the_settings_and_the_plan_is_derived_once() -> None:
    base = ImageRef.parse("reg.example/rt:2.5")
    asked = RunSettings((), base)
    settings = Settings(asked, base, EXTRAS)
    assert settings.platform_version == "2.5"  # none asked: the base's tag
    by_digest = ImageRef.parse("reg.example/rt@sha256:" + "0" * 64)
    assert Settings(asked, by_digest, EXTRAS).platform_version == "latest"  # no tag to say it
    assert (
        Settings(RunSettings((), base, platform_version="3"), base, EXTRAS).platform_version == "3"
    )
    assert target_of(settings, {}) is None  # nothing pushed
    tagged = Settings(RunSettings((), base, tag="mine:1"), base, EXTRAS)
    assert tagged.local_tag == "mine:1"
    repository = ImageRef.parse_repository("reg.example/team/rt")
    part = Settings(RunSettings((), base, push_repository=repository), base, EXTRAS, "arm64")
    assert part.local_tag == f"sandbox-extension:x{EXTRAS}-arm64"  # a runner's: its arch
    target = target_of(part, {})
    assert target is not None and target.by_digest and target.tag == f"2.5-x{EXTRAS}"
