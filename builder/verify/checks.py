"""The runtime contract's checks, runnable against any server through a `Sandbox` client.

Checks, in order (names are stable; the CLI and the tests refer to them):
  execute              a string command runs; stdout, stderr, exit_code, timed_out false
  exit-code            a command's exit status is passed through
  no-shell             `echo $HOME | cat` is not shell-expanded (no variables, no pipes)
  python3              `python3 -c "..."` runs (how the platform submits code)
  uid                  commands run as uid 65532, gid 65532 (`id -u`, `id -g`)           [image]
  pythonpath           commands see PYTHONPATH with /app/deps, on their sys.path        [image]
  app-deps-readonly    /app/deps exists and nothing in it is writable by the sandbox user [image]
  deps-extra-readonly  /app/deps-extra (if present) is not writable by the sandbox user [image]
  env                  per-request env is merged over the server's environment
  cwd                  cwd defaults to the workspace and a given cwd is resolved inside it
  files                upload -> list -> exists -> download -> delete round trip
  traversal            ../, encoded, absolute, NUL and symlinked-out paths are refused (403)
  timeout              a command past timeout_seconds is killed: exit_code 124, timed_out true
  timeout-cleanup      no process of the timed-out command is left behind (running or zombie)
  race, detached, flood  what a hostile command does to the server (see `race`, `hardening`)
  starve               the sandbox's own connections to its server leave the platform served

[image] checks hold for a built image only; `contract_checks(process_mode=True)` leaves them out
for a server process started by a test. Run that server in its own pid namespace (`unshare
--fork --pid --mount-proc`), as a container is, so timeout-cleanup sees only its processes.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from urllib.parse import quote

from builder import contract
from builder.verify.client import ExecuteReply, Sandbox, encoded, python_json
from builder.verify.hardened.hardening import check_detached, check_flood, leftovers
from builder.verify.hardened.race import check_race
from builder.verify.hardened.starve import check_starve
from builder.verify.report import expect, short

TIMEOUT_SECONDS = 2  # what the timeout check asks for
TIMEOUT_SLACK = 20.0  # how late the 124 may come back
UID = contract.SANDBOX_UID


def expect_not_timed_out(result: ExecuteReply, what: str) -> None:
    expect(
        result.get("timed_out") is False,
        f"{what}: timed_out is {short(result.get('timed_out', 'missing'))}, expected false",
    )


def check_execute(sandbox: Sandbox) -> str:
    result = sandbox.execute("echo hello sandbox")
    expect(
        result["exit_code"] == 0 and result["stdout"] == "hello sandbox\n",
        f"`echo hello sandbox` gave exit_code {result['exit_code']},"
        f" stdout {short(result['stdout'])}",
    )
    expect_not_timed_out(result, "`echo hello sandbox`")
    return "`echo hello sandbox` -> exit 0, stdout 'hello sandbox', timed_out false"


def check_exit_code(sandbox: Sandbox) -> str:
    result = sandbox.execute(["sh", "-c", "exit 7"])
    expect(result["exit_code"] == 7, f"`sh -c 'exit 7'` gave exit_code {result['exit_code']}")
    expect_not_timed_out(result, "`sh -c 'exit 7'`")
    return "`sh -c 'exit 7'` -> 7, timed_out false"


def check_no_shell(sandbox: Sandbox) -> str:
    result = sandbox.execute("echo $HOME | cat")
    expect(
        result["stdout"] == "$HOME | cat\n",
        f"`echo $HOME | cat` printed {short(result['stdout'])}: the command went through a shell",
    )
    return "`echo $HOME | cat` printed '$HOME | cat' (argv, no shell)"


def check_python3(sandbox: Sandbox) -> str:
    result = sandbox.execute('python3 -c "import sys; print(6 * 7, sys.version.split()[0])"')
    words = result["stdout"].split()
    expect(
        result["exit_code"] == 0 and words[:1] == ["42"],
        f"python3 -c gave exit_code {result['exit_code']}, stdout {short(result['stdout'])},"
        f" stderr {short(result['stderr'][-300:])}",
    )
    return f"python3 -c works (Python {words[1] if len(words) > 1 else '?'})"


def check_uid(sandbox: Sandbox) -> str:
    uid = sandbox.execute(["id", "-u"])["stdout"].strip()
    gid = sandbox.execute(["id", "-g"])["stdout"].strip()
    found = f"uid {uid or '?'}, gid {gid or '?'}"
    expect(
        (uid, gid) == (str(UID), str(contract.SANDBOX_GID)),
        f"commands run as {found}, expected {contract.SANDBOX_USER}",
    )
    return f"commands run as {found}"


PYTHONPATH_SCRIPT = """
import json, os, sys
print(json.dumps({"env": os.environ.get("PYTHONPATH"), "path": sys.path}))
"""


def check_pythonpath(sandbox: Sandbox) -> str:
    seen = python_json(sandbox, PYTHONPATH_SCRIPT)
    value = seen.get("env")
    expect(value is not None, "commands see no PYTHONPATH")
    expect(contract.DEPS in value.split(":"), f"PYTHONPATH={value} lacks {contract.DEPS}")
    expect(contract.DEPS in seen.get("path", []), f"{contract.DEPS} is not on sys.path")
    return f"PYTHONPATH={value}"


WRITABLE_SCRIPT = """
import json, os, stat, sys
uid, groups = os.getuid(), {os.getgid(), *os.getgroups()}

