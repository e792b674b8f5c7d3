"""Per-arch engines without an engine: the URL forms, the flags and [engines], which engine
an arch gets, what the docker CLI is pointed at, and the one-line errors."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builder.assemble.build import BuildSpec, build_image
from builder.config import load_config, with_flags
from builder.engines import per_arch as engines_module
from builder.engines.connection import Engine, EngineURL
from builder.engines.per_arch import Engines, connect, engine_flags
from builder.errors import UserError

CONFIG = """\
requirements = ["requirements.txt"]
base-repository = "registry.example.com/sandbox/runtime"
platform-version = "1.0"
architectures = ["amd64", "arm64"]
"""


def fake_client(machine: str) -> Any:
    return SimpleNamespace(info=lambda: {"Architecture": machine})


def certs(directory: Path) -> Path:
    directory.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (directory / name).write_text(name)
    return directory


@pytest.mark.parametrize(
    "text",
    [
        "unix:///run/bsi-engine2/docker.sock",
        "tcp://10.0.0.7:2375",
        "tcp://arm64-builder.example.com:2376",
        "ssh://builder@arm64-host",
        "ssh://arm64-host:2222",
    ],
)
def test_docker_host_forms_are_taken_as_they_are(text: str) -> None:
    url = EngineURL.parse(text, "--engine arm64")
    assert (url.url, url.certs, str(url)) == (text, None, text)
    assert url.environment() == {"DOCKER_HOST": text}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("http://host:2375", "is not a unix://, tcp:// or ssh:// URL"),
        ("/var/run/docker.sock", "is not a unix://, tcp:// or ssh:// URL"),
        ("unix://relative.sock", "must be unix:///PATH"),
        ("unix://", "must be unix:///PATH"),
        ("tcp://host", "names no port"),
        ("tcp://host:http", "has no valid port"),
        ("tcp://:2375", "must be tcp://HOST[:PORT]"),
        ("ssh://host/path", "must be ssh://HOST[:PORT]"),
        ("ssh://host?certs=x", "only tcp:// takes a query"),
        ("tcp://host:2376?tls=1", "only tcp:// takes a query"),
    ],
)
def test_a_malformed_url_is_one_line_naming_it(text: str, fragment: str) -> None:
    with pytest.raises(UserError) as raised:
        EngineURL.parse(text, "--engine arm64")
    message = str(raised.value)
    assert message.startswith("--engine arm64: ") and repr(text) in message and fragment in message
    assert "\n" not in message


def test_tls_certificates_come_from_a_directory_as_docker_cert_path(tmp_path: Path) -> None:
    directory = certs(tmp_path / "arm64")
    url = EngineURL.parse("tcp://10.0.0.7:2376?certs=arm64", "where", tmp_path)
    assert url.url == "tcp://10.0.0.7:2376" and url.certs == directory
    assert url.environment() == {
        "DOCKER_HOST": "tcp://10.0.0.7:2376",
        "DOCKER_TLS_VERIFY": "1",
        "DOCKER_CERT_PATH": str(directory),
    }
    tls = url.tls()
    assert tls is not None
    assert tls.cert == (str(directory / "cert.pem"), str(directory / "key.pem"))
    assert (tls.ca_cert, tls.verify) == (str(directory / "ca.pem"), True)
    assert str(url) == f"tcp://10.0.0.7:2376?certs={directory}"


def test_a_certs_directory_lacking_a_file_is_named(tmp_path: Path) -> None:
    directory = certs(tmp_path / "c")
    (directory / "key.pem").unlink()
    with pytest.raises(UserError, match=r"c lacks key\.pem for 'tcp://h:2376\?certs=c'"):
        EngineURL.parse("tcp://h:2376?certs=c", "--engine arm64", tmp_path)


def test_flags_refuse_an_unknown_arch_a_missing_url_and_an_arch_twice() -> None:
    with pytest.raises(UserError, match=r"^--engine: unknown arch 'riscv64' \(choose from "):
        engine_flags(["riscv64=unix:///x.sock"])
    with pytest.raises(UserError, match=r"^--engine: 'unix:///x.sock' is not ARCH=URL$"):
        engine_flags(["unix:///x.sock"])
    with pytest.raises(
        UserError, match=r"^--engine: arm64 given twice \(unix:///a.sock and ssh://b\)$"
    ):
        engine_flags(["arm64=unix:///a.sock", "arm64=ssh://b"])
    found = engine_flags(["arm64=ssh://b", "amd64=unix:///a.sock"])
    assert {arch: url.url for arch, url in found.items()} == {
        "arm64": "ssh://b",
        "amd64": "unix:///a.sock",
    }


def test_the_config_names_engines_and_a_flag_wins_for_its_arch(tmp_path: Path) -> None:
    certs(tmp_path / "arm64-certs")
    path = tmp_path / "bsi.toml"
    path.write_text(
        CONFIG + '[engines]\narm64 = "tcp://arm.example.com:2376?certs=arm64-certs"\n'
        'amd64 = "unix:///run/amd.sock"\n'
    )
    config = load_config(path)
    assert config.engines["arm64"].certs == tmp_path / "arm64-certs"  # relative to the config
    assert config.engines["amd64"].url == "unix:///run/amd.sock"
    flagged = with_flags(config, engine_flags(["arm64=ssh://arm"]), None)
    assert {arch: url.url for arch, url in flagged.engines.items()} == {
        "arm64": "ssh://arm",
        "amd64": "unix:///run/amd.sock",
    }
    assert with_flags(config, {}, None) is config


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[engines]\nsparc = "unix:///x.sock"\n', "[engines]: unknown arch 'sparc'"),
        ('[engines]\narm64 = "ftp://x"\n', "[engines] arm64: 'ftp://x' is not a unix://"),
        ("[engines]\narm64 = 3\n", "[engines] must map arches to engine URLs"),
        ('engines = "unix:///x.sock"\n', "[engines] must map arches to engine URLs"),
    ],
)
def test_a_bad_engines_table_is_one_line_naming_the_config(
    tmp_path: Path, table: str, message: str
) -> None:
    path = tmp_path / "bsi.toml"
    path.write_text(CONFIG + table)
    with pytest.raises(UserError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: ") and message in str(raised.value)


def test_an_arch_not_named_runs_on_the_local_engine() -> None:
    local, arm = fake_client("x86_64"), fake_client("aarch64")
    engines = Engines(Engine.local(local), {"arm64": Engine(arm, "arm64", EngineURL("ssh://arm"))})
    assert engines.for_arch("arm64").client is arm
    assert engines.for_arch("amd64").client is local
    assert Engines.local(local).for_arch("arm64").client is local
    assert engines.for_arch("amd64").environment == {}  # the CLI keeps the user's DOCKER_HOST


def test_the_bytecode_compiles_on_an_engine_native_to_a_target_arch() -> None:
    local, arm = fake_client("x86_64"), fake_client("aarch64")
    named = {"arm64": Engine(arm, "arm64", EngineURL("unix:///run/arm.sock"))}
    engines = Engines(Engine.local(local), named)
    assert engines.compiling_client(["amd64", "arm64"]) is local  # the local engine first
    assert engines.compiling_client(["arm64"]) is arm  # only arm64 built: its own engine runs it
    emulating = Engines(Engine.local(local), {"arm64": Engine(arm, "amd64", named["arm64"].url)})
    assert emulating.compiling_client(["arm64"]) is local  # none native: the local one


@pytest.mark.parametrize("url", ["ssh://arm", "tcp://127.0.0.1:2376"])
def test_the_bytecode_never_compiles_over_ssh_or_tcp(url: str) -> None:
    """The compile half-closes its exec socket (SHUT_WR): only a unix socket takes that."""
    local, arm = fake_client("x86_64"), fake_client("aarch64")
    engines = Engines(Engine.local(local), {"arm64": Engine(arm, "arm64", EngineURL(url))})
    assert engines.compiling_client(["arm64"]) is local


def test_an_engine_that_never_answers_fails_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port that accepts and never answers: the deadline, not the socket, ends the wait."""
    monkeypatch.setattr(engines_module, "CONNECT_DEADLINE", 1.0)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        port = listening.getsockname()[1]
        url = EngineURL.parse(f"tcp://127.0.0.1:{port}", "--engine arm64")
        with pytest.raises(UserError) as raised:
            connect({"arm64": url}, fake_client("x86_64"))
    assert str(raised.value).startswith(f"engine for arm64 at tcp://127.0.0.1:{port} not reachable")


