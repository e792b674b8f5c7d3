"""The platform's real client, the upstream agent-sandbox SDK, against our server and image.

Through the SDK's direct connection (`SandboxDirectConnectionConfig(api_url=...)`,
`CommandExecutor`, `Filesystem`), as the platform uses it in its legacy python-runtime mode:
commands, `python3 -c`, a timeout (`timed_out` true, exit 124), file round trips with spaces and
unicode in the names, list shapes, exists, and a file far larger than the server may hold in
memory. The SDK's own `delete` is sandboxd-only; DELETE is covered by our client's checks.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sandboxserver import start_server, stop_server

from builder.engines.connection import Engine
from builder.verify import sdk as sdk_group
from builder.verify.client import Sandbox
from builder.verify.container import hardened
from builder.verify.sdk import SdkClient, sdk_checks, sdk_client

MIB = 1024 * 1024
LARGE = 64 * MIB
SDK_LINES = ["sdk run", "sdk python3", "sdk timeout", "sdk write-read", "sdk list", "sdk exists"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, int]]:
    """Our client on the server process, and the server's own pid (for its memory)."""
    process = start_server(tmp_path_factory.mktemp("sdk") / "workspace")
    pid = int(Path(f"/proc/{process.proc.pid}/task/{process.proc.pid}/children").read_text())
    try:
        yield Sandbox(process.port, workspace=str(process.workspace)), pid
    finally:
        stop_server(process)


@pytest.fixture(scope="module")
def sdk(server: tuple[Sandbox, int]) -> Iterator[SdkClient]:
    client = sdk_client(f"http://127.0.0.1:{server[0].port}")
    yield client
    client.close()


def test_command_run(sdk: SdkClient) -> None:
    result = sdk.commands.run("echo hello from the sdk")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello from the sdk\n", "", 0)
    assert result.timed_out is False


def test_exit_code_and_stderr(sdk: SdkClient) -> None:
    result = sdk.commands.run("sh -c 'echo oops >&2; exit 3'")
    assert (result.stderr, result.exit_code, result.timed_out) == ("oops\n", 3, False)


def test_python3_c(sdk: SdkClient) -> None:
    result = sdk.commands.run('python3 -c "import sys; print(6 * 7, sys.argv[1:])" a "b c"')
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "42 ['a', 'b c']\n"


def test_the_legacy_mode_shell_string_is_not_run_by_a_shell(sdk: SdkClient) -> None:
    """The contract runs argv: `$HOME` and `|` arrive as words (README: use `sh -c '...'`)."""
    assert sdk.commands.run("echo $HOME | cat").stdout == "$HOME | cat\n"
    assert sdk.commands.run("sh -c 'echo piped | tr a-z A-Z'").stdout == "PIPED\n"


def test_timeout_sets_timed_out_and_exit_124(sdk: SdkClient) -> None:
    result = sdk.commands.run("sleep 600", command_timeout=1)
    assert result.exit_code == 124
    assert result.timed_out is True


def test_write_read_round_trip_with_spaces_and_unicode(sdk: SdkClient) -> None:
    path = "sdk round trip/déjà vu €/naïve name ü.bin"
    content = "ünïcödé\n".encode() + bytes(range(256)) * 40
    sdk.files.write(path, content)
    assert sdk.files.read(path) == content
    sdk.files.write(path, "replaced ✓")
    assert sdk.files.read(path) == "replaced ✓".encode()


def test_list_shapes(sdk: SdkClient, server: tuple[Sandbox, int]) -> None:
    sdk.files.write("sdk list/inner dir/a.txt", b"12345")
    sdk.files.write("sdk list/b é.txt", b"")
    entries = {entry.name: entry for entry in sdk.files.list("sdk list")}
    assert set(entries) == {"inner dir", "b é.txt"}
    assert entries["inner dir"].type == "directory"
    assert (entries["b é.txt"].type, entries["b é.txt"].size) == ("file", 0)
    [inner] = sdk.files.list("sdk list/inner dir")
    assert (inner.name, inner.type, inner.size) == ("a.txt", "file", 5)
    assert inner.modified.tzinfo is not None
    assert server[0].delete("sdk list").status in (200, 204)
    assert not sdk.files.exists("sdk list")


