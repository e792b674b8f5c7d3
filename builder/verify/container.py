"""Run an image the way the platform runs it, for as long as the checks need it.

Read-only root filesystem, all capabilities dropped, no-new-privileges, uid/gid 65532, tmpfs
/workspace (owned by 65532) and /tmp, the contract's port published on 127.0.0.1 only (on a
tcp:// engine on another host, on the address its URL's publish= accepts:
builder.engines.per_arch). The container is always removed, whatever happens. Whether it runs
emulated follows from its image's architecture and the engine's (both in Docker's terms: amd64,
arm64), never from timing.
"""

from __future__ import annotations

import contextlib
import http.client
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from builder import contract
from builder.engines.connection import LOOPBACK, Engine, runs_emulated
from builder.verify.client import Machine, Sandbox
from builder.verify.report import Check, CheckFailed, short

STARTUP_TIMEOUT = 60.0  # seconds for a native image's server to answer GET /
EMULATED_STARTUP_TIMEOUT = 240.0  # under qemu, Python starts several times slower
LABEL = "org.build-sandbox-image.verify"  # on every verify container, to find strays
TMPFS_OPTIONS = "rw,nosuid,nodev,size=256m"


def create_container(client: docker.DockerClient, image: str, address: str = LOOPBACK) -> Any:
    """Create `image` hardened, like the platform's pods: the caller starts and removes it.

    Its port is published on `address` of the engine's host only: loopback, unless the engine
    is a tcp:// one on another host whose URL accepts an address with publish=."""
    owner = f"uid={contract.SANDBOX_UID},gid={contract.SANDBOX_GID}"
    return client.containers.create(
        image,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        user=contract.SANDBOX_USER,
        tmpfs={
            contract.WORKSPACE: f"{TMPFS_OPTIONS},{owner},mode=0755",
            "/tmp": f"{TMPFS_OPTIONS},mode=1777",
        },
        # Loopback, any free host port: docker-py sends HostPort "" for a None port, but its
        # stubs allow only (address, int) tuples.
        ports={f"{contract.PORT}/tcp": (address, None)},  # type: ignore[dict-item]
        pids_limit=1024,
        labels={LABEL: "1"},
    )


def published_port(container: Any, deadline: float) -> int:
    while True:
        container.reload()
        ports = container.attrs.get("NetworkSettings", {}).get("Ports") or {}
        for binding in ports.get(f"{contract.PORT}/tcp") or []:
            if binding.get("HostPort"):
                return int(binding["HostPort"])
        if container.status == "exited" or time.monotonic() > deadline:
            raise CheckFailed(
                f"port {contract.PORT} was not published (container {container.status})"
            )
        time.sleep(0.1)


def wait_healthy(container: Any, sandbox: Sandbox, timeout: float) -> str:
    """Wait for GET / -> 200 while the container runs; the detail says how long it took."""
    started = time.monotonic()
    last = "no answer"
    while time.monotonic() - started < timeout:
        try:
            response = sandbox.health(timeout=5)
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
    raise CheckFailed(f"no 200 from GET / on port {contract.PORT} within {timeout:g}s ({last})")


def machine_of(native: str | None, arch: str) -> Machine:
    """How an `arch` image runs on an engine whose own arch is `native` (`Engine.native`):
    `runs_emulated` decides, and the machine says which arches it compared."""
    if not (arch and native):
        return Machine(False, f"{arch or 'unnamed'} image, {native or 'unnamed'} engine")
    return Machine(runs_emulated(native, arch), f"{arch} image on an {native} engine")


def confirmed(native: str | None, sandbox: Sandbox) -> Machine:
    """The sandbox's machine, emulated only when its kernel too (`uname -m`) names an arch
    other than the engine's: an image config may claim any arch, and a mislabelled native
    image must keep the native flood and RSS bound."""
    machine = sandbox.machine
    if not machine.emulated:
        return machine
    result = sandbox.execute(["uname", "-m"])
    kernel = result["stdout"].strip() if result["exit_code"] == 0 else ""
    if runs_emulated(native, kernel):
        return machine
    return Machine(False, f"{machine.why}, but its kernel runs {short(kernel) or 'unnamed'}")


def startup_timeout_for(machine: Machine, explicit: float | None = None) -> float:
    """The caller's timeout when it gave one, else the bound for how `machine` runs the image."""
    if explicit is not None:
        return explicit
    return EMULATED_STARTUP_TIMEOUT if machine.emulated else STARTUP_TIMEOUT


@dataclass(frozen=True)
class Running:
    """A hardened container that answered its health check, and a client for it; the engine
    running it and the image's name there (a permissive run of the same image compares)."""

    container: Any
    sandbox: Sandbox
    health: str  # how the health check went, for the report
    engine: Engine
    image: str

    def still_serving(self) -> str:
        return wait_healthy(self.container, self.sandbox, 10)


@contextlib.contextmanager
def hardened(engine: Engine, image: str, startup_timeout: float | None = None) -> Iterator[Running]:
    """Start `image` hardened on `engine` and wait until it serves; CheckFailed says why not.

    Without `startup_timeout` the wait follows the machine: longer for an emulated image. The
    sandbox is reached where the engine publishes its port (`Engine.reach`).
    """
    client = engine.client
    container = None
    try:
        try:
            container = create_container(client, image, engine.publish_address)
            container.start()
        except docker.errors.APIError as error:
            explanation = getattr(error, "explanation", None) or str(error)
            raise CheckFailed(f"the container did not start: {explanation}") from None
        machine = machine_of(engine.native, str(container.image.attrs.get("Architecture") or ""))
        timeout = startup_timeout_for(machine, startup_timeout)
        port = published_port(container, time.monotonic() + timeout)
        with engine.reach(port) as (host, reached):
            sandbox = Sandbox(reached, host=host, machine=machine)
            health = wait_healthy(container, sandbox, timeout)
            sandbox.machine = confirmed(engine.native, sandbox)
            health = f"{health} (limit {timeout:g}s; {sandbox.machine})"
            yield Running(container, sandbox, health, engine, image)
    finally:
        if container is not None:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)


def image_user_check(config_user: str) -> Check:
    """The image config's User must be numeric 65532 so runAsNonRoot can prove it."""
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
    if uid != str(contract.SANDBOX_UID) or (gid and gid != str(contract.SANDBOX_GID)):
        return Check("image-user", False, f"image runs as {user}, expected {contract.SANDBOX_USER}")
    return Check("image-user", True, f"image config User is {user}")