def writable(path):
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISLNK(info.st_mode):
        return False
    if info.st_uid == uid:
        bit = stat.S_IWUSR
    elif info.st_gid in groups:
        bit = stat.S_IWGRP
    else:
        bit = stat.S_IWOTH
    # Permission bits, not os.access: the read-only root filesystem of this run would hide
    # a tree that is writable wherever the root filesystem is not read-only.
    return bool(info.st_mode & bit) or uid == 0

root = sys.argv[1]
if not os.path.isdir(root):
    print(json.dumps({"present": False}))
    raise SystemExit
found, entries = [], 0
for top, dirs, files in os.walk(root):
    for path in [top, *(os.path.join(top, name) for name in files)]:
        entries += 1
        if writable(path):
            found.append(path)
print(json.dumps({"present": True, "entries": entries, "writable": found[:5],
                  "writable_count": len(found)}))
"""


def _readonly(sandbox: Sandbox, path: str, required: bool) -> str:
    seen = python_json(sandbox, WRITABLE_SCRIPT, path)
    if not seen.get("present"):
        expect(not required, f"{path} does not exist")
        return f"{path} not present"
    count = seen.get("writable_count", 0)
    expect(
        count == 0,
        f"{count} entries in {path} are writable by uid {UID},"
        f" e.g. {', '.join(seen.get('writable', []))}",
    )
    return f"{path}: none of {seen.get('entries')} entries writable by uid {UID}"


def check_app_deps(sandbox: Sandbox) -> str:
    return _readonly(sandbox, contract.DEPS, required=True)


def check_deps_extra(sandbox: Sandbox) -> str:
    return _readonly(sandbox, contract.DEPS_EXTRA, required=False)


def environment(sandbox: Sandbox, env: dict[str, str] | None = None) -> dict[str, str]:
    """BSI_VERIFY and PYTHONPATH as a command sees them, from `env -0` (no Python to start)."""
    result = sandbox.execute(["env", "-0"], env=env)
    expect(result["exit_code"] == 0, f"`env -0` exited {result['exit_code']}")
    pairs = [entry.partition("=") for entry in result["stdout"].split("\0") if entry]
    seen: dict[str, str] = {}
    for key, _, value in pairs:
        if key in ("BSI_VERIFY", "PYTHONPATH"):
            # Programs differ on which of two entries they take (getenv the first): ambiguous.
            expect(key not in seen, f"the command's environment holds {key} twice")
            seen[key] = value
    return seen


def check_env(sandbox: Sandbox) -> str:
    # Unique per run: an `env` printing canned output cannot pass for the environment.
    value = f"a value with spaces, $HOME and 'quotes' {uuid.uuid4().hex[:8]}"
    plain = environment(sandbox)
    seen = environment(sandbox, {"BSI_VERIFY": value})
    expect(
        seen.get("BSI_VERIFY") == value, f"BSI_VERIFY arrived as {short(seen.get('BSI_VERIFY'))}"
    )
    expect(
        seen.get("PYTHONPATH") == plain.get("PYTHONPATH"),
        f"with env given, PYTHONPATH became {short(seen.get('PYTHONPATH'))} (was"
        f" {short(plain.get('PYTHONPATH'))}): env replaced the server's environment instead of"
        " being merged over it",
    )
    return "env passed to the command and merged over the server's (PYTHONPATH kept)"


CWD = ("pwd", "-P")  # getcwd(), as a Python's os.getcwd(), without starting one (slow emulated)


def check_cwd(sandbox: Sandbox) -> str:
    root = sandbox.workspace
    directory = f"bsi-verify-cwd-{uuid.uuid4().hex[:8]}/sub dir"
    made = sandbox.execute(["mkdir", "-p", f"{root}/{directory}"])
    expect(made["exit_code"] == 0, f"mkdir in {root} failed: {short(made['stderr'])}")
    default = sandbox.execute(CWD)["stdout"].strip()
    expect(default == root, f"default cwd is {short(default)}, expected {root}")
    given = sandbox.execute(CWD, cwd=directory)["stdout"].strip()
    expect(
        given == f"{root}/{directory}",
        f"cwd {directory!r} ran in {short(given)}, expected {root}/{directory}",
    )
    sandbox.execute(["rm", "-rf", f"{root}/{directory.split('/')[0]}"])
    return f"default {root}; cwd {directory!r} -> {given}"


def check_files(sandbox: Sandbox) -> str:
    top = f"bsi-verify-{uuid.uuid4().hex[:8]}"
    folder = f"{top}/nested dir"
    path = f"{folder}/data.bin"
    content = os.urandom(4096) + b"\x00\xff\r\n--not-a-boundary\r\n"
    response = sandbox.upload(path, content)
    expect(
        response.status == 200, f"upload {path!r}: HTTP {response.status} {short(response.body)}"
    )
    response = sandbox.list(folder)
    listing = response.json()
    expect(response.status == 200, f"list {folder!r}: HTTP {response.status} {short(listing)}")
    expect(isinstance(listing, list), f"list {folder!r} is not a JSON array: {short(listing)}")
    entry = next((e for e in listing if isinstance(e, dict) and e.get("name") == "data.bin"), {})
    expect(bool(entry), f"list {folder!r} lacks the uploaded file: {short(listing)}")
    expect(
        entry.get("size") == len(content) and entry.get("type") == "file" and "mod_time" in entry,
        f"list entry {short(entry)}: expected size {len(content)}, type file, mod_time",
    )
    kinds = {e.get("name"): e.get("type") for e in sandbox.list(top).json() if isinstance(e, dict)}
    expect(kinds.get("nested dir") == "directory", f"list {top!r}: {short(kinds)}")

    response = sandbox.exists(path)
    found = response.json()
    expect(
        response.status == 200 and isinstance(found, dict) and found.get("exists") is True,
        f"exists {path!r}: HTTP {response.status} {short(found)}",
    )
    response = sandbox.download(path)
    expect(response.status == 200, f"download {path!r}: HTTP {response.status}")
    expect(
        response.body == content,
        f"download {path!r}: {len(response.body)} bytes differ from the {len(content)} uploaded",
    )
    response = sandbox.delete(path)
    expect(200 <= response.status < 300, f"delete {path!r}: HTTP {response.status}")
    response = sandbox.exists(path)
    gone = response.json()
    expect(
        response.status == 200 and isinstance(gone, dict) and gone.get("exists") is False,
        f"after delete, exists {path!r}: HTTP {response.status} {short(gone)}",
    )
    missing = sandbox.download(path).status
    expect(missing == 404, f"download of a deleted file: HTTP {missing}, expected 404")
    sandbox.delete(top)
    return f"{len(content)} bytes: upload, list, exists, download, delete, 404 after delete"


LINK = "bsi-verify-escape"  # made a symlink to /etc inside the workspace
ESCAPE = "bsi-escape.txt"
# Paths that must be refused (403) by every file route, as the client means them; the
# routes get each one percent-encoded, with its dots encoded too, and as it is. Those named
# ESCAPE are also uploaded (the others name files that exist outside the workspace).
HOSTILE_PATHS = (
    "../../../etc/passwd",
    "sub/../../../etc/passwd",
    "/etc/passwd",
    "/tmp",
    f"{LINK}/passwd",
    f"{LINK}/../passwd",
    "passwd\x00.txt",
    f"../{ESCAPE}",
    f"../tmp/{ESCAPE}",
    f"/tmp/{ESCAPE}",
    f"{LINK}/{ESCAPE}",
    f"a/../../tmp/{ESCAPE}",
)
ROUTES = (
    ("GET", contract.DOWNLOAD),
    ("GET", contract.LIST),
    ("GET", contract.EXISTS),
    ("DELETE", contract.FILES),
)
ESCAPE_PROBE = """
import json, os, sys
parent = os.path.dirname(sys.argv[1].rstrip("/")) or "/"
places = {os.path.join(parent, sys.argv[2]), os.path.join(parent, "tmp", sys.argv[2]),
          os.path.join("/tmp", sys.argv[2]), os.path.join("/etc", sys.argv[2])}
