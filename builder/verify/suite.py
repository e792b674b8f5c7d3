"""Prove that an image serves the sandbox runtime contract when it runs hardened.

The image runs the way the platform runs it: read-only root filesystem, all capabilities
dropped, no-new-privileges, uid/gid 65532, tmpfs /workspace (owned by 65532) and /tmp, port
8888 published on 127.0.0.1 only. Every check talks to the image's own server over that port,
as the platform does; commands that look inside the image run through POST /execute. The
container is always removed, whatever happens.

Checks, in order (names are stable; the CLI and the tests refer to them):
  image-user           the image config's User is numeric 65532 (runAsNonRoot can prove it)
  health               GET / answers 200 (bounded wait for start-up)
  execute              a string command runs; stdout, stderr, exit_code come back
  exit-code            a command's exit status is passed through
  no-shell             `echo $HOME | cat` is not shell-expanded (no variables, no pipes)
  python3              `python3 -c "..."` runs (how the platform submits code)
  uid                  commands run as uid 65532, gid 65532 (`id -u`, `id -g`)
  pythonpath           commands see PYTHONPATH with /app/deps, and it is on their sys.path
  app-deps-readonly    /app/deps exists and nothing in it is writable by the sandbox user
  deps-extra-readonly  /app/deps-extra (if present) is not writable by the sandbox user
  env                  per-request env is merged over the server's environment
  cwd                  cwd defaults to /workspace and a given cwd is resolved inside it
  files                upload -> list -> exists -> download -> delete round trip
  traversal            ../, encoded, absolute, NUL and symlinked-out paths are refused (403)
  timeout              a command past timeout_seconds is killed and answers exit_code 124
  timeout-cleanup      no process of the timed-out command is left behind (running or zombie)
  import <module>      one per module given or derived from a requirements file
  check <n>            one per snippet given, run as `python3 -c SNIPPET`
  still-serving        GET / still answers 200 after everything above
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import docker
import docker.errors

from builder.engine import engine_client, local_image
from builder.errors import UserError

SANDBOX_UID = 65532
PORT = 8888
WORKSPACE = "/workspace"
DEPS = "/app/deps"
DEPS_EXTRA = "/app/deps-extra"
STARTUP_TIMEOUT = 60.0
EXECUTE_TIMEOUT = 120.0  # seconds allowed to one ordinary command (imports of big libraries)
TIMEOUT_SECONDS = 2  # what the timeout check asks for
TIMEOUT_SLACK = 20.0  # how late the 124 may come back
CLEANUP_WAIT = 5.0  # how long killed processes may take to disappear
LABEL = "org.build-sandbox-image.verify"
SKIP_TOP_LEVEL = frozenset({"test", "tests", "testing", "docs", "doc", "examples", "benchmarks"})


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class VerifyReport:
    image: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    def table(self) -> str:
        width = max((len(check.name) for check in self.checks), default=0)
        lines = [f"verify {self.image}"]
        lines += [
            f"{'PASS' if c.passed else 'FAIL'}  {c.name.ljust(width)}  {c.detail}"
            for c in self.checks
        ]
        passed = len(self.checks) - len(self.failed)
        lines.append(f"{passed}/{len(self.checks)} checks passed")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "passed": self.passed,
            "checks": [asdict(check) for check in self.checks],
        }


class CheckFailed(Exception):
    """A check's expectation did not hold; the message is the report's detail."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.strip().replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def last_line(text: str) -> str:
    return short((text.strip().splitlines() or ["?"])[-1])


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            text = short(self.body.decode("latin-1"))
            raise CheckFailed(f"HTTP {self.status}, not JSON: {text}") from None


