"""An HTTP client for the runtime contract, for one sandbox server on a host:port.

The verifier's checks and the tests speak to the server through it. It talks the contract's
wire format the way the platform's client does: file paths percent-encoded with `/` as %2F, and
uploads as multipart/form-data whose `file` field's filename is the destination path, encoded
as urllib3 2 (under the upstream SDK) encodes it. Never goes through a proxy.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, cast
from urllib.parse import quote

from builder import contract
from builder.verify.report import Check, CheckFailed, ContractViolation, expect, short

EXECUTE_TIMEOUT = 120.0  # seconds allowed to one ordinary command (imports of big libraries)
# Under qemu, as for the server's start (60 s, 240 s emulated): a big set's imports take
# several times longer (lightgbm's: 48 s emulated on an idle machine, over 120 s on a busy one)
EMULATED_EXECUTE_TIMEOUT = 480.0
REQUEST_TIMEOUT = 30.0
HTTP_SLACK = 30.0  # how much longer than timeout_seconds an /execute reply may take


class ExecuteRequest(TypedDict):
    """The /execute request body, as the upstream client sends it."""

    command: str | list[str]
    timeout_seconds: float
    env: NotRequired[dict[str, str]]
    cwd: NotRequired[str]


class ExecuteReply(TypedDict):
    """The /execute reply the contract promises (`execute` checks the three it always has)."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: NotRequired[bool]
    truncated: NotRequired[dict[str, bool]]  # which of stdout and stderr were cut


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            text = short(self.body.decode("latin-1"))
            raise ContractViolation(f"HTTP {self.status}, not JSON: {text}") from None

    def object(self) -> dict[str, Any]:
        """The body as a JSON object; any other JSON is a contract violation, not a crash."""
        found = self.json()
        if not isinstance(found, dict):
            raise ContractViolation(f"HTTP {self.status}, not a JSON object: {short(found)}")
        return found


def encoded(path: str) -> str:
    """A workspace path as the upstream client sends it: percent-encoded, `/` as %2F."""
    return quote(path, safe="")


def multipart_filename(path: str) -> str:
    """`path` as a quoted multipart filename, encoded as urllib3 2 does for the upstream SDK.

    A quote becomes %22 (the server takes quoted values literally and refuses backslashes, so
    backslash-escaping would break the name); control characters are refused, as the SDK does.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise ValueError(f"upload path contains a control character: {path!r}")
    return path.replace('"', "%22")


@dataclass(frozen=True)
class Machine:
    """Whether the server runs under emulation, and how that was decided, for the report.

    Decided from architectures, never from timing: on a loaded machine a native server starts
    Pythons as slowly as an emulated one, and must still meet the native bounds.
    """

    emulated: bool
    why: str

    def __str__(self) -> str:
        return f"{'emulated' if self.emulated else 'native'}: {self.why}"


LOCAL_PROCESS = Machine(False, "the server runs as a local process")


class Sandbox:
    """One sandbox server: `host`:`port`, rooted at `workspace` (the contract's, unless a test
    runs the server elsewhere), running natively unless `machine` says otherwise."""

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        workspace: str = contract.WORKSPACE,
        machine: Machine = LOCAL_PROCESS,
    ) -> None:
        self.host = host
        self.port = port
        self.workspace = workspace
        self.machine = machine

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Response:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return Response(response.status, response.read())
        finally:
            connection.close()

    def health(self, timeout: float = REQUEST_TIMEOUT) -> Response:
        return self.request("GET", contract.HEALTH, timeout=timeout)

    def execute(
        self,
        command: str | Sequence[str],
        *,
        timeout_seconds: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecuteReply:
        """The /execute reply; a reply without stdout, stderr and exit_code is a violation.

        `timeout_seconds`: None gives an ordinary command's, EXECUTE_TIMEOUT natively and
        EMULATED_EXECUTE_TIMEOUT when the machine runs the sandbox emulated (decided from the
        arches, as every bound that emulation widens)."""
        if timeout_seconds is None:
            emulated = self.machine.emulated
            timeout_seconds = EMULATED_EXECUTE_TIMEOUT if emulated else EXECUTE_TIMEOUT
        payload = ExecuteRequest(
            command=command if isinstance(command, str) else list(command),
            timeout_seconds=timeout_seconds,
        )
        if env is not None:
            payload["env"] = env
        if cwd is not None:
            payload["cwd"] = cwd
        response = self.request(
            "POST",
            contract.EXECUTE,
            json.dumps(payload).encode(),
            {"Content-Type": "application/json"},
            timeout=timeout_seconds + HTTP_SLACK,
        )
        result = response.json()
        if response.status != 200 or not isinstance(result, dict):
            raise ContractViolation(
                f"POST {contract.EXECUTE} answered HTTP {response.status}: {short(result)}"
            )
        if not (
            isinstance(result.get("stdout"), str)
            and isinstance(result.get("stderr"), str)
            and isinstance(result.get("exit_code"), int)
        ):
            raise ContractViolation(
                f"POST {contract.EXECUTE}: expected stdout, stderr, exit_code; got {short(result)}"
            )
        return cast(ExecuteReply, result)  # its three fields checked above

    def python(self, code: str, *args: str, **kwargs: Any) -> ExecuteReply:
        """`python3 -c code args...`, as the platform submits code."""
        return self.execute(["python3", "-c", code, *args], **kwargs)

    def upload(self, destination: str, content: bytes) -> Response:
        boundary = f"bsi-{uuid.uuid4().hex}"
        head = (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="{contract.UPLOAD_FIELD}";'
            f' filename="{multipart_filename(destination)}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        body = head.encode() + content + f"\r\n--{boundary}--\r\n".encode()
        content_type = f"multipart/form-data; boundary={boundary}"
        return self.request("POST", contract.UPLOAD, body, {"Content-Type": content_type})

    def download(self, path: str) -> Response:
        return self.request("GET", contract.DOWNLOAD + encoded(path))

    def list(self, path: str) -> Response:
        return self.request("GET", contract.LIST + encoded(path))

    def exists(self, path: str) -> Response:
        return self.request("GET", contract.EXISTS + encoded(path))

    def delete(self, path: str) -> Response:
        return self.request("DELETE", contract.FILES + encoded(path))


def python_json(sandbox: Sandbox, code: str, *args: str, **kwargs: Any) -> Any:
    """What `python3 -c code` printed as JSON; a failing script fails the check."""
    result = sandbox.python(code, *args, **kwargs)
    expect(
        result["exit_code"] == 0,
        f"python3 exited {result['exit_code']}: {short(result['stderr'][-400:])}",
    )
    try:
        return json.loads(result["stdout"])
    except ValueError:
        raise CheckFailed(f"unexpected output: {short(result['stdout'])}") from None


def run_check(
    name: str,
    function: Callable[[], str],
    client_errors: tuple[type[Exception], ...] = (),
) -> Check:
    """Run one check: its detail on success, the reason on failure.

    `client_errors` are what a third-party client raises when the server misbehaves (the SDK's
    request errors); they fail the check instead of ending the run.
    """
    try:
        return Check(name, True, function())
    except ContractViolation as failure:
        return Check(name, False, str(failure))
    except (OSError, http.client.HTTPException) as error:
        return Check(name, False, f"server did not answer: {type(error).__name__}: {error}")
    except client_errors as error:
        return Check(name, False, f"{type(error).__name__}: {short(str(error), 300)}")
    except (LookupError, TypeError, AttributeError, ValueError) as error:
        # JSON of a shape no check foresaw: this check fails, the report goes on.
        return Check(
            name, False, f"unexpected answer ({type(error).__name__}: {short(str(error))})"
        )
