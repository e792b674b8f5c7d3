"""Verify's `sbom` check against the server process: the SBOM must list exactly what the
commands' environment holds (dist-infos on PYTHONPATH, dpkg's installed packages).

The server runs on this host, so the "image" is the host: its own dpkg status and a PYTHONPATH
of dist-info directories the test writes. The SBOM is built the way the build builds it, from
the same facts, then made to omit or invent one entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.sandboxserver import ServerProcess

from builder.attest.contents import debian_packages, distribution
from builder.attest.sbom import ImageContents, timestamp
from builder.attest.sbom_render import sbom_document
from builder.errors import UserError
from builder.verify import run
from builder.verify.client import Sandbox
from builder.verify.report import Check, Checked, VerifyReport
from builder.verify.sbom_check import sbom_check

TARGET = {"python_version": "3.13", "sys_platform": "linux", "platform_machine": "x86_64"}
DISTS = {"Alpha_Pkg": "1.0", "beta.pkg": "2.0.1"}


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    directory = tmp_path / "deps-extra"
    for name, version in DISTS.items():
        info = directory / f"{name.replace('.', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return directory


@pytest.fixture()
def sandbox(tmp_path: Path, site: Path) -> Iterator[Sandbox]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    process = ServerProcess(workspace, env={**os.environ, "PYTHONPATH": str(site)})
    try:
        yield Sandbox(process.port, workspace=str(workspace))
    finally:
        process.stop()


def _contents(site: Path) -> ImageContents:
    debian = debian_packages(Path("/var/lib/dpkg/status").read_text(errors="replace"))
    python = tuple(
        distribution((info / "METADATA").read_text(), str(site), TARGET)
        for info in sorted(site.glob("*.dist-info"))
    )
    return ImageContents(
        repository="127.0.0.1:5000/bsi-test/sbom",
        digest="sha256:" + "4" * 64,
        arch="amd64",
        base_reference="127.0.0.1:5000/bsi-test/base:1",
        base_digest="sha256:" + "5" * 64,
        debian=debian,
        base_debian=debian,
        python=python,
        created=timestamp(1_700_000_000),
        tool_version="test",
    )


def test_an_sbom_of_exactly_what_is_installed_passes(sandbox: Sandbox, site: Path) -> None:
    check = sbom_check(sandbox, sbom_document(_contents(site)))
    assert check.passed, check.detail
    assert "exactly the 2 Python distributions" in check.detail


def test_an_sbom_omitting_an_installed_distribution_fails(sandbox: Sandbox, site: Path) -> None:
    contents = _contents(site)
    omitting = replace(contents, python=contents.python[:1])
    check = sbom_check(sandbox, sbom_document(omitting))
    assert not check.passed
    assert "1 installed but not in the SBOM (pypi:beta-pkg==2.0.1)" in check.detail


def test_an_sbom_listing_what_is_not_installed_fails(sandbox: Sandbox, site: Path) -> None:
    contents = _contents(site)
    inventing = replace(
        contents,
        python=(*contents.python, distribution("Name: gamma\nVersion: 3\n", "/x", TARGET)),
        debian=contents.debian[1:],
    )
    check = sbom_check(sandbox, sbom_document(inventing))
    assert not check.passed
    assert "1 installed but not in the SBOM (deb:" in check.detail
    assert "1 in the SBOM but not installed (pypi:gamma==3)" in check.detail


def test_no_sbom_is_said_and_not_failed(sandbox: Sandbox) -> None:
    check = sbom_check(sandbox, None)
    assert check.passed and "no SBOM" in check.detail


def test_a_callable_sbom_is_called_for_only_at_its_line(
    sandbox: Sandbox, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery reads the SBOM's facts while the served checks run: `_check_running` calls
    for the document after them, and the line compares what it got."""
    said: list[str] = []

    def served(*args: object, **kwargs: object) -> Checked:
        said.append("served")
        return Checked([Check("import", True, "")])

    def document() -> bytes:
        said.append("sbom asked for")
        return sbom_document(_contents(site))

    monkeypatch.setattr(run, "served_checks", served)
    report = VerifyReport("image")
    running: Any = SimpleNamespace(sandbox=sandbox, still_serving=lambda: "serving")
    run._check_running(report, running, (), (), run.Installed(), False, False, document)
    assert said == ["served", "sbom asked for"]
    assert [(c.name, c.passed) for c in report.checks] == [
        ("import", True),
        ("sbom", True),
        ("still-serving", True),
    ]


def test_an_error_reading_a_callable_sbom_ends_the_verification(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The facts' own error (no dpkg status, an invalid SBOM) is raised, not made a line."""

    def unreadable() -> bytes:
        raise UserError("image: no /var/lib/dpkg/status")

    monkeypatch.setattr(run, "served_checks", lambda *args, **kwargs: Checked([]))
    running: Any = SimpleNamespace(sandbox=None, still_serving=lambda: "serving")
    report = VerifyReport("image")
    with pytest.raises(UserError, match="no /var/lib/dpkg/status"):
        run._check_running(report, running, (), (), run.Installed(), False, False, unreadable)
    assert report.checks == []


def test_work_beside_the_verification_ends_before_the_timed_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SBOM's reading (a container copying out every METADATA) runs beside the served
    checks but is awaited before race, flood and starve, whose timings it would skew."""
    ran: list[str] = []

    def recorded(sandbox: object, group: list[tuple[str, object]]) -> list[Check]:
        ran.extend(name for name, _ in group)
        return [Check(name, True, "") for name, _ in group]

    monkeypatch.setattr(run, "contract_run", recorded)
    monkeypatch.setattr(run, "wanted_imports", lambda *args: Checked([]))
    beside = run.Beside(quiet=lambda: ran.append("quiet"))
    run.served_checks(None, (), (), (), False, beside=beside)  # type: ignore[arg-type]
    timed = [ran.index(name) for name in ("race", "flood", "starve")]
    assert ran.count("quiet") == 1 and ran.index("quiet") < min(timed)
    others = [name for name in ran if name not in ("quiet", *run.LAST)]
    assert others and all(ran.index(name) < ran.index("quiet") for name in others)