class Sandbox:
    """HTTP client for one sandbox server on 127.0.0.1 (never through a proxy)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Response:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return Response(response.status, response.read())
        finally:
            connection.close()

    def execute(
        self,
        command: str | Sequence[str],
        *,
        timeout_seconds: float = EXECUTE_TIMEOUT,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "command": command if isinstance(command, str) else list(command),
            "timeout_seconds": timeout_seconds,
        }
        if env is not None:
            payload["env"] = env
        if cwd is not None:
            payload["cwd"] = cwd
        response = self.request(
            "POST",
            "/execute",
            json.dumps(payload).encode(),
            {"Content-Type": "application/json"},
            timeout=timeout_seconds + 30,
        )
        result = response.json()
        expect(
            response.status == 200 and isinstance(result, dict),
            f"POST /execute answered HTTP {response.status}: {short(result)}",
        )
        expect(
            isinstance(result.get("stdout"), str)
            and isinstance(result.get("stderr"), str)
            and isinstance(result.get("exit_code"), int),
            f"POST /execute: expected stdout, stderr, exit_code; got {short(result)}",
        )
        return result

    def python(self, code: str, *args: str, **kwargs: Any) -> dict[str, Any]:
        return self.execute(["python3", "-c", code, *args], **kwargs)

    def python_json(self, code: str, *args: str) -> Any:
        result = self.python(code, *args)
        expect(
            result["exit_code"] == 0,
            f"python3 exited {result['exit_code']}: {short(result['stderr'][-400:])}",
        )
        try:
            return json.loads(result["stdout"])
        except ValueError:
            raise CheckFailed(f"unexpected output: {short(result['stdout'])}") from None

    def upload(self, destination: str, content: bytes) -> Response:
        boundary = f"bsi-{uuid.uuid4().hex}"
        name = destination.replace("\\", "\\\\").replace('"', '\\"')
        head = (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="file"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        body = head.encode() + content + f"\r\n--{boundary}--\r\n".encode()
        return self.request(
            "POST", "/upload", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        )


def encoded(path: str) -> str:
    """A workspace path as the upstream client sends it: percent-encoded, `/` as %2F."""
    return quote(path, safe="")


# --- the contract checks -----------------------------------------------------------------


def check_execute(sandbox: Sandbox) -> str:
    result = sandbox.execute("echo hello sandbox")
    expect(
        result["exit_code"] == 0 and result["stdout"] == "hello sandbox\n",
        f"`echo hello sandbox` gave exit_code {result['exit_code']},"
        f" stdout {short(result['stdout'])}",
    )
    return "`echo hello sandbox` -> exit 0, stdout 'hello sandbox'"


def check_exit_code(sandbox: Sandbox) -> str:
    result = sandbox.execute(["sh", "-c", "exit 7"])
    expect(result["exit_code"] == 7, f"`sh -c 'exit 7'` gave exit_code {result['exit_code']}")
    return "`sh -c 'exit 7'` -> 7"


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
    uid = sandbox.execute(["id", "-u"])
    gid = sandbox.execute(["id", "-g"])
    found = f"uid {uid['stdout'].strip() or '?'}, gid {gid['stdout'].strip() or '?'}"
    expect(
        uid["stdout"].strip() == str(SANDBOX_UID) and gid["stdout"].strip() == str(SANDBOX_UID),
        f"commands run as {found}, expected {SANDBOX_UID}:{SANDBOX_UID}",
    )
    return f"commands run as {found}"


PYTHONPATH_SCRIPT = """
import json, os, sys
print(json.dumps({"env": os.environ.get("PYTHONPATH"), "path": sys.path}))
"""


def check_pythonpath(sandbox: Sandbox) -> str:
    seen = sandbox.python_json(PYTHONPATH_SCRIPT)
    value = seen.get("env")
    expect(value is not None, "commands see no PYTHONPATH")
    expect(DEPS in value.split(":"), f"PYTHONPATH={value} does not include {DEPS}")
    expect(DEPS in seen.get("path", []), f"{DEPS} is not on the commands' sys.path")
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
    seen = sandbox.python_json(WRITABLE_SCRIPT, path)
    if not seen.get("present"):
        expect(not required, f"{path} does not exist")
        return f"{path} not present"
    count = seen.get("writable_count", 0)
    expect(
        count == 0,
        f"{count} entries in {path} are writable by uid {SANDBOX_UID},"
        f" e.g. {', '.join(seen.get('writable', []))}",
    )
    return f"{path}: none of {seen.get('entries')} entries writable by uid {SANDBOX_UID}"


def check_app_deps(sandbox: Sandbox) -> str:
    return _readonly(sandbox, DEPS, required=True)


def check_deps_extra(sandbox: Sandbox) -> str:
    return _readonly(sandbox, DEPS_EXTRA, required=False)


ENV_SCRIPT = """
import json, os
print(json.dumps({k: os.environ.get(k) for k in ("BSI_VERIFY", "PYTHONPATH")}))
"""


def check_env(sandbox: Sandbox) -> str:
    value = "a value with spaces, $HOME and 'quotes'"
    result = sandbox.python(ENV_SCRIPT, env={"BSI_VERIFY": value})
    expect(result["exit_code"] == 0, f"python3 exited {result['exit_code']}")
    seen = json.loads(result["stdout"] or "{}")
    expect(
        seen.get("BSI_VERIFY") == value, f"BSI_VERIFY arrived as {short(seen.get('BSI_VERIFY'))}"
    )
    expect(
        DEPS in (seen.get("PYTHONPATH") or "").split(":"),
        f"with env given, PYTHONPATH became {short(seen.get('PYTHONPATH'))}: env replaced the"
        " server's environment instead of being merged over it",
    )
    return "env passed to the command and merged over the server's (PYTHONPATH kept)"


CWD_SCRIPT = "import os; print(os.getcwd())"


def check_cwd(sandbox: Sandbox) -> str:
    directory = f"bsi-verify-cwd-{uuid.uuid4().hex[:8]}/sub dir"
    made = sandbox.execute(["mkdir", "-p", f"{WORKSPACE}/{directory}"])
    expect(made["exit_code"] == 0, f"mkdir in {WORKSPACE} failed: {short(made['stderr'])}")
    default = sandbox.python(CWD_SCRIPT)["stdout"].strip()
    expect(default == WORKSPACE, f"default cwd is {short(default)}, expected {WORKSPACE}")
    given = sandbox.python(CWD_SCRIPT, cwd=directory)["stdout"].strip()
    expect(
        given == f"{WORKSPACE}/{directory}",
        f"cwd {directory!r} ran in {short(given)}, expected {WORKSPACE}/{directory}",
    )
    sandbox.execute(["rm", "-rf", f"{WORKSPACE}/{directory.split('/')[0]}"])
    return f"default {WORKSPACE}; cwd {directory!r} -> {given}"


def check_files(sandbox: Sandbox) -> str:
    top = f"bsi-verify-{uuid.uuid4().hex[:8]}"
    folder = f"{top}/nested dir"
    path = f"{folder}/data.bin"
    content = os.urandom(4096) + b"\x00\xff\r\n--not-a-boundary\r\n"
    response = sandbox.upload(path, content)
    expect(
        response.status == 200, f"upload {path!r}: HTTP {response.status} {short(response.body)}"
    )

    response = sandbox.request("GET", f"/list/{encoded(folder)}")
    listing = response.json()
    expect(response.status == 200, f"list {folder!r}: HTTP {response.status} {short(listing)}")
    expect(isinstance(listing, list), f"list {folder!r} is not a JSON array: {short(listing)}")
    entry = next((e for e in listing if isinstance(e, dict) and e.get("name") == "data.bin"), None)
    expect(entry is not None, f"list {folder!r} lacks the uploaded file: {short(listing)}")
    assert entry is not None
    expect(
        entry.get("size") == len(content) and entry.get("type") == "file" and "mod_time" in entry,
        f"list entry {short(entry)}: expected size {len(content)}, type file, mod_time",
    )
    response = sandbox.request("GET", f"/list/{encoded(top)}")
    kinds = {e.get("name"): e.get("type") for e in response.json() if isinstance(e, dict)}
    expect(kinds.get("nested dir") == "directory", f"list {top!r}: {short(kinds)}")

    response = sandbox.request("GET", f"/exists/{encoded(path)}")
    found = response.json()
    expect(
        response.status == 200 and isinstance(found, dict) and found.get("exists") is True,
        f"exists {path!r}: HTTP {response.status} {short(found)}",
    )
    response = sandbox.request("GET", f"/download/{encoded(path)}")
    expect(response.status == 200, f"download {path!r}: HTTP {response.status}")
    expect(
        response.body == content,
        f"download {path!r}: {len(response.body)} bytes differ from the {len(content)} uploaded",
    )
    response = sandbox.request("DELETE", f"/files/{encoded(path)}")
    expect(200 <= response.status < 300, f"delete {path!r}: HTTP {response.status}")
    response = sandbox.request("GET", f"/exists/{encoded(path)}")
    gone = response.json()
    expect(
        response.status == 200 and isinstance(gone, dict) and gone.get("exists") is False,
        f"after delete, exists {path!r}: HTTP {response.status} {short(gone)}",
    )
    missing = sandbox.request("GET", f"/download/{encoded(path)}").status
    expect(missing == 404, f"download of a deleted file: HTTP {missing}, expected 404")
    sandbox.request("DELETE", f"/files/{encoded(top)}")
    return f"{len(content)} bytes: upload, list, exists, download, delete, 404 after delete"


LINK = "bsi-verify-escape"
HOSTILE_PATHS = (
    "..%2F..%2F..%2Fetc%2Fpasswd",
    "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
    "../../etc/passwd",
    "sub%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "%2Fetc%2Fpasswd",
    "/etc/passwd",
    "%2Ftmp",
    f"{LINK}%2Fpasswd",
    f"{LINK}%2F..%2Fpasswd",
    "passwd%00.txt",
)
HOSTILE_UPLOADS = (
    "../bsi-escape.txt",
    "../tmp/bsi-escape.txt",
    "/tmp/bsi-escape.txt",
    f"{LINK}/bsi-escape.txt",
    "a/../../tmp/bsi-escape.txt",
)
ESCAPE_PROBE = """
import json, os
print(json.dumps([p for p in ("/tmp/bsi-escape.txt", "/bsi-escape.txt", "/etc/bsi-escape.txt")
                  if os.path.lexists(p)]))
