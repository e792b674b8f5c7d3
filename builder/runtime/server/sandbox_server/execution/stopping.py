"""Stop signals, honoured only from outside the server's own process tree.

The commands run as the server's user, so the kernel lets any of them send the server SIGTERM
or SIGINT: ``kill -TERM $PPID`` would take the control plane down with the workspace. The
server therefore blocks both signals in every thread and waits for them in one
(``sigwaitinfo``), which tells who sent each: a signal from one of the server's descendants
(every process a command starts stays one, the server being their subreaper) is ignored. The
container runtime signals from outside the container's pid namespace (the sender shows as pid
0), the kernel's terminal SIGINT as pid 0 too, and an operator's ``kill`` is no descendant:
those stop the server. A sender already gone when the signal is read is placed by what the
server reaped: its descendants' pids are kept for a few seconds around their reaping (a
command that signals and is reaped at once used to win that race where the server is not
PID 1, as in the tests). As PID 1 (a container) every process it could have been is a
descendant, so it is ignored.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def block_stop_signals() -> None:
    """Before any thread starts (they inherit the mask): only ``wait_for_stop`` sees them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def unblock_stop_signals() -> None:
    """In a command's process before exec: the mask survives exec, commands must not keep it."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def wait_for_stop(sent_from_below: Callable[[int], bool]) -> int:
    """The first stop signal whose sender (a pid, 0 from outside the pid namespace or from the
    kernel) ``sent_from_below`` does not place among the server's descendants."""
    while True:
        info = signal.sigwaitinfo(STOP_SIGNALS)
        if not sent_from_below(info.si_pid):
            return info.si_signo
