"""A rebase's apt step carries the browsers' wiring (builder.plan.browsers): the arch's links and
drop-in are made in the same one-step build, never taken from an apt layer started ahead of
the plan (which has none)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from support.plans import reference_profile

from builder.orchestration import produce_rebase
from builder.orchestration.produce_rebase import RebaseProducer
from builder.plan.browsers import BrowserLink, BrowserWiring
from builder.plan.plan import ArchPlan, Plan

WIRED = BrowserWiring((BrowserLink("/opt/ms-playwright/x-1/chrome", "/usr/bin/chromium"),), True)


class Ahead:
    """An apt layer started ahead for the same packages, without wiring."""

    def get(self, arch: str, packages: Any) -> str:
        return f"ahead:{arch}"


def producer(wiring: BrowserWiring) -> Any:
    arch = ArchPlan("amd64", (), (), ("chromium-driver",), (), (), browsers=wiring)
    plan = Plan(reference_profile(), "python-runtime:1", (arch,), (), ())
    run = SimpleNamespace(
        reporter=SimpleNamespace(say=lambda text: None),
        engines=SimpleNamespace(for_arch=lambda arch: f"engine:{arch}"),
    )
    return SimpleNamespace(plan=plan, ahead=Ahead(), run=run, apt_secrets=None)


def test_an_arch_with_browsers_builds_its_apt_layer_with_the_wiring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[tuple] = []
    monkeypatch.setattr(produce_rebase, "build_apt_image", lambda *args: built.append(args))
    RebaseProducer._apt(producer(WIRED), "amd64")
    ((base, packages, arch, engine, secrets, after),) = built
    assert base == "python-runtime:1" and secrets is None
    assert (packages, arch, engine) == (("chromium-driver",), "amd64", "engine:amd64")
    assert after == WIRED.commands() and "ln -s /usr/bin/chromium" in after


def test_an_arch_without_browsers_takes_the_layer_started_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(produce_rebase, "build_apt_image", lambda *args: pytest.fail("built"))
    assert RebaseProducer._apt(producer(BrowserWiring()), "amd64") == "ahead:amd64"