"""


def check_traversal(sandbox: Sandbox) -> str:
    made = sandbox.execute(["ln", "-sfn", "/etc", f"{WORKSPACE}/{LINK}"])
    expect(made["exit_code"] == 0, f"could not create a symlink in {WORKSPACE}: {made['stderr']}")
    bad: list[str] = []
    probes = 0
    for raw in HOSTILE_PATHS:
        for method, route in (
            ("GET", "download"),
            ("GET", "list"),
            ("GET", "exists"),
            ("DELETE", "files"),
        ):
            probes += 1
            response = sandbox.request(method, f"/{route}/{raw}")
            if response.status != 403:
                bad.append(f"{method} /{route}/{raw} -> {response.status}")
    for name in HOSTILE_UPLOADS:
        probes += 1
        response = sandbox.upload(name, b"escaped\n")
        if response.status != 403:
            bad.append(f"upload {name!r} -> {response.status}")
    escaped = sandbox.python_json(ESCAPE_PROBE)
    sandbox.execute(["rm", "-f", f"{WORKSPACE}/{LINK}"])
    etc = sandbox.execute(["test", "-f", "/etc/passwd"])["exit_code"] == 0
    expect(not escaped, f"files written outside {WORKSPACE}: {', '.join(escaped)}")
    expect(etc, "/etc/passwd is gone after DELETE probes")
    expect(not bad, f"{len(bad)} of {probes} not refused with 403: {'; '.join(bad[:6])}")
    return f"{probes} hostile requests refused with 403, nothing written outside {WORKSPACE}"


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


def run_timeout(sandbox: Sandbox) -> tuple[dict[str, Any], float]:
    command = ["sh", "-c", f"sleep {SLEEP_SECONDS} & sleep {SLEEP_SECONDS} & sleep {SLEEP_SECONDS}"]
    started = time.monotonic()
    result = sandbox.execute(command, timeout_seconds=TIMEOUT_SECONDS)
    return result, time.monotonic() - started


def check_timeout(sandbox: Sandbox) -> str:
    result, elapsed = run_timeout(sandbox)
    expect(
        result["exit_code"] == 124,
        f"a command past timeout_seconds={TIMEOUT_SECONDS} answered exit_code"
        f" {result['exit_code']} after {elapsed:.1f}s, expected 124",
    )
    expect(
        elapsed < TIMEOUT_SECONDS + TIMEOUT_SLACK,
        f"timeout_seconds={TIMEOUT_SECONDS} answered only after {elapsed:.1f}s",
    )
    return f"timeout_seconds={TIMEOUT_SECONDS}: exit_code 124 after {elapsed:.1f}s"


def check_timeout_cleanup(sandbox: Sandbox) -> str:
    deadline = time.monotonic() + CLEANUP_WAIT
    while True:
        left = sandbox.python_json(LEFTOVER_SCRIPT, str(SLEEP_SECONDS - 1))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.25)
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
)


def run_check(name: str, function: Callable[[], str]) -> Check:
    try:
        return Check(name, True, function())
    except CheckFailed as failure:
        return Check(name, False, str(failure))
    except (OSError, http.client.HTTPException) as error:
        return Check(name, False, f"server did not answer: {type(error).__name__}: {error}")


def image_user_check(config_user: str) -> Check:
    user = config_user.strip()
    uid, _, gid = user.partition(":")
    if not user:
        return Check("image-user", False, "the image sets no USER: it runs as root")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        return Check(
            "image-user",
            False,
            f"User {user!r} is not numeric: runAsNonRoot cannot prove it is not root",
        )
    expected = str(SANDBOX_UID)
    if uid != expected or (gid and gid != expected):
        return Check("image-user", False, f"image runs as {user}, expected {expected}:{expected}")
    return Check("image-user", True, f"image config User is {user}")


# --- modules to import ---------------------------------------------------------------------

TOP_LEVEL_SCRIPT = """
import json, sys
from importlib import metadata

