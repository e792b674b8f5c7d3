"""A second Docker engine on this machine, for the scale-out tests: per-arch engines.

It runs beside the engine setup-env.sh starts, as a platform's second build host would: its own
data root, exec root, pid file and unix socket, and a bridge of its own (an address on a bridge
this module creates; no traffic goes to it: sandboxes are reached through ports published on
127.0.0.1). The data root is kept between runs (under /var/lib, like the first engine's), so a
second run does not pull the base again; the daemon is stopped by its pid and the bridge
removed when the tests end.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import docker
import docker.errors

from support.waiting import STARTS_SECONDS, wait_for

NAME = "bsi-engine2"
BRIDGE = "bsi-br2"
BRIDGE_ADDRESS = "172.30.99.1/24"
DATA_ROOT = Path("/var/lib") / NAME
EXEC_ROOT = Path("/run") / NAME
SOCKET = EXEC_ROOT / "docker.sock"
PIDFILE = EXEC_ROOT / "dockerd.pid"
CONTAINERD_PIDFILE = EXEC_ROOT / "containerd" / "containerd.pid"
LOG = DATA_ROOT.with_suffix(".log")
URL = f"unix://{SOCKET}"


class SecondEngine:
    """Start (or reuse) the second engine; `url` is how the tool is told to reach it."""

    url = URL

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SecondEngine:
        if self._answers():
            return self  # left running by an earlier session: reuse it, never stop it
        self._bridge()
        DATA_ROOT.mkdir(parents=True, exist_ok=True)
        EXEC_ROOT.mkdir(parents=True, exist_ok=True)
        for pidfile, name in ((PIDFILE, "dockerd"), (CONTAINERD_PIDFILE, "containerd")):
            _remove_if_stale(pidfile, name)
        with LOG.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    "dockerd",
                    f"--data-root={DATA_ROOT}",
                    f"--exec-root={EXEC_ROOT}",
                    f"--pidfile={PIDFILE}",
                    f"--host={URL}",
                    f"--bridge={BRIDGE}",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        wait_for(
            self._answers,
            deadline_s=STARTS_SECONDS,
            what="the second engine to start",
            process=self.process,
            detail=lambda: "\n".join(LOG.read_text(errors="replace").splitlines()[-15:]),
            error=RuntimeError,
        )
        return self

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=URL, timeout=300)

    def stop(self) -> None:
        """Stop the daemon this object started (by its pid) and remove its bridge."""
        if self.process is None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)

    def _answers(self) -> bool:
        if not SOCKET.exists():
            return False
        try:
            client = docker.DockerClient(base_url=URL, timeout=5)
        except docker.errors.DockerException:
            return False
        try:
            return bool(client.ping())
        except (docker.errors.DockerException, OSError):
            return False
        finally:
            client.close()

    @staticmethod
    def _bridge() -> None:
        shown = subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False)
        if shown.returncode != 0:
            subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
            subprocess.run(["ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE], check=True)
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)


def _remove_if_stale(pidfile: Path, name: str) -> None:
    """Remove a pid file left by a daemon killed with its machine, as setup-env.sh does for the
    first engine: dockerd refuses to start while any process (a zombie too) holds the pid."""
    try:
        pid = pidfile.read_text().strip()
    except FileNotFoundError:
        return
    try:
        status = Path(f"/proc/{pid}/status").read_text() if pid.isdigit() else ""
    except OSError:
        status = ""
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    if fields.get("Name") != name or fields.get("State", "").startswith("Z"):
        pidfile.unlink(missing_ok=True)
