"""``/execute``: the request's fields, and running a command to a spooled :class:`Outcome`."""

from __future__ import annotations

import math
import os
import selectors
import shlex
import subprocess
import time
from typing import Any

from ..config import CHUNK, Config
from ..errors import ApiError, check_os_string
from .output import NOTE_RESERVE, Capture, Outcome, SpoolFactory
from .supervisor import Supervisor, has_exited, open_pidfd

TIMEOUT_EXIT_CODE = 124
NOT_EXECUTABLE_EXIT_CODE = 126
NOT_FOUND_EXIT_CODE = 127
PIPE_LINGER_SECONDS = 0.5
POLL_SECONDS = 0.02


def parse_command(command: Any) -> list[str]:
    """A string is split like a POSIX shell would split words (no expansion); a list is argv."""
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ApiError(400, f"command cannot be split: {exc}") from None
    elif isinstance(command, list) and all(isinstance(arg, str) for arg in command):
        argv = list(command)
    else:
        raise ApiError(400, "command must be a string or a list of strings")
    if not argv:
        raise ApiError(400, "command is empty")
    for arg in argv:
        check_os_string(arg, "command")
    return argv


def parse_timeout(value: Any, config: Config) -> float:
    """Positive finite seconds, capped so that no request can hold a worker forever."""
    if value is None:
        return config.default_timeout
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, "timeout_seconds must be a number")
    if (isinstance(value, float) and not math.isfinite(value)) or value <= 0:
        raise ApiError(400, "timeout_seconds must be a positive finite number")
    return float(min(value, config.max_timeout))  # exact int/float comparison: no overflow


def parse_env(value: Any) -> dict[str, str]:
    """Extra environment variables; merged over the server's own (which carries PYTHONPATH)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, "env must be an object of strings")
    for key, item in value.items():
        if not isinstance(item, str) or not key or "=" in key:
            raise ApiError(400, f"env entry {key!r} must map a valid name to a string")
        check_os_string(key, "env name")
        check_os_string(item, "env value")
    return value


class Runner:
    """Runs commands: spawned by the supervisor, output spooled, everything swept at the end."""

    def __init__(self, config: Config, supervisor: Supervisor, spools: SpoolFactory) -> None:
        self.config = config
        self.supervisor = supervisor
        self.spools = spools

    def run(self, argv: list[str], cwd_fd: int, env: dict[str, str], timeout: float) -> Outcome:
        """Run argv without a shell in ``cwd_fd``; when it exits or times out, every process it
        started is killed (see :class:`Supervisor`)."""
        budget = max(self.config.max_reply // 2 - NOTE_RESERVE, 0)
        out = Capture(self.config.max_output, self.spools.new())
        err = Capture(self.config.max_output, self.spools.new())
        try:
            proc, marker = self.supervisor.spawn(argv, env, cwd_fd)
        except FileNotFoundError:
            message = f"{argv[0]}: command not found\n"
            return Outcome(out, err, NOT_FOUND_EXIT_CODE, False, timeout, budget, message=message)
        except (OSError, subprocess.SubprocessError) as exc:
            message = f"{argv[0]}: cannot execute: {getattr(exc, 'strerror', None) or exc}\n"
            return Outcome(
                out, err, NOT_EXECUTABLE_EXIT_CODE, False, timeout, budget, message=message
            )
        killed = 0
        try:
            timed_out = self._collect(proc, marker, out, err, timeout)
        finally:
            killed = self.supervisor.sweep(proc, marker)
            self.supervisor.release(proc)
        if timed_out:
            code = TIMEOUT_EXIT_CODE
        else:
            code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return Outcome(out, err, code, timed_out, timeout, budget, killed=killed)

    def _collect(
        self,
        proc: subprocess.Popen[bytes],
        marker: str,
        out: Capture,
        err: Capture,
        timeout: float,
    ) -> bool:
        """Spool both pipes until the main process exits or the deadline passes (True: timed
        out); then kill everything the command started and drain what is left, briefly."""
        assert proc.stdout is not None and proc.stderr is not None
        captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        pidfd = open_pidfd(proc.pid)
        deadline = time.monotonic() + timeout
        linger_until: float | None = None
        timed_out = False
        with selectors.DefaultSelector() as selector:
            for fd in captures:
                selector.register(fd, selectors.EVENT_READ)
            if pidfd is not None:
                selector.register(pidfd, selectors.EVENT_READ)
            try:
                while True:
                    now = time.monotonic()
                    if linger_until is None and (has_exited(proc.pid) or now >= deadline):
                        timed_out = self._end(proc, marker, selector, pidfd)
                        now = time.monotonic()
                        linger_until = now + PIPE_LINGER_SECONDS
                    open_pipes = [fd for fd in selector.get_map() if fd in captures]
                    if linger_until is not None and (not open_pipes or now >= linger_until):
                        break
                    wait = (linger_until or deadline) - now
                    if linger_until is None and pidfd is None:
                        wait = min(wait, POLL_SECONDS)
                    spool_ready(selector, captures, max(wait, 0.0))
            finally:
                if pidfd is not None:
                    os.close(pidfd)
                proc.stdout.close()
                proc.stderr.close()
        return timed_out

    def _end(
        self,
        proc: subprocess.Popen[bytes],
        marker: str,
        selector: selectors.BaseSelector,
        pidfd: int | None,
    ) -> bool:
        """The main process has exited or the deadline has passed: kill every process the
        command started (True: the main process was still running, the command timed out)."""
        timed_out = not has_exited(proc.pid)
        # Every holder of the pipes dies here, so they reach EOF at once.
        self.supervisor.sweep(proc, marker)
        if pidfd is not None:
            selector.unregister(pidfd)
        return timed_out


def spool_ready(
    selector: selectors.BaseSelector, captures: dict[int, Capture], wait: float
) -> None:
    """Wait up to ``wait`` seconds, then feed what each ready pipe holds to its capture; a pipe
    at its end is unregistered. (A ready pidfd only ends the wait: the main process exited.)"""
    for key, _ in selector.select(wait):
        if key.fd not in captures:
            continue
        chunk = os.read(key.fd, CHUNK)
        if chunk:
            captures[key.fd].feed(chunk)
        else:
            selector.unregister(key.fd)