def top_level(dist):
    text = dist.read_text("top_level.txt")
    if text:
        return [line.strip() for line in text.splitlines() if line.strip()]
    names = []
    for file in dist.files or []:
        parts = file.parts
        if not parts or parts[0] == "..":
            continue
        head = parts[0]
        if len(parts) == 1:
            name, dot, suffix = head.partition(".")
            if suffix == "py" or (dot and (suffix.endswith(".so") or suffix.endswith(".pyd"))):
                names.append(name)
        elif parts[-1].endswith(".py") or ".so" in parts[-1]:
            names.append(head)
    return names

result = {}
for name in json.loads(sys.argv[1]):
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        result[name] = None
        continue
    result[name] = sorted(set(top_level(dist)))
print(json.dumps(result))
"""


def requirement_names(path: Path) -> list[str]:
    """Distribution names of a requirements file whose markers hold on the target."""
    from builder.analysis.requirements import read_requirements
    from builder.analysis.target import ARCHES, Target, shipped_profile

    requirements = read_requirements([path])
    environment = Target(shipped_profile(), (ARCHES["amd64"],)).marker_environment(ARCHES["amd64"])
    return list(dict.fromkeys(r.name for r in requirements.requirements if r.applies(environment)))


def importable(names: Iterable[str]) -> list[str]:
    return [
        name
        for name in names
        if name.isidentifier() and not name.startswith("__") and name not in SKIP_TOP_LEVEL
    ]


def modules_of(sandbox: Sandbox, distributions: Sequence[str]) -> tuple[list[str], list[Check]]:
    """Top-level modules of the distributions as installed in the image; a check per missing."""
    found = sandbox.python_json(TOP_LEVEL_SCRIPT, json.dumps(list(distributions)))
    modules: list[str] = []
    problems: list[Check] = []
    for name in distributions:
        tops = found.get(name)
        if tops is None:
            problems.append(
                Check(
                    f"installed {name}", False, "distribution not found on the commands' sys.path"
                )
            )
        elif not importable(tops):
            problems.append(Check(f"installed {name}", True, "installed; no top-level module"))
        else:
            modules += importable(tops)
    return list(dict.fromkeys(modules)), problems


def check_import(sandbox: Sandbox, module: str) -> str:
    code = (
        f"import importlib; m = importlib.import_module({module!r});"
        " print(getattr(m, '__file__', None) or '')"
    )
    result = sandbox.python(code)
    expect(
        result["exit_code"] == 0,
        f"import {module} failed (exit {result['exit_code']}): {last_line(result['stderr'])}",
    )
    return f"import {module} ({short(result['stdout'].strip(), 80) or 'built-in'})"


def check_snippet(sandbox: Sandbox, snippet: str) -> str:
    result = sandbox.python(snippet)
    expect(
        result["exit_code"] == 0,
        f"exit {result['exit_code']}: {last_line(result['stderr'])}",
    )
    return f"python3 -c {short(snippet, 60)!r} -> exit 0"


# --- running the image -----------------------------------------------------------------------


def create_container(client: docker.DockerClient, image: str) -> Any:
    """Create `image` hardened, like the platform's pods: the caller starts and removes it."""
    return client.containers.create(
        image,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        user=f"{SANDBOX_UID}:{SANDBOX_UID}",
        tmpfs={
            WORKSPACE: f"rw,nosuid,nodev,size=256m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755",
            "/tmp": "rw,nosuid,nodev,size=256m,mode=1777",
        },
        # Loopback, any free host port: docker-py sends HostPort "" for a None port, but its
        # stubs allow only (address, int) tuples.
        ports={f"{PORT}/tcp": ("127.0.0.1", None)},  # type: ignore[dict-item]
        pids_limit=1024,
        labels={LABEL: "1"},
    )


