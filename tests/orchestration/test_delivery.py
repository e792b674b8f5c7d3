"""What a build's verification asks of each arch's image beyond the named imports, and how
a delivery reads each image's SBOM facts beside verifying it (with fakes of both)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.plans import StandInProducer, plan_for, run_settings
from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.orchestration import delivery
from builder.orchestration.delivery import installed_on
from builder.publish import attachments
from builder.reporter import QUIET
from builder.verify import run as verify_run
from builder.verify.deep.imports import DeepOptions
from builder.verify.report import Check, VerifyReport


def test_each_arch_deep_imports_what_was_asked_for_that_it_installs(tmp_path: Path) -> None:
    """pkg-b is asked for but installed on another arch only; dep is installed, not asked for."""
    files = {"pkg-a": {"pkg_a/x.py": b""}, "dep": {"dep/x.py": b""}}
    wheels = [make_wheel(tmp_path / "w", n, "1.0", "py3-none-any", f) for n, f in files.items()]
    installed = installed_on(plan_for(tmp_path, wheels), ("pkg-a", "pkg-b"), ("pkg_a.x",))
    assert list(installed.distributions) == ["pkg-a"]
    assert installed.deep == DeepOptions(skip=("pkg_a.x",))
    assert list(installed.programs) == []


@dataclass
class _Facts:
    """What the SBOM's reading and the verification did, in order, with fakes of both."""

    said: list[str] = field(default_factory=list)
    verifying: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None  # the reading raises it
    reaches_sbom: bool = True  # the verification gets to the `sbom` line

    def attestable(self, *args: object) -> Any:
        assert self.verifying.wait(10), "the SBOM's facts were read before verifying began"
        time.sleep(0.05)
        self.said.append("facts read")
        if self.error is not None:
            raise self.error
        return SimpleNamespace(sbom=lambda: self.said.append("sbom rendered") or b"sbom")

    def verify_image(self, name: str, **kwargs: Any) -> VerifyReport:
        self.verifying.set()
        self.said.append("verifying")
        report = VerifyReport(name, [Check("health", True, "")])
        if self.reaches_sbom:
            document = kwargs["sbom"]()
            report.checks.append(Check("sbom", document == b"sbom", ""))
        return report


def _deliver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, facts: _Facts) -> delivery.Outcome:
    monkeypatch.setattr(attachments, "plan_facts", lambda *args: "request")
    monkeypatch.setattr(attachments, "attestable", facts.attestable)
    monkeypatch.setattr(verify_run, "verify_image", facts.verify_image)
    arch = SimpleNamespace(arch="amd64", wheels=(), installed_programs=tuple)
    plan: Any = SimpleNamespace(arches=(arch,), import_modules=(), runtime_checks=(), requested=())
    client: Any = SimpleNamespace(info=lambda: {"Architecture": "x86_64"})
    (tmp_path / "report.json").write_text("{}")
    run = delivery.Run(Engines.local(client), Cache(tmp_path / "cache"), QUIET)
    asked = delivery.Delivery(run_settings(verify=True, output=tmp_path))
    return delivery.deliver(StandInProducer(), plan, asked, run)


def test_the_sbom_facts_are_read_beside_the_verification_and_awaited_at_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = _Facts()
    outcome = _deliver(tmp_path, monkeypatch, facts)
    assert facts.said == ["verifying", "facts read", "sbom rendered"]
    assert outcome.succeeded
    (one,) = outcome.produced
    assert one.attestable is not None
    assert list(one.seconds) == ["facts", "verify"]  # as report.json lists them
    assert one.seconds["facts"] >= 0.05 and one.seconds["verify"] >= 0.05  # it awaited them


@pytest.mark.parametrize("reaches_sbom", [True, False], ids=["at-the-sbom-line", "never-asked"])
def test_an_error_reading_the_sbom_facts_fails_the_delivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reaches_sbom: bool
) -> None:
    """Raised whether the verification asked for the SBOM or ended before its line."""
    facts = _Facts(error=UserError("image: no /var/lib/dpkg/status"), reaches_sbom=reaches_sbom)
    with pytest.raises(UserError, match="no /var/lib/dpkg/status"):
        _deliver(tmp_path, monkeypatch, facts)
    assert facts.said == ["verifying", "facts read"]


def test_a_verification_that_raises_waits_for_the_reading_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = _Facts()

    def broken(name: str, **kwargs: Any) -> VerifyReport:
        facts.verifying.set()
        raise UserError("engine gone")

    monkeypatch.setattr(facts, "verify_image", broken)
    with pytest.raises(UserError, match="engine gone"):
        _deliver(tmp_path, monkeypatch, facts)
    assert facts.said == ["facts read"]  # no reading left running once the delivery ended
