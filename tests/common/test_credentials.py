"""Where registry credentials come from, in Docker's order, with helpers run for real."""

from __future__ import annotations

import base64

import pytest
from support.credhelp import install_helper, write_docker_config
from support.registryhelp import forget_credentials

from builder.credentials import HUB_SERVER, Credentials, engine_auth, engine_config, lookup
from builder.errors import UserError


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    forget_credentials(monkeypatch, tmp_path / "home")


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_nothing_anywhere_is_anonymous(tmp_path):
    assert lookup("reg.example") is None
    assert engine_auth("reg.example") is None


def test_environment_comes_first(monkeypatch, tmp_path):
    write_docker_config(
        tmp_path / "cfg", {"auths": {"reg.example": {"auth": _basic("file", "pw")}}}, monkeypatch
    )
    monkeypatch.setenv("REGISTRY_USERNAME", "ci")
    monkeypatch.setenv("REGISTRY_PASSWORD", "s3cret")
    assert lookup("reg.example") == Credentials("ci", "s3cret", "REGISTRY_USERNAME")
    monkeypatch.setenv("BSI_REGISTRY_USER", "bsi")
    with pytest.raises(UserError, match="BSI_REGISTRY_PASSWORD is not set"):
        lookup("reg.example")
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", "pw")
    assert engine_auth("reg.example") == {
        "username": "bsi",
        "password": "pw",
        "serveraddress": "reg.example",
    }


def test_default_config_location_is_home(tmp_path):
    config = tmp_path / "home" / ".docker"
    config.mkdir(parents=True)
    (config / "config.json").write_text(
        '{"auths": {"https://reg.example/v2/": {"username": "u", "password": "p"}}}'
    )
    found = lookup("reg.example")
    assert (found.username, found.secret) == ("u", "p")
    assert lookup("other.example") is None


def test_cred_helper_beats_store_beats_auths(monkeypatch, tmp_path):
    helper_log = install_helper(
        tmp_path / "bin", "bsiper", {"reg.example": ("per", "pw1")}, monkeypatch
    )
    store_log = install_helper(
        tmp_path / "bin",
        "bsistore",
        {"reg.example": ("store", "pw2"), "store.example": ("store", "pw3")},
        monkeypatch,
    )
    write_docker_config(
        tmp_path / "cfg",
        {
            "credHelpers": {"reg.example": "bsiper", "miss.example": "bsiper"},
            "credsStore": "bsistore",
            "auths": {
                "reg.example": {"auth": _basic("inline", "pw4")},
                "miss.example": {"auth": _basic("inline", "pw5")},
            },
        },
        monkeypatch,
    )
    found = lookup("reg.example")
    assert (found.username, found.secret, found.source) == (
        "per",
        "pw1",
        "docker-credential-bsiper",
    )
    assert lookup("store.example").username == "store"  # no per-registry helper: the store
    # The registry's helper and the store know nothing of it: the inline entry is last.
    assert (lookup("miss.example").username, lookup("miss.example").secret) == ("inline", "pw5")
    assert helper_log.read_text().splitlines() == ["reg.example", "miss.example", "miss.example"]
    assert "reg.example" not in store_log.read_text().splitlines()


def test_docker_hub_is_asked_for_by_its_index_url(monkeypatch, tmp_path):
    log = install_helper(tmp_path / "bin", "bsihub", {HUB_SERVER: ("hubuser", "tok")}, monkeypatch)
    write_docker_config(tmp_path / "cfg", {"credsStore": "bsihub"}, monkeypatch)
    assert lookup("docker.io").username == "hubuser"
    assert log.read_text().splitlines() == [HUB_SERVER]
    assert engine_auth("docker.io")["serveraddress"] == HUB_SERVER


def test_identity_tokens(monkeypatch, tmp_path):
    install_helper(tmp_path / "bin", "bsitok", {"tok.example": ("<token>", "refresh")}, monkeypatch)
    write_docker_config(
        tmp_path / "cfg",
        {
            "credHelpers": {"tok.example": "bsitok"},
            "auths": {"https://index.docker.io/v1/": {"identitytoken": "hub-refresh"}},
        },
        monkeypatch,
    )
    helper = lookup("tok.example")
    assert helper.identity_token and helper.secret == "refresh"
    assert engine_config(helper, "tok.example") == {
        "identitytoken": "refresh",
        "serveraddress": "tok.example",
    }
    hub = lookup("docker.io")
    assert hub.identity_token and hub.secret == "hub-refresh"


def test_missing_helper_program_means_none(monkeypatch, tmp_path):
    write_docker_config(tmp_path / "cfg", {"credsStore": "bsi-not-installed"}, monkeypatch)
    assert lookup("reg.example") is None


def test_broken_config_names_the_file(monkeypatch, tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{not json")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "cfg"))
    with pytest.raises(UserError, match=r"cfg/config.json: unreadable"):
        lookup("reg.example")