def published_port(container: Any, deadline: float) -> int:
    while True:
        container.reload()
        bindings = (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(
            f"{PORT}/tcp"
        )
        for binding in bindings or []:
            if binding.get("HostPort"):
                return int(binding["HostPort"])
        if container.status == "exited" or time.monotonic() > deadline:
            raise CheckFailed(f"port {PORT} was not published (container {container.status})")
        time.sleep(0.1)


def wait_healthy(container: Any, sandbox: Sandbox, timeout: float) -> str:
    started = time.monotonic()
    last = "no answer"
    while time.monotonic() - started < timeout:
        try:
            response = sandbox.request("GET", "/", timeout=5)
            if response.status == 200:
                return f"GET / -> 200 after {time.monotonic() - started:.1f}s"
            last = f"GET / -> HTTP {response.status}"
        except (OSError, http.client.HTTPException) as error:
            last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        container.reload()
        if container.status in ("exited", "dead"):
            logs = container.logs(tail=5).decode("utf-8", "replace").strip()
            raise CheckFailed(f"the container exited ({short(logs, 300) or 'no output'})")
        time.sleep(0.2)
    raise CheckFailed(f"no 200 from GET / on port {PORT} within {timeout:.0f}s ({last})")


def verify_image(
    image: str,
    *,
    modules: Sequence[str] = (),
    checks: Sequence[str] = (),
    requirements: Path | None = None,
    client: docker.DockerClient | None = None,
    startup_timeout: float = STARTUP_TIMEOUT,
) -> VerifyReport:
    """Run `image` hardened and check the runtime contract, the imports and the snippets."""
    distributions = requirement_names(requirements) if requirements else []
    own_client = client is None
    client = client or engine_client()
    if client is None:
        raise UserError("Docker engine not reachable: verify runs the image on it")
    report = VerifyReport(image)
    container = None
    try:
        found = local_image(image, client)
        report.checks.append(image_user_check(found.attrs.get("Config", {}).get("User") or ""))
        try:
            container = create_container(client, image)
            container.start()
        except docker.errors.APIError as error:
            explanation = getattr(error, "explanation", None) or str(error)
            report.checks.append(
                Check("health", False, f"the container did not start: {explanation}")
            )
            return report
        try:
            sandbox = Sandbox(published_port(container, time.monotonic() + startup_timeout))
            report.checks.append(
                Check("health", True, wait_healthy(container, sandbox, startup_timeout))
            )
        except CheckFailed as failure:
            report.checks.append(Check("health", False, str(failure)))
            return report
        for name, function in CONTRACT:
            report.checks.append(run_check(name, partial(function, sandbox)))
        wanted = list(dict.fromkeys(modules))
        if distributions:
            try:
                derived, problems = modules_of(sandbox, distributions)
            except (CheckFailed, OSError, http.client.HTTPException) as error:
                derived, problems = [], [Check("requirements", False, f"cannot map: {error}")]
            report.checks += problems
            wanted += [module for module in derived if module not in wanted]
        for module in wanted:
            report.checks.append(
                run_check(f"import {module}", partial(check_import, sandbox, module))
            )
        for number, snippet in enumerate(checks, start=1):
            report.checks.append(
                run_check(f"check {number}", partial(check_snippet, sandbox, snippet))
            )
        report.checks.append(
            run_check("still-serving", lambda: wait_healthy(container, sandbox, 10))
        )
        return report
    finally:
        if container is not None:
            _remove(container)
        if own_client:
            client.close()


def _remove(container: Any) -> None:
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True, v=True)
