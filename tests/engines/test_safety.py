"""Per-arch engines that would leak or hang, refused or closed without an engine: cleartext tcp://
to another host, a sandbox port published on a routable address without the operator's word,
a host that does not resolve, an ssh host that would prompt, an ssh forward that fails, named
engines a run cannot use, and the clients connect() opens."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from builder.engines import connection as engine_module
from builder.engines.connection import EngineURL, ssh_forward
from builder.engines.per_arch import connect, publish_address, unheeded
from builder.errors import UserError


def certs(directory: Path) -> Path:
    directory.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (directory / name).write_text(name)
    return directory


class Client:
    """Answers info() with its arch and records whether it was closed."""

    def __init__(self, machine: str = "x86_64") -> None:
        self.machine, self.closed = machine, False
        self.api = SimpleNamespace(timeout=0)

    def info(self) -> dict[str, str]:
        return {"Architecture": self.machine}

    def close(self) -> None:
        self.closed = True


def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr: str) -> Path:
    """An `ssh` first on PATH that records its arguments, says `stderr` and exits 255."""
    seen = tmp_path / "ssh-args"
    ssh = tmp_path / "bin" / "ssh"
    ssh.parent.mkdir()
    ssh.write_text(f'#!/bin/sh\necho "$@" > {seen}\necho "{stderr}" >&2\nexit 255\n')
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{ssh.parent}:/usr/bin:/bin")
    return seen


def test_a_query_names_certs_and_publish_and_round_trips(tmp_path: Path) -> None:
    certs(tmp_path / "c")
    url = EngineURL.parse("tcp://10.0.0.7:2376?certs=c&publish=10.0.0.7", "e", tmp_path)
    assert (url.url, url.certs, url.publish) == ("tcp://10.0.0.7:2376", tmp_path / "c", "10.0.0.7")
    assert str(url) == f"tcp://10.0.0.7:2376?certs={tmp_path / 'c'}&publish=10.0.0.7"
    assert url.environment()["DOCKER_HOST"] == "tcp://10.0.0.7:2376"  # the CLI gets no query
    with pytest.raises(UserError, match="only tcp:// takes a query"):
        EngineURL.parse("tcp://10.0.0.7:2376?publish=", "e", tmp_path)


def test_cleartext_tcp_to_another_host_is_refused_before_connecting() -> None:
    url = EngineURL.parse("tcp://10.0.0.7:2375", "--engine arm64")
    with pytest.raises(UserError) as raised:
        connect({"arm64": url}, Client())  # type: ignore[arg-type]
    message = str(raised.value)
    assert message.startswith("engine for arm64 at tcp://10.0.0.7:2375: ")
    assert "cleartext" in message and "?certs=DIR" in message and "ssh://" in message
    assert "\n" not in message


def test_tls_to_another_host_needs_publish_to_expose_the_sandbox(tmp_path: Path) -> None:
    certs(tmp_path / "c")
    url = EngineURL.parse("tcp://10.0.0.7:2376?certs=c", "--engine arm64", tmp_path)
    with pytest.raises(UserError) as raised:
        publish_address("arm64", url)
    message = str(raised.value)
    assert message.startswith(f"engine for arm64 at {url}: ") and "\n" not in message
    assert "use ssh://" in message and "publish=ADDRESS" in message
    opted = EngineURL.parse("tcp://10.0.0.7:2376?certs=c&publish=10.0.0.9", "e", tmp_path)
    assert publish_address("arm64", opted) == "10.0.0.9"


def test_loopback_tcp_without_tls_and_the_other_schemes_publish_on_loopback() -> None:
    assert publish_address("arm64", EngineURL.parse("tcp://127.0.0.1:2375", "e")) == "127.0.0.1"
    assert publish_address("arm64", EngineURL.parse("tcp://localhost:2375", "e")) == "127.0.0.1"
    assert publish_address("arm64", EngineURL.parse("ssh://10.0.0.7", "e")) == "127.0.0.1"
    assert publish_address("arm64", EngineURL.parse("unix:///x.sock", "e")) == "127.0.0.1"


def test_a_host_that_does_not_resolve_is_one_line_resolved_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def unknown(host: str) -> str:
        asked.append(host)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "gethostbyname", unknown)
    url = EngineURL.parse("tcp://bsi-h6-nowhere:2375", "--engine arm64")
    with pytest.raises(UserError) as raised:
        connect({"arm64": url}, Client())  # type: ignore[arg-type]
    assert str(raised.value) == (
        "engine for arm64 at tcp://bsi-h6-nowhere:2375: cannot resolve bsi-h6-nowhere:"
        " [Errno -2] Name or service not known"
    )
    assert asked == ["bsi-h6-nowhere"]


def test_an_ssh_host_that_would_prompt_fails_at_once_with_ssh_s_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = fake_ssh(tmp_path, monkeypatch, "Host key verification failed.")
    url = EngineURL.parse("ssh://builder@arm64-host:2222", "--engine arm64")
    with pytest.raises(UserError) as raised:
        connect({"arm64": url}, Client())  # type: ignore[arg-type]
    assert str(raised.value) == (
        "engine for arm64 at ssh://builder@arm64-host:2222 not reachable:"
        " ssh: Host key verification failed."
    )
    args = seen.read_text().split()
    assert args[:2] == ["-o", "BatchMode=yes"] and args[-4:] == [
        "2222",
        "--",
        "builder@arm64-host",
        "true",
    ]


def test_a_failed_ssh_forward_says_ssh_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_ssh(tmp_path, monkeypatch, "bind: Address already in use")
    with pytest.raises(UserError) as raised, ssh_forward("ssh://arm64-host", 4242):
        pass
    assert str(raised.value) == (
        "ssh forward to ssh://arm64-host port 4242 failed: bind: Address already in use"
    )


def test_named_engines_a_run_cannot_use_are_said_or_refused() -> None:
    urls = {"arm64": EngineURL.parse("ssh://arm64-host", "e")}
    assert unheeded(urls, no_build=True, local_answers=False) == (
        "--engine/[engines] ignored (arm64=ssh://arm64-host): --no-build builds nothing"
    )
    with pytest.raises(UserError, match=r"^engines named \(arm64=ssh://arm64-host\) but no local"):
        unheeded(urls, no_build=False, local_answers=False)
    assert unheeded(urls, no_build=False, local_answers=True) is None
    assert unheeded({}, no_build=True, local_answers=False) is None


def test_the_named_clients_are_closed_and_those_that_answered_when_another_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: dict[str, Client] = {}

    def client(url: EngineURL, timeout: float) -> Client:
        if "broken" in url.url:
            raise OSError("connection refused")
        opened[url.url] = Client("aarch64")
        return opened[url.url]

    monkeypatch.setattr(engine_module.EngineURL, "client", client)
    local = Client()
    good = {"arm64": EngineURL.parse("unix:///run/arm.sock", "e")}
    with connect(good, local) as engines:  # type: ignore[arg-type]
        assert engines.for_arch("arm64").native == "arm64"
        assert not opened["unix:///run/arm.sock"].closed
    assert opened["unix:///run/arm.sock"].closed and not local.closed  # the local one is ours
    broken = {"arm64": good["arm64"], "amd64": EngineURL.parse("unix:///run/broken.sock", "e")}
    with pytest.raises(UserError, match=r"^engine for amd64 at unix:///run/broken.sock not reach"):
        connect(broken, local)  # type: ignore[arg-type]
    assert opened["unix:///run/arm.sock"].closed


def test_engines_named_without_a_local_engine_are_refused_by_the_cli(tmp_path: Path) -> None:
    """The local engine probes the base: without it nothing would be built on the named one,
    so the run stops with one line instead of writing a context and ignoring --engine."""
    (tmp_path / "requirements.txt").write_text("six\n")
    args = ["-r", str(tmp_path / "requirements.txt"), "--output", str(tmp_path / "context")]
    args += ["--cache-dir", str(tmp_path / "cache"), "--engine", "arm64=ssh://arm64-host"]
    result = subprocess.run(
        [sys.executable, "-m", "builder", *args],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}"},
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: engines named (arm64=ssh://arm64-host) but no local Docker engine answers: it"
        " probes the base before anything is built there (start it, or plan only with --no-build)"
    ]
    assert not (tmp_path / "context").exists()
