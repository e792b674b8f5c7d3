"""Adversarial pass over issue 23's defences: what the sandbox's own code, as the server's uid,
can still do to its control plane.

The server and its commands share a uid, so a command may signal the server. A stop signal
(SIGTERM, SIGINT) from one of the server's own descendants is ignored; from anyone else (the
container runtime, the operator) it still stops the server.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from sandboxserver import ServerProcess


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "workspace").mkdir()
    return tmp_path / "workspace"


@pytest.mark.parametrize("name", ["TERM", "INT"])
def test_a_command_cannot_stop_its_server_with_a_signal(base: Path, name: str) -> None:
    server = ServerProcess(base)
    try:
        # the command itself, and an orphan of it (re-parented to the server), each signal it
        script = f"kill -{name} $PPID; (sleep 0.2; kill -{name} {server.proc.pid}) &"
        status, _, body = server.request(
            "POST", "/execute", json.dumps({"command": ["sh", "-c", script]}).encode()
        )
        assert status == 200 and json.loads(body)["exit_code"] == 0, body
        time.sleep(1.0)
        assert server.proc.poll() is None, "a command stopped the server"
        assert server.request("GET", "/")[:3:2] == (200, b'{"status": "ok"}')
        # commands do not inherit the server's blocked stop signals
        blocked = ["sh", "-c", "grep SigBlk /proc/self/status"]
        status, _, body = server.request(
            "POST", "/execute", json.dumps({"command": blocked}).encode()
        )
        assert status == 200 and json.loads(body)["stdout"] == "SigBlk:\t0000000000000000\n"
    finally:
        assert server.stop() == 0


def test_a_stop_signal_from_outside_still_stops_the_server(base: Path) -> None:
    server = ServerProcess(base)
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=10) == 0
    assert server.stop() == 0