print(json.dumps(sorted(p for p in places if os.path.lexists(p))))
"""


def hostile_forms(path: str) -> list[str]:
    """`path` as the routes receive it: encoded, with dots encoded too, and raw."""
    forms = [encoded(path), quote(path, safe="").replace(".", "%2E"), path]
    printable = [form for form in forms if form.isprintable()]
    return list(dict.fromkeys(printable))


def check_traversal(sandbox: Sandbox) -> str:
    root = sandbox.workspace
    made = sandbox.execute(["ln", "-sfn", "/etc", f"{root}/{LINK}"])
    expect(made["exit_code"] == 0, f"could not create a symlink in {root}: {made['stderr']}")
    bad: list[str] = []
    probes = 0
    for path in HOSTILE_PATHS:
        for method, route in ROUTES:
            for form in hostile_forms(path):
                probes += 1
                status = sandbox.request(method, route + form).status
                if status != 403:
                    bad.append(f"{method} {route}{form} -> {status}")
        if path.endswith(ESCAPE):
            probes += 1
            status = sandbox.upload(path, b"escaped\n").status
            if status != 403:
                bad.append(f"upload {path!r} -> {status}")
    escaped = python_json(sandbox, ESCAPE_PROBE, root, ESCAPE)
    sandbox.execute(["rm", "-f", f"{root}/{LINK}"])
    etc = sandbox.execute(["test", "-f", "/etc/passwd"])["exit_code"] == 0
    expect(not escaped, f"files written outside {root}: {', '.join(escaped)}")
    expect(etc, "/etc/passwd is gone after DELETE probes")
    expect(not bad, f"{len(bad)} of {probes} not refused with 403: {'; '.join(bad[:6])}")
    return f"{probes} hostile requests refused with 403, nothing written outside {root}"


SLEEP_SECONDS = 86399  # the timeout command's marker; the cleanup probe never spells it out
LEFTOVER_SCRIPT = """
import json, os, sys
marker = str(int(sys.argv[1]) + 1)
me = os.getpid()
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) in (me, os.getppid()):
        continue
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        continue
    if state == "Z" or marker in cmdline.split():
        found.append({"pid": int(pid), "state": state, "cmdline": cmdline})
