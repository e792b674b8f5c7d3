"""Where each distribution came from (builder.resolve.origins): the index uv took it from, as
the resolution, the plan's table, report.json and the SBOM say it, credentials removed; and
which indexes are read at all (plain http only on loopback)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.plans import plan_for, reference_profile
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

from builder.attest.contents import PythonDistribution, WheelOrigin, distribution
from builder.attest.sbom import ImageContents, listed, timestamp, wheel_origins
from builder.attest.sbom_render import sbom_document
from builder.cache import Cache
from builder.cli.summary import summary
from builder.errors import UserError
from builder.plan.plan import ArchPlan, Plan
from builder.publish.attachments import wheel_origin
from builder.resolve.origins import as_given, is_default
from builder.resolve.requirements import read_requirements
from builder.resolve.target import ARCHES, Target
from builder.resolve.uv import resolve

AMD64 = ARCHES["amd64"]
CPU = "bsi-cpu-build"


def _wheels(tmp_path: Path) -> tuple[Path, Path]:
    """A `+cpu` distribution (another index's) and the dependency it needs (the main index's)."""
    cpu = make_wheel(
        tmp_path / "wheels", CPU, "1.0+cpu", "py3-none-any", {"bsi_cpu_build/__init__.py": b""},
        requires=["bsi-plain-dep"],
    )  # fmt: skip
    dep = make_wheel(
        tmp_path / "wheels", "bsi-plain-dep", "3.0", "py3-none-any",
        {"bsi_plain_dep/__init__.py": b""},
    )  # fmt: skip
    return cpu, dep


def test_each_distribution_is_recorded_with_the_index_uv_took_it_from(tmp_path: Path) -> None:
    """Two loopback indexes, one behind credentials: each distribution names its own, without
    the credentials; the resolution cached for the next run keeps them."""
    cpu, dep = _wheels(tmp_path)
    with (
        serve_wheel(dep, "bsi-plain-dep") as main,
        serve_wheel(cpu, CPU, credentials="ci:tok-123") as extra,
    ):
        requirements = tmp_path / "requirements.txt"
        requirements.write_text(
            f"--index-url http://127.0.0.1:{main}/simple\n"
            f"--extra-index-url http://ci:tok-123@127.0.0.1:{extra}/simple/\n"
            f"{CPU}==1.0+cpu\n"
        )
        target = Target(reference_profile(), (AMD64,))
        cache = Cache(tmp_path / "cache")
        found = resolve(read_requirements([requirements]), target, AMD64, cache)
        again = resolve(read_requirements([requirements]), target, AMD64, cache)
    origins = {package.name: (package.version, package.index) for package in found.packages}
    assert origins == {
        CPU: ("1.0+cpu", f"http://127.0.0.1:{extra}/simple"),
        "bsi-plain-dep": ("3.0", f"http://127.0.0.1:{main}/simple"),
    }
    assert {p.name: (p.version, p.index) for p in again.packages} == origins


def test_one_index_is_every_distributions_origin(tmp_path: Path) -> None:
    """With a single index, uv is not asked: the index is the origin (credentials removed)."""
    _, dep = _wheels(tmp_path)
    with serve_wheel(dep, "bsi-plain-dep", credentials="ci:tok-9") as port:
        requirements = tmp_path / "requirements.txt"
        requirements.write_text(
            f"--index-url http://ci:tok-9@127.0.0.1:{port}/simple\nbsi-plain-dep\n"
        )
        target = Target(reference_profile(), (AMD64,))
        found = resolve(read_requirements([requirements]), target, AMD64, Cache(tmp_path / "c"))
    assert [(p.name, p.index) for p in found.packages] == [
        ("bsi-plain-dep", f"http://127.0.0.1:{port}/simple")
    ]


def test_the_check_for_newer_releases_reads_the_index_a_distribution_came_from() -> None:
    given = ("https://pypi.org/simple", "https://ci:tok@mirror.example/simple/")
    assert as_given("https://mirror.example/simple", given) == (given[1],)  # its credentials
    assert as_given("https://download.pytorch.org/whl/cpu", given) == (
        "https://download.pytorch.org/whl/cpu",
    )
    assert as_given("", given) == given
    assert is_default("https://pypi.org/simple/") and not is_default("https://pypi.example/simple")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:3141/simple", "http://localhost/simple", "http://[::1]:8080/simple"]
)
def test_plain_http_is_read_on_loopback(tmp_path: Path, url: str) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"--extra-index-url {url}\nsix\n")
    assert read_requirements([requirements]).extra_index_urls == (url,)


@pytest.mark.parametrize("option", ["--index-url", "-i", "--extra-index-url"])
def test_plain_http_elsewhere_is_refused_in_one_line_without_its_credentials(
    tmp_path: Path, option: str
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"six\n{option} http://ci:s3cret@mirror.example/simple\n")
    with pytest.raises(UserError) as refused:
        read_requirements([requirements])
    message = str(refused.value)
    assert message.startswith(f"{requirements}:2: {option} ")
    assert "plain http is not accepted" in message and "use https" in message
    assert "s3cret" not in message and "\n" not in message


def test_the_table_has_an_index_column_only_when_another_index_served(tmp_path: Path) -> None:
    cpu, dep = _wheels(tmp_path)
    arch = plan_for(tmp_path, [cpu, dep])
    from_pypi = replace(
        arch, wheels=tuple(replace(w, index="https://pypi.org/simple") for w in arch.wheels)
    )
    mirror = "https://mirror.example/simple"
    mixed = replace(
        arch,
        wheels=tuple(
            replace(w, index=mirror if w.name == CPU else "https://pypi.org/simple")
            for w in arch.wheels
        ),
    )

    def table(one: ArchPlan) -> list[list[str]]:
        plan = Plan(reference_profile(), "base:1", (one,), (), ())
        return [line.split() for line in summary(plan).splitlines() if line.startswith("  ")]

    assert "index" not in table(from_pypi)[0]
    header, *rows = table(mixed)
    assert header[:6] == ["distribution", "version", "wheel", "tag", "download", "installed"]
    assert header[6] == "index"
    by_name = {row[0]: row for row in rows}
    assert mirror in by_name[CPU] and "PyPI" in by_name["bsi-plain-dep"]
    # report.json's wheels carry it too
    report = Plan(reference_profile(), "base:1", (mixed,), (), ()).to_dict()
    wheels = report["architectures"]["amd64"]["wheels"]
    assert {w["name"]: w["index"] for w in wheels} == {
        CPU: mirror,
        "bsi-plain-dep": "https://pypi.org/simple",
    }


def test_the_sbom_names_another_index_in_the_purl_and_reads_it_back() -> None:
    """purl's `repository_url` qualifier, credentials removed; PyPI's need none."""

    def dist(name: str, version: str, index: str) -> PythonDistribution:
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        wheel = WheelOrigin(
            f"{name}-{version}-py3-none-any.whl", f"https://files.example/{name}.whl", "ab" * 32,
            index,
        )  # fmt: skip
        return distribution(metadata, "/app/deps-extra", {}, wheel=wheel)

    contents = ImageContents(
        repository="127.0.0.1:5000/sandbox",
        digest="sha256:" + "1" * 64,
        arch="amd64",
        base_reference="127.0.0.1:5000/runtime:1",
        base_digest="sha256:" + "2" * 64,
        debian=(),
        base_debian=(),
        python=(
            dist(CPU, "1.0+cpu", "https://ci:s3cret@download.example/whl/cpu"),
            dist("filelock", "3.20.0", ""),  # PyPI's: named by no qualifier (wheel_origin)
        ),
        created=timestamp(1_700_000_000),
        tool_version="0.1.0",
    )
    document = sbom_document(contents)
    assert b"s3cret" not in document
    purls = {c["name"]: c["purl"] for c in json.loads(document)["components"] if "purl" in c}
    assert purls[CPU] == f"pkg:pypi/{CPU}@1.0%2Bcpu?repository_url=https://download.example/whl/cpu"
    assert purls["filelock"] == "pkg:pypi/filelock@3.20.0"
    assert ("pypi", CPU, "1.0+cpu") in {(i.kind, i.name, i.version) for i in listed(document)[1]}
    read = wheel_origins(document, "/app/deps-extra")  # as an image on this one reads its base
    assert read[CPU].index == "https://download.example/whl/cpu"
    assert read["filelock"].index == ""


def test_the_sbom_names_pypi_by_no_qualifier(tmp_path: Path) -> None:
    """purl's default repository is PyPI: its wheels carry no `repository_url`."""
    cpu, dep = _wheels(tmp_path)
    arch = plan_for(tmp_path, [cpu, dep])
    pypi, mirror = "https://pypi.org/simple/", "https://mirror.example/simple"
    assert wheel_origin(replace(arch.wheels[0], index=pypi)).index == ""
    assert wheel_origin(replace(arch.wheels[0], index=mirror)).index == mirror