def test_exists_present_and_missing(sdk: SdkClient) -> None:
    sdk.files.write("sdk exists/here.txt", b"x")
    assert sdk.files.exists("sdk exists/here.txt") is True
    assert sdk.files.exists("sdk exists") is True
    assert sdk.files.exists("sdk exists/missing.txt") is False
    assert sdk.files.exists("no such dir/at all") is False


def peak_rss(pid: int) -> int:
    """The process's peak resident set size (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def test_large_file_round_trip_streams_through_the_server(
    sdk: SdkClient, server: tuple[Sandbox, int], tmp_path: Path
) -> None:
    """A 64 MiB file goes up and comes back while the server's peak memory stays far below it."""
    pid = server[1]
    before = peak_rss(pid)
    content = os.urandom(LARGE)
    sdk.files.write("large/big file.bin", content, timeout=300)
    back = tmp_path / "back.bin"
    with back.open("wb") as out:
        assert sdk.files.read_to("large/big file.bin", out, timeout=300) == LARGE
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(content).digest()
    assert sdk.files.read("large/big file.bin", timeout=300) == content
    after = peak_rss(pid)
    assert after < LARGE // 2, f"server peak RSS {after // MIB} MiB for a {LARGE // MIB} MiB file"
    assert after - before < 16 * MIB, f"peak RSS grew from {before // MIB} to {after // MIB} MiB"


def test_write_from_a_file_object(sdk: SdkClient, tmp_path: Path) -> None:
    source = tmp_path / "stream.bin"
    source.write_bytes(os.urandom(3 * MIB))
    with source.open("rb") as stream:
        sdk.files.write("streamed/file.bin", stream)
    assert sdk.files.read("streamed/file.bin") == source.read_bytes()


def test_the_verify_sdk_group_passes_against_the_server(server: tuple[Sandbox, int]) -> None:
    checks = sdk_checks(server[0])
    assert [check.name for check in checks] == SDK_LINES
    assert all(check.passed for check in checks), [c for c in checks if not c.passed]
    assert "timed_out true" in checks[2].detail
    assert not [e for e in os.listdir(server[0].workspace) if e.startswith("bsi-sdk-")]


def test_the_sdk_group_says_when_the_sdk_is_missing(
    server: tuple[Sandbox, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk_group, "sdk_installed", lambda: False)
    assert sdk_checks(server[0]) == []
    [check] = sdk_checks(server[0], required=True)
    assert (check.name, check.passed) == ("sdk", False)
    assert "pip install k8s-agent-sandbox" in check.detail


@pytest.mark.usefixtures("docker_client")
def test_sdk_round_trip_against_the_reference_image(
    reference_image: str, docker_client, tmp_path: Path
) -> None:
    """What `verify` shows for the SDK, against the reference image run hardened; a file
    object is streamed (a chunked body) into the image too."""
    source = tmp_path / "stream.bin"
    source.write_bytes(os.urandom(MIB))
    with hardened(Engine.local(docker_client), reference_image) as running:
        checks = sdk_checks(running.sandbox)
        client = sdk_client(f"http://127.0.0.1:{running.sandbox.port}")
        try:
            result = client.commands.run("id -u")
            client.files.write("ünï code/file name.txt", b"in the image")
            read = client.files.read("ünï code/file name.txt")
            with source.open("rb") as stream:
                client.files.write("streamed.bin", stream)
            streamed = client.files.read("streamed.bin")
        finally:
            client.close()
    assert streamed == source.read_bytes()
    assert [check.name for check in checks] == SDK_LINES
    assert all(check.passed for check in checks), [c for c in checks if not c.passed]
    assert result.stdout == "65532\n"
    assert read == b"in the image"
