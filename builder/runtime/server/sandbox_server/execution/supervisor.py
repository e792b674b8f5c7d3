"""Process supervision: none of a command's processes outlives it.

The server is a child subreaper, so every orphan of a command is re-parented to it, not to
init. Each execution carries a unique ``SANDBOX_EXEC_ID`` in its environment. When the
command's main process exits or times out, every process below it, every orphan carrying its
marker and every orphan carrying no marker of a running execution (one that cleared its
environment) is killed, in rounds, until none is left; ``setsid``, double forks and new
sessions do not escape. What can still escape: nothing that stays a descendant of the server. A
process that clears its environment while another command is running is treated as an orphan of
whichever execution finishes first (killed early, never missed). Without the subreaper (a kernel
without PR_SET_CHILD_SUBREAPER, and the server not PID 1) orphans go to init and only the
environment marker finds them, so a process that both clears its environment and double-forks
escapes in that case only.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from .stopping import unblock_stop_signals

MARKER_VAR = "SANDBOX_EXEC_ID"
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
COMMAND_OOM_SCORE_ADJ = b"1000"
# The state in /proc/<pid>/stat of a process that has exited and is not reaped yet.
ZOMBIE = "Z"
# How long a reaped descendant's pid still counts as one for a stop signal it sent: a signal is
# read within milliseconds, and a pid is reused only after the kernel went round its range.
REAPED_MEMORY = 5.0
# (limit, count) of the cgroup's processes: cgroup v2, then v1's pids controller
PIDS_FILES = (
    ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids.current"),
    ("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids/pids.current"),
)


def prepare_child(cwd_fd: int) -> None:
    """In the command's process, before exec: enter the directory resolved (``fchdir``), and
    make it, and so everything it starts (the score is inherited), the OOM killer's first
    choice: 1000 is the maximum, and raising it needs no privilege. The server keeps its own."""
    os.fchdir(cwd_fd)
    unblock_stop_signals()
    call_prctl(PR_SET_DUMPABLE, 1)  # /proc/self is root's while not (guard_server_process)
    with contextlib.suppress(OSError):  # no /proc: the command just keeps the server's score
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, COMMAND_OOM_SCORE_ADJ)
        finally:
            os.close(fd)


def process_limit_reached() -> bool:
    """Whether the cgroup (the container's) has no process left to fork."""
    for limit_file, count_file in PIDS_FILES:
        try:
            with open(limit_file, "rb") as handle:
                limit = handle.read().strip()
            with open(count_file, "rb") as handle:
                current = int(handle.read())
        except (OSError, ValueError):
            continue  # no such controller here
        return limit.isdigit() and current >= int(limit)
    return False


@functools.cache
def prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once in the server: a forked child must not take the loader's
    lock another thread may have held at the fork. None where libc lacks it."""
    try:
        function: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return function
    except (OSError, AttributeError):
        return None


def call_prctl(option: int, value: int) -> bool:
    """prctl(option, value); False where it failed or libc lacks it."""
    function = prctl()
    return function is not None and function(option, value, 0, 0, 0) == 0


def set_child_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER): orphans below the server are re-parented to it rather
    than to init. Needs no capability; False where the kernel or libc lacks it."""
    return call_prctl(PR_SET_CHILD_SUBREAPER, 1)


def guard_server_process() -> bool:
    """prctl(PR_SET_DUMPABLE, 0): the commands run as the server's uid, and a dumpable server
    would be theirs to ptrace, to read and write through /proc/<pid>/mem, and to make the OOM
    killer's choice through /proc/<pid>/oom_score_adj. Not dumpable, its /proc files belong to
    root and ptrace needs CAP_SYS_PTRACE. Each command becomes dumpable again before its score
    is written (``prepare_child``), and exec resets it anyway."""
    return call_prctl(PR_SET_DUMPABLE, 0)


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process visible in /proc."""
    table: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            table[int(name)] = (int(fields[1]), fields[0].decode())
        except (OSError, IndexError, ValueError):
            continue
    return table


def children_of(table: dict[int, tuple[int, str]], parent: int) -> list[int]:
    return [pid for pid, (ppid, _) in table.items() if ppid == parent]


def live_subtrees(table: dict[int, tuple[int, str]], roots: list[int], spare: int) -> set[int]:
    """``roots`` and every process below them, zombies and ``spare`` (the server) left out."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in found or pid == spare:
            continue
        found.add(pid)
        stack.extend(children.get(pid, []))
    return {pid for pid in found if table[pid][1] != ZOMBIE}


def marker_of(pid: int) -> str | None:
    """The execution marker in a process's environment (None: none, or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:
        return None
    prefix = MARKER_VAR.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("ascii", "replace")
    return None


class Supervisor:
    """Starts commands and makes sure none of their processes outlive them.

    The server is a child subreaper (and, in a container, PID 1), so every process a command
    starts stays a descendant of the server, whatever it does with sessions and groups: while
    its parent lives it hangs below the command, and once orphaned it hangs directly below the
    server. Each execution's processes carry ``SANDBOX_EXEC_ID=<random>`` in their environment.
    :meth:`sweep` kills, in rounds until a round finds nothing: the command's leader and all its
    descendants, and every orphan below the server (with its descendants) that carries the
    execution's marker or no marker of a running execution."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.subreaper = set_child_subreaper()
        guard_server_process()
        self._lock = threading.Lock()
        self._leaders: dict[int, str] = {}  # running commands' main pids -> marker
        self._reaped: dict[int, float] = {}  # descendants reaped lately -> when (monotonic)

    def spawn(
        self, argv: list[str], env: dict[str, str], cwd_fd: int
    ) -> tuple[subprocess.Popen[bytes], str]:
        """Start ``argv`` in its own session, in the directory ``cwd_fd`` (fchdir in the child,
        so the directory is the one resolved, whatever its name points at by then)."""
        marker = secrets.token_hex(16)
        with self._lock:  # registered before any sweep or reap can see the new child
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env | {MARKER_VAR: marker},
                start_new_session=True,
                preexec_fn=functools.partial(prepare_child, cwd_fd),
            )
            self._leaders[proc.pid] = marker
        return proc, marker

    def release(self, proc: subprocess.Popen[bytes]) -> None:
        """Reap the command's main process and forget it."""
        with self._lock:  # remembered before it is reaped: no moment where it is neither
            self._remember_reaped(proc.pid)
        proc.wait()
        with self._lock:
            self._leaders.pop(proc.pid, None)
            self._remember_reaped(proc.pid)

    def _remember_reaped(self, pid: int) -> None:
        """Keep the pid of a descendant about to be reaped for REAPED_MEMORY seconds (under
        the lock): a stop signal it sent just before it ended may be read after it was reaped."""
        now = time.monotonic()
        self._reaped = {p: at for p, at in self._reaped.items() if now - at < REAPED_MEMORY}
        self._reaped[pid] = now

    def _victims(self, table: dict[int, tuple[int, str]], leader: int, marker: str) -> set[int]:
        roots = [leader] if leader in table else []
        running = set(self._leaders.values())
        for pid in children_of(table, self.pid):
            if pid in self._leaders:
                continue
            found = marker_of(pid)
            if found == marker or found not in running:
                roots.append(pid)
        if not self.subreaper and self.pid != 1:  # orphans went to init: the marker only
            roots += [pid for pid in table if pid != self.pid and marker_of(pid) == marker]
        return live_subtrees(table, roots, self.pid)

    def sweep(self, proc: subprocess.Popen[bytes], marker: str) -> int:
        """Kill every process of one execution (its leader included); the number killed."""
        killed = 0
        for attempt in range(500):
            with self._lock:  # no command can be spawned between the scan and the kill
                victims = self._victims(process_table(), proc.pid, marker)
                for pid in victims:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            if not victims:
                break
            killed += len(victims - {proc.pid})
            self.reap_orphans()
            time.sleep(min(0.001 * attempt, 0.02))
        return killed

    def sent_from_below(self, sender: int) -> bool:
        """Whether ``sender`` is one of the server's descendants, as every process a command
        starts stays (``stopping``). 0 (outside the pid namespace, or the kernel) is not; a
        sender already gone is one only where the server is PID 1, whose namespace holds
        nothing else."""
        if sender == 0:
            return False
        table = process_table()
        if sender not in table:
            reaped = self._reaped.get(sender)
            return self.pid == 1 or (
                reaped is not None and time.monotonic() - reaped < REAPED_MEMORY
            )
        seen: set[int] = set()
        while sender in table and sender not in seen:
            seen.add(sender)
            sender = table[sender][0]
            if sender == self.pid:
                return True
        return False

    def kill_everything(self) -> None:
        """Server shutdown: kill every descendant."""
        for _ in range(200):
            with self._lock:
                table = process_table()
                alive = live_subtrees(table, children_of(table, self.pid), self.pid)
                for pid in alive:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            self.reap_orphans()
            if not alive:
                return
            time.sleep(0.01)

    def reap_orphans(self) -> None:
        """Reap the zombies of orphans re-parented to the server (as subreaper or PID 1), never
        a command's main process, whose Popen reaps it."""
        with self._lock:
            owned = set(self._leaders)
            for pid, (ppid, state) in process_table().items():
                if state == ZOMBIE and ppid == self.pid and pid not in owned:
                    self._remember_reaped(pid)  # before: a signal it sent is read after
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)


def open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits; None where the kernel lacks it."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def has_exited(pid: int) -> bool:
    """True once the child has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
