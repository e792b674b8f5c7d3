"""BuildKit pulls the base itself: the environment's login goes with it only to its registry."""

from __future__ import annotations

import pytest

from builder.assemble.build import base_logins
from builder.oci.name import ImageRef

LOCAL = "127.0.0.1:5000"


@pytest.fixture(autouse=True)
def login(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BSI_REGISTRY", "REGISTRY_USERNAME", "REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BSI_REGISTRY_USER", "bsi")
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", "secret")


def logins_for(reference: str) -> dict[str, tuple[str, str]] | None:
    found = base_logins(ImageRef.parse(reference, "base image"))
    return {r: (c.username, c.secret) for r, c in found.items()} if found is not None else None


def test_a_scoped_login_is_not_sent_to_the_base_on_another_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BSI_REGISTRY", LOCAL)
    assert logins_for("registry.example.com/platform/runtime:1") is None
    assert logins_for(f"{LOCAL}/platform/runtime:1") == {LOCAL: ("bsi", "secret")}


def test_unscoped_it_goes_to_any_registry_but_docker_hub() -> None:
    assert logins_for("python:3.13-slim") is None
    assert logins_for(f"{LOCAL}/runtime:1") == {LOCAL: ("bsi", "secret")}


def test_scoped_to_docker_hub_it_goes_to_a_hub_base(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BSI_REGISTRY", "index.docker.io")
    assert logins_for("python:3.13-slim") == {"docker.io": ("bsi", "secret")}
    assert logins_for(f"{LOCAL}/runtime:1") is None
