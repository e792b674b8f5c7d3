"""scripts/setup-env.sh after a machine stopped without stopping its daemons.

A CI machine restored from a snapshot keeps /run but none of its processes: dockerd's pid file
then names a pid some other process may already hold, and dockerd refuses to start ("pid file
found"). The script removes such a file before it starts dockerd. These tests source the script
(which then runs nothing) and call that step on pid files of their own, naming real processes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.waiting import wait_for

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "setup-env.sh"


def remove_stale_pidfile(pidfile: Path, name: str) -> subprocess.CompletedProcess[str]:
    step = f'source "{SCRIPT}" && remove_stale_pidfile "$1" "$2"'
    argv = ["bash", "-c", step, "setup-env", str(pidfile), name]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose command name is `sleep`: a pid reused by something else."""
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def test_a_pid_file_naming_another_program_is_removed(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pidfile = tmp_path / "docker.pid"
    pidfile.write_text(str(sleeper.pid))
    done = remove_stale_pidfile(pidfile, "dockerd")
    assert not pidfile.exists()
    assert f"pid {sleeper.pid} is sleep" in done.stdout
    assert sleeper.poll() is None  # the stranger is left alone


def test_a_pid_file_naming_no_process_is_removed(tmp_path: Path) -> None:
    pidfile = tmp_path / "containerd.pid"
    pidfile.write_text("2147483646\n")  # above any pid_max: no process has it
    done = remove_stale_pidfile(pidfile, "containerd")
    assert not pidfile.exists()
    assert "is not running" in done.stdout


ZOMBIE_PARENT = """
import os, time
child = os.fork()
if child == 0:
    os._exit(0)
print(child, flush=True)
time.sleep(300)  # alive, not reaping: the child stays a zombie
"""


def test_a_pid_file_naming_a_killed_daemon_not_yet_reaped_is_removed(tmp_path: Path) -> None:
    """A zombie keeps its pid and its name, and dockerd would take it for running."""
    parent = subprocess.Popen(["python3", "-c", ZOMBIE_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        zombie = int(parent.stdout.readline())
        status = Path(f"/proc/{zombie}/status")
        wait_for(lambda: "State:\tZ" in status.read_text(), deadline_s=60, what="the zombie")
        assert "Name:\tpython3" in status.read_text()
        pidfile = tmp_path / "docker.pid"
        pidfile.write_text(str(zombie))
        done = remove_stale_pidfile(pidfile, "python3")
        assert not pidfile.exists()
        assert "a zombie" in done.stdout
    finally:
        parent.kill()
        parent.wait()


def test_a_pid_file_naming_the_running_daemon_is_kept(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pidfile = tmp_path / "sleep.pid"
    pidfile.write_text(f"{sleeper.pid}\n")
    done = remove_stale_pidfile(pidfile, "sleep")
    assert pidfile.read_text() == f"{sleeper.pid}\n"
    assert done.stdout == ""


def test_sourcing_the_script_runs_no_step() -> None:
    sourced = subprocess.run(
        ["bash", "-c", f'source "{SCRIPT}" && declare -F main'],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert sourced.stdout.strip() == "main"
    assert "setup-env:" not in sourced.stdout + sourced.stderr
