"""The platform's own client against the image: the upstream agent-sandbox SDK's round trip.

The platform talks to sandboxes through the `k8s-agent-sandbox` SDK, whose legacy runtime mode
speaks this contract. Through its direct connection (`SandboxDirectConnectionConfig(api_url=)`,
`CommandExecutor`, `Filesystem`) the group runs a command, `python3 -c`, a timeout (exit 124 and
`timed_out` true), a write/read round trip with spaces and unicode in the names, a listing and
exists for a present and a missing path. The SDK is optional (the test extras pin it): without
it the group is one line saying so. Its `delete` is sandboxd-only, so cleanup uses our client.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from builder import contract
from builder.verify.client import Sandbox, run_check
from builder.verify.report import Check, expect, short

if TYPE_CHECKING:
    from k8s_agent_sandbox.commands.command_executor import CommandExecutor
    from k8s_agent_sandbox.connector import SandboxConnector
    from k8s_agent_sandbox.files.filesystem import Filesystem

DISTRIBUTION = "k8s-agent-sandbox"
TIMEOUT_SECONDS = 2
TIMEOUT_SLACK = 20.0
# What the SDK raises when the server misbehaves: its SandboxError family (RuntimeErrors, as
# are its "invalid result format" errors) and pydantic's validation errors (ValueErrors).
SDK_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ValueError)


def sdk_installed() -> bool:
    return importlib.util.find_spec("k8s_agent_sandbox") is not None


@dataclass(frozen=True)
class SdkClient:
    """The SDK's command and file clients on one direct connection."""

    connector: SandboxConnector
    commands: CommandExecutor
    files: Filesystem

    def close(self) -> None:
        self.connector.close()
        self.connector.session.close()


def sdk_client(api_url: str) -> SdkClient:
    """The SDK's direct connection to `api_url`, as an operator would build it (no cluster)."""
    from k8s_agent_sandbox.commands.command_executor import CommandExecutor
    from k8s_agent_sandbox.connector import SandboxConnector
    from k8s_agent_sandbox.files.filesystem import Filesystem
    from k8s_agent_sandbox.k8s_helper import K8sHelper
    from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
    from kubernetes.client import ApiClient

    connector = SandboxConnector(
        sandbox_id="bsi-verify",
        namespace="default",
        connection_config=SandboxDirectConnectionConfig(api_url=api_url, server_port=contract.PORT),
        # Only discovery strategies use the cluster; an explicit client keeps it from loading
        # a kubeconfig.
        k8s_helper=K8sHelper(api_client=ApiClient()),
    )
    service = "bsi-verify"
    return SdkClient(
        connector, CommandExecutor(connector, None, service), Filesystem(connector, None, service)
    )


class RoundTrip:
    """The SDK round trip against one server; each method is one line of the report."""

    def __init__(self, sdk: SdkClient) -> None:
        self.sdk = sdk
        self.top = f"bsi-sdk-{uuid.uuid4().hex[:8]}"
        self.folder = f"{self.top}/dir with spaces é"
        self.path = f"{self.folder}/données €.bin"
        self.content = "héllo wörld\n".encode() + os.urandom(8192) + b"\r\n--x--\r\n"

    def run(self) -> str:
        result = self.sdk.commands.run("echo hello sdk")
        expect(
            (result.exit_code, result.stdout, result.timed_out) == (0, "hello sdk\n", False),
            f"`echo hello sdk` gave {short(result.model_dump())}",
        )
        return "commands.run('echo hello sdk') -> exit 0, stdout 'hello sdk', timed_out false"

    def python3(self) -> str:
        result = self.sdk.commands.run('python3 -c "print(6 * 7)"')
        expect(
            result.exit_code == 0 and result.stdout.strip() == "42",
            f"python3 -c gave {short(result.model_dump())}",
        )
        return "commands.run('python3 -c \"print(6 * 7)\"') -> 42"

    def timeout(self) -> str:
        started = time.monotonic()
        result = self.sdk.commands.run("sleep 600", command_timeout=TIMEOUT_SECONDS)
        elapsed = time.monotonic() - started
        expect(
            result.exit_code == contract.TIMEOUT_EXIT_CODE and result.timed_out is True,
            f"command_timeout={TIMEOUT_SECONDS}: exit_code {result.exit_code}, timed_out"
            f" {result.timed_out}; expected {contract.TIMEOUT_EXIT_CODE} and true",
        )
        expect(
            elapsed < TIMEOUT_SECONDS + TIMEOUT_SLACK,
            f"command_timeout={TIMEOUT_SECONDS} answered only after {elapsed:.1f}s",
        )
        return (
            f"command_timeout={TIMEOUT_SECONDS} -> exit {contract.TIMEOUT_EXIT_CODE},"
            f" timed_out true after {elapsed:.1f}s"
        )

    def write_read(self) -> str:
        self.sdk.files.write(self.path, self.content)
        back = self.sdk.files.read(self.path)
        expect(
            back == self.content,
            f"read {self.path!r}: {len(back)} bytes differ from the {len(self.content)} written",
        )
        return f"files.write/read {self.path!r}: {len(self.content)} bytes back intact"

    def listing(self) -> str:
        entries = self.sdk.files.list(self.folder)
        name = self.path.rsplit("/", 1)[1]
        entry = next((e for e in entries if e.name == name), None)
        expect(entry is not None, f"list {self.folder!r} lacks {name!r}: {short(entries)}")
        assert entry is not None
        expect(
            (entry.type, entry.size) == ("file", len(self.content)),
            f"list entry {short(entry.model_dump())}: expected a file of {len(self.content)} bytes",
        )
        kinds = {e.name: e.type for e in self.sdk.files.list(self.top)}
        folder = self.folder.rsplit("/", 1)[1]
        expect(kinds.get(folder) == "directory", f"list {self.top!r}: {short(kinds)}")
        return f"files.list: {name!r} a file of {entry.size} bytes, {folder!r} a directory"

    def exists(self) -> str:
        missing = f"{self.folder}/missing.txt"
        present, absent = self.sdk.files.exists(self.path), self.sdk.files.exists(missing)
        expect(
            (present, absent) == (True, False),
            f"files.exists: {present} for the written file, {absent} for a missing one",
        )
        return "files.exists: true for the written file, false for a missing one"


def sdk_checks(sandbox: Sandbox, required: bool = False) -> list[Check]:
    """The SDK round trip against `sandbox`'s server, one check per step.

    Without the SDK: nothing, or when `required` one failing line saying how to install it.
    """
    if not sdk_installed():
        detail = f"the {DISTRIBUTION} SDK is not installed (pip install {DISTRIBUTION})"
        return [Check("sdk", False, detail)] if required else []
    sdk = sdk_client(f"http://{sandbox.host}:{sandbox.port}")
    trip = RoundTrip(sdk)
    steps: list[tuple[str, Callable[[], str]]] = [
        ("sdk run", trip.run),
        ("sdk python3", trip.python3),
        ("sdk timeout", trip.timeout),
        ("sdk write-read", trip.write_read),
        ("sdk list", trip.listing),
        ("sdk exists", trip.exists),
    ]
    try:
        return [run_check(name, step, SDK_ERRORS) for name, step in steps]
    finally:
        with contextlib.suppress(OSError, http.client.HTTPException):
            sandbox.delete(trip.top)
        sdk.close()
