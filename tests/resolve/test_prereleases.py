"""Prereleases as pip picks them, on a loopback PEP 503 index of test-built files.

`bsi-pre` has a final wheel (1.0, which asks for `bsi-dep<3`), an alpha wheel (2.0a1, which
asks for nothing) and a newest beta that is only a pure-Python sdist (2.0b1); the base pins
`bsi-dep==4.0`. uv alone takes the alpha, since the base rules out the final: pip would not,
and the run says the conflict with its way out instead. A requirement naming a prerelease gets
one, and the stale check's warnings name the newest final release, never a prerelease.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from support.projects import pure_sdist
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

from builder.cache import Cache
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.resolve.requirements import read_requirements
from builder.resolve.resolution import Resolution
from builder.resolve.stale import admitted, unwanted_prereleases
from builder.resolve.target import ARCHES, BaseProfile, Target, shipped_facts
from builder.resolve.unresolvable import BaseConflict, base_way_out, implicated_pins, wanted_of
from builder.resolve.uv import resolve

AMD64 = ARCHES["amd64"]
PROFILE = BaseProfile.of(
    replace(shipped_facts(), distributions={"bsi-dep": "4.0"}),
    ImageRef.parse("bsi-test-base:1"),
    digest=None,
    source="test profile",
)
TARGET = Target(PROFILE, (AMD64,))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The loopback index's port."""
    files = tmp_path_factory.mktemp("prerelease-index")
    final = make_wheel(
        files, "bsi-pre", "1.0", "py3-none-any", {"bsi_pre/__init__.py": b"V = 1\n"},
        requires=["bsi-dep<3"],
    )  # fmt: skip
    alpha = make_wheel(files, "bsi-pre", "2.0a1", "py3-none-any", {"bsi_pre/__init__.py": b""})
    beta = pure_sdist(files, "bsi-pre", "2.0b1", "bsi_pre", "V = 'beta'\n")
    dep = make_wheel(files, "bsi-dep", "4.0", "py3-none-any", {"bsi_dep.py": b""})
    with serve_wheel(final, "bsi-pre", more=(alpha, beta), others={"bsi-dep": dep}) as port:
        yield port


def planned(
    index: int, tmp_path: Path, requirement: str, override: str | None = None
) -> Resolution:
    lines = tmp_path / "requirements.txt"
    lines.write_text(f"--index-url http://127.0.0.1:{index}/simple\n{requirement}\n")
    overrides = []
    if override is not None:
        overrides.append(tmp_path / "override.txt")
        overrides[0].write_text(f"{override}\n")
    requirements = read_requirements((lines,), ())
    return resolve(requirements, TARGET, AMD64, Cache(tmp_path / "cache"), overrides=overrides)


def versions(resolution: Resolution) -> dict[str, str]:
    return {p.name: p.version for p in resolution.packages}


def test_a_conflict_ruling_out_every_final_is_said_not_answered_with_an_alpha(
    index: int, tmp_path: Path
) -> None:
    with pytest.raises(UserError) as refused:
        planned(index, tmp_path, "bsi-pre")
    assert str(refused.value) == (
        "cannot resolve for amd64: bsi-pre==1.0 depends on bsi-dep<3, but the base image pins"
        " bsi-dep==4.0. The base's /app/deps comes first on PYTHONPATH, so its bsi-dep 4.0 is"
        " what runs either way: to plan with it, give --override FILE with the line"
        " bsi-dep==4.0"
    )


def test_the_override_named_plans_the_last_final_wheel_and_warns_of_no_prerelease(
    index: int, tmp_path: Path
) -> None:
    resolution = planned(index, tmp_path, "bsi-pre", override="bsi-dep==4.0")
    assert versions(resolution) == {"bsi-pre": "1.0"}
    assert resolution.provided_by_base == ("bsi-dep==4.0",)
    assert not [w for w in resolution.warnings if "2.0" in w], resolution.warnings


def test_a_requirement_naming_a_prerelease_gets_the_newest_one_built_from_source(
    index: int, tmp_path: Path
) -> None:
    resolution = planned(index, tmp_path, "bsi-pre>=2.0b1")
    assert versions(resolution) == {"bsi-pre": "2.0b1"}
    assert "bsi-pre==2.0b1" in resolution.built_from_source


def test_a_pin_on_a_prerelease_gets_it(index: int, tmp_path: Path) -> None:
    assert versions(planned(index, tmp_path, "bsi-pre==2.0a1")) == {"bsi-pre": "2.0a1"}