def test_the_docker_cli_builds_on_the_arch_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build_image points the CLI at the arch's engine, TLS settings included, and drops the
    local engine's settings it would otherwise inherit."""
    seen = tmp_path / "seen"
    cli = tmp_path / "docker"
    cli.write_text(
        "#!/bin/sh\n"
        f'env | grep "^DOCKER_" | sort > {seen}\n'
        'while [ "$1" != "--iidfile" ]; do shift; done\n'
        'echo sha256:feed > "$2"\n'
    )
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("BSI_DOCKER", str(cli))
    monkeypatch.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
    monkeypatch.setenv("DOCKER_CONTEXT", "local")
    certs(tmp_path / "c")
    url = EngineURL.parse("tcp://10.0.0.7:2376?certs=c", "e", tmp_path)
    engine = Engine(fake_client("aarch64"), "arm64", url)
    context = tmp_path / "context"
    context.mkdir()
    with open(os.devnull, "w") as log:
        assert build_image(context, BuildSpec(engine=engine), log) == "sha256:feed"
    assert seen.read_text().splitlines() == [
        "DOCKER_BUILDKIT=1",
        f"DOCKER_CERT_PATH={tmp_path / 'c'}",
        "DOCKER_HOST=tcp://10.0.0.7:2376",
        "DOCKER_TLS_VERIFY=1",
    ]
    with open(os.devnull, "w") as log:
        assert build_image(context, BuildSpec(), log) == "sha256:feed"
    assert "DOCKER_HOST=unix:///var/run/docker.sock" in seen.read_text()  # local: as it was
