"""Waiting for a state, never for a time: the one home of the tests' polling loops.

A test that sleeps a fixed time and then assumes something has happened (a server listening,
two commands started, a file written) fails on a loaded machine, where that time is not enough;
one that waits for the state itself passes there too, and takes no longer than it must on an
idle one. Each helper polls a condition every ``POLL_SECONDS`` until it holds or its deadline
passes, and then fails naming what it waited for. A deadline here only bounds a failure, so it
is generous: a minute where a state usually comes within a second.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
POLL_SECONDS = 0.05
STARTS_SECONDS = 120.0  # for a daemon a test starts (dockerd, sshd, a registry) to answer


def wait_for(
    condition: Callable[[], T | None],
    *,
    deadline_s: float,
    what: str,
    process: subprocess.Popen[Any] | None = None,
    detail: Callable[[], str] | None = None,
    error: type[Exception] = AssertionError,
) -> T:
    """The first truthy value of ``condition()``, asked every ``POLL_SECONDS``.

    Raises ``error`` (by default a test failure; a daemon's start raises RuntimeError, which
    its fixture reports as the machine lacking it) once ``deadline_s`` has passed, or at once
    when ``process`` (the one that should bring the state about) has exited; the message names
    ``what`` was awaited and ends with ``detail()`` (e.g. the tail of a log) when given. A
    condition may itself raise to fail sooner."""
    deadline = time.monotonic() + deadline_s
    while True:
        status = None if process is None else process.poll()  # taken before the last look
        if value := condition():
            return value
        if status is not None:
            why = f"its process exited with status {status}"
        elif time.monotonic() > deadline:
            why = f"not within {deadline_s:g} s"
        else:
            time.sleep(POLL_SECONDS)
            continue
        raise error(f"waiting for {what}: {why}" + (f"\n{detail()}" if detail else ""))


def accepts(host: str, port: int) -> bool:
    """Whether ``host:port`` accepts a TCP connection now."""
    try:
        socket.create_connection((host, port), timeout=10).close()
    except OSError:
        return False
    return True


def health_status(port: int, path: str = "/") -> int | None:
    """The status of ``GET path`` on a port of this host, None when nothing answers yet."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    return response.status


def published_port(container: Any, container_port: int) -> int | None:
    """The host port a container's ``container_port/tcp`` is published on, once it is."""
    container.reload()
    bound = (container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{container_port}/tcp")
    return int(bound[0]["HostPort"]) if bound else None


def wait_serving(
    container: Any, container_port: int, health: str = "/", deadline_s: float = 120.0
) -> int:
    """The published port of a container's server once ``GET health`` answers 200 there;
    fails at once, with the container's log, if the container exits first."""

    def serving() -> int | None:
        port = published_port(container, container_port)
        assert container.status != "exited", f"the container exited: {logs()}"
        return port if port is not None and health_status(port, health) == 200 else None

    def logs() -> str:
        return container.logs().decode(errors="replace")[-2000:]

    return wait_for(serving, deadline_s=deadline_s, what="the container's server", detail=logs)