@pytest.fixture(scope="module")
def asked_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`bsi-app` asks for `bsi-lib>=2.0rc1`; bsi-lib has a final 1.0 and that rc, both wheels."""
    files = tmp_path_factory.mktemp("asked-index")
    app = make_wheel(
        files, "bsi-app", "1.0", "py3-none-any", {"bsi_app.py": b""}, requires=["bsi-lib>=2.0rc1"]
    )
    final = make_wheel(files, "bsi-lib", "1.0", "py3-none-any", {"bsi_lib.py": b""})
    candidate = make_wheel(files, "bsi-lib", "2.0rc1", "py3-none-any", {"bsi_lib.py": b""})
    with serve_wheel(final, "bsi-lib", more=(candidate,), others={"bsi-app": app}) as port:
        yield port


def test_a_prerelease_a_dependency_names_is_taken_as_pip_takes_it(
    asked_index: int, tmp_path: Path
) -> None:
    assert versions(planned(asked_index, tmp_path, "bsi-app")) == {
        "bsi-app": "1.0",
        "bsi-lib": "2.0rc1",
    }


def test_pip_s_rule_admits_a_prerelease_only_when_named_or_alone() -> None:
    found = [Version(v) for v in ("1.0", "1.1rc1", "2.0a4", "2.0rc9")]
    assert admitted(SpecifierSet(), found) == [Version("1.0")]
    assert admitted(SpecifierSet("<2"), found) == [Version("1.0")]
    assert admitted(SpecifierSet(">=2.0b1"), found) == [Version("2.0rc9")]
    assert admitted(SpecifierSet(">1.0"), found) == [
        Version(v) for v in ("1.1rc1", "2.0a4", "2.0rc9")
    ]


def test_an_alpha_is_unwanted_only_where_a_final_wheel_fits(tmp_path: Path) -> None:
    wheels = tmp_path / "w"
    files = [
        make_wheel(wheels, name, version, tag, {f"{name.replace('-', '_')}.py": b""})
        for name, version, tag in (
            ("bsi-a", "1.0", "py3-none-any"),
            ("bsi-a", "2.0a4", "py3-none-any"),
            ("bsi-b", "1.0", "cp313-cp313-win_amd64"),  # no wheel for the target
            ("bsi-b", "2.0a4", "py3-none-any"),
        )
    ]
    from builder.resolve.index import wheelhouse_files

    listings = {name: wheelhouse_files([str(wheels)], name) for name in ("bsi-a", "bsi-b")}
    assert len(listings["bsi-a"]) + len(listings["bsi-b"]) == len(files)
    locked = {"bsi-a": "2.0a4", "bsi-b": "2.0a4"}
    specifiers = {"bsi-a": SpecifierSet(), "bsi-b": SpecifierSet()}
    assert unwanted_prereleases(locked, specifiers, listings, TARGET, AMD64) == ["bsi-a"]
    specifiers["bsi-a"] = SpecifierSet(">=2.0a1")
    assert unwanted_prereleases(locked, specifiers, listings, TARGET, AMD64) == []


BOTOCORE_STDERR = """\
  cause: Because botocore>=1.44.18 depends on python-dateutil>=2.1,<3.0.0 and python-dateutil==4.0.0, we can conclude that botocore>=1.44.18 cannot be used.
         And because you require botocore==1.44.18, we can conclude that your requirements are unsatisfiable.
"""  # noqa: E501


def test_the_way_out_names_the_release_its_want_and_the_override_line() -> None:
    facts = replace(shipped_facts(), distributions={"python-dateutil": "4.0.0", "six": "1.0"})
    profile = BaseProfile.of(facts, ImageRef.parse("x:1"), digest=None, source="test")
    assert implicated_pins(BOTOCORE_STDERR, Target(profile, (AMD64,))) == {
        "python-dateutil": "4.0.0"
    }
    wanted = wanted_of(BOTOCORE_STDERR, "botocore==1.44.18", "python-dateutil")
    assert wanted == "python-dateutil>=2.1,<3.0.0"
    assert wanted_of("uv said it otherwise", "botocore==1.44.18", "python-dateutil") == (
        "python-dateutil"
    )
    conflict = BaseConflict("botocore==1.44.18", wanted, "python-dateutil", "4.0.0")
    message = str(base_way_out([conflict], {"python-dateutil": "4.0.0"}, AMD64))
    assert message.startswith(
        "cannot resolve for amd64: botocore==1.44.18 depends on python-dateutil>=2.1,<3.0.0,"
        " but the base image pins python-dateutil==4.0.0."
    )
    assert message.endswith("with the line python-dateutil==4.0.0")
    assert "\n" not in message