print(json.dumps(found))
"""


def check_timeout(sandbox: Sandbox) -> str:
    command = ["sh", "-c", f"sleep {SLEEP_SECONDS} & sleep {SLEEP_SECONDS} & sleep {SLEEP_SECONDS}"]
    started = time.monotonic()
    result = sandbox.execute(command, timeout_seconds=TIMEOUT_SECONDS)
    elapsed = time.monotonic() - started
    expect(
        result["exit_code"] == contract.TIMEOUT_EXIT_CODE,
        f"a command past timeout_seconds={TIMEOUT_SECONDS} answered exit_code"
        f" {result['exit_code']} after {elapsed:.1f}s, expected {contract.TIMEOUT_EXIT_CODE}",
    )
    expect(
        result.get("timed_out") is True,
        f"a command past timeout_seconds={TIMEOUT_SECONDS} answered timed_out"
        f" {short(result.get('timed_out', 'missing'))}, expected true",
    )
    expect(
        elapsed < TIMEOUT_SECONDS + TIMEOUT_SLACK,
        f"timeout_seconds={TIMEOUT_SECONDS} answered only after {elapsed:.1f}s",
    )
    return (
        f"timeout_seconds={TIMEOUT_SECONDS}: exit_code {contract.TIMEOUT_EXIT_CODE},"
        f" timed_out true after {elapsed:.1f}s"
    )


def check_timeout_cleanup(sandbox: Sandbox) -> str:
    left = leftovers(sandbox, LEFTOVER_SCRIPT, str(SLEEP_SECONDS - 1))
    described = "; ".join(
        f"pid {p['pid']} [{p['state']}] {p['cmdline'] or '(zombie)'}" for p in left[:5]
    )
    expect(not left, f"{len(left)} processes left after the timeout: {described}")
    return "no process of the timed-out command left (none running, no zombies)"


CONTRACT: tuple[tuple[str, Callable[[Sandbox], str]], ...] = (
    ("execute", check_execute),
    ("exit-code", check_exit_code),
    ("no-shell", check_no_shell),
    ("python3", check_python3),
    ("uid", check_uid),
    ("pythonpath", check_pythonpath),
    ("app-deps-readonly", check_app_deps),
    ("deps-extra-readonly", check_deps_extra),
    ("env", check_env),
    ("cwd", check_cwd),
    ("files", check_files),
    ("traversal", check_traversal),
    ("timeout", check_timeout),
    ("timeout-cleanup", check_timeout_cleanup),
    ("race", check_race),
    ("detached", check_detached),
    ("flood", check_flood),
    ("starve", check_starve),
)
IMAGE_ONLY = frozenset({"uid", "pythonpath", "app-deps-readonly", "deps-extra-readonly"})


def contract_checks(process_mode: bool = False) -> list[tuple[str, Callable[[Sandbox], str]]]:
    """The contract checks to run: all for an image, those about the server for a process."""
    return [(name, check) for name, check in CONTRACT if not process_mode or name not in IMAGE_ONLY]
