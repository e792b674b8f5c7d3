"""Container engines: the local one found quickly or not at all, one an arch was given
(`EngineURL`, `Engine`), image lookup, and an exec's output read back.

An `Engine` is a client plus what the rest of the run needs to know about where it is: the
environment that points the docker CLI (BuildKit) at it, and how a verification reaches a
sandbox port it publishes. The local engine (DOCKER_HOST, or Docker's default socket) has an
empty environment, so a run without per-arch engines is exactly what it always was.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import docker.constants
import docker.errors
import docker.tls

from builder.credentials import engine_auth, registry
from builder.errors import RegistryError, RegistryNotFound, UserError
from builder.oci.name import ImageRef
from builder.oci.v1 import MACHINES, Platform
from builder.reporter import QUIET, Reporter
from builder.retry import Retries

RECEIVE = 1 << 20  # bytes per read of an exec's output
FRAME_HEADER = 8  # an exec stream frame's: stream kind, three zero bytes, big-endian size
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
PING_TIMEOUT = 3  # seconds: an absent engine must not stall an offline plan
API_TIMEOUT = 300


def engine_client() -> docker.DockerClient | None:
    """A client on the local engine, or None at once when none answers (plan offline instead)."""
    base_url = os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    try:
        client = docker.DockerClient(base_url=base_url, timeout=PING_TIMEOUT)
        client.ping()
    except Exception:  # any failure to connect means "no engine"; the caller falls back
        return None
    client.api.timeout = API_TIMEOUT  # pulls and probe containers need longer than a ping
    return client


SCHEMES = ("unix", "tcp", "ssh")  # DOCKER_HOST's forms the tool takes
CERT_FILES = ("ca.pem", "cert.pem", "key.pem")  # DOCKER_CERT_PATH's names
QUERY = ("certs", "publish")  # what a tcp:// URL's query may name
SSH_TIMEOUT = 5  # seconds for `ssh HOST true` to answer
LOOPBACK = "127.0.0.1"  # where a sandbox's port is published, unless the engine is elsewhere
FORWARD_TIMEOUT = 15.0  # seconds for an ssh forward to a sandbox port to accept


@dataclass(frozen=True)
class EngineURL:
    """An engine as DOCKER_HOST names it; for tcp://, TLS client certificates from `certs`.

    `certs` is a directory holding ca.pem, cert.pem and key.pem, as DOCKER_CERT_PATH does; with
    it the engine's certificate is verified against ca.pem (DOCKER_TLS_VERIFY=1). `publish` is
    the engine host's address a verification publishes the sandbox's port on, given by the
    operator because anyone who reaches it meanwhile can run commands in the sandbox (only a
    tcp:// engine on another host needs it: builder.engines.per_arch). Written as
    `tcp://HOST:PORT?certs=DIR&publish=ADDRESS`, the one form that fits a flag and a config value.
    """

    url: str  # what docker-py and the docker CLI are given: no query
    certs: Path | None = None
    publish: str | None = None  # tcp:// to another host: where verification publishes its port

    @classmethod
    def parse(cls, text: str, where: str, relative_to: Path = Path()) -> EngineURL:
        """Check `text`'s form; a relative certs= directory is relative to `relative_to`."""
        parts = urlsplit(text.strip())
        if parts.scheme not in SCHEMES:
            raise UserError(f"{where}: {text!r} is not a unix://, tcp:// or ssh:// URL")
        if parts.scheme == "unix" and (parts.netloc or not parts.path):
            raise UserError(f"{where}: {text!r} must be unix:///PATH (an absolute socket path)")
        if parts.scheme != "unix":
            try:
                port = parts.port
            except ValueError:
                raise UserError(f"{where}: {text!r} has no valid port") from None
            if not parts.hostname or (parts.path not in ("", "/")):
                raise UserError(f"{where}: {text!r} must be {parts.scheme}://HOST[:PORT]")
            if parts.scheme == "tcp" and port is None:
                raise UserError(f"{where}: {text!r} names no port (tcp://HOST:PORT)")
        pairs = (part.partition("=") for part in parts.query.split("&") if parts.query)
        found = {key: value for key, _, value in pairs}
        if found and (
            parts.scheme != "tcp" or not set(found) <= set(QUERY) or "" in found.values()
        ):
            raise UserError(
                f"{where}: {text!r}: only tcp:// takes a query, ?certs=DIR&publish=ADDRESS"
            )
        certs = relative_to / found["certs"] if "certs" in found else None
        if certs is not None:
            missing = [name for name in CERT_FILES if not (certs / name).is_file()]
            if missing:
                raise UserError(f"{where}: {certs} lacks {', '.join(missing)} for {text!r}")
        url = text.strip().split("?", 1)[0]  # urlunsplit would drop unix's //
        return cls(url, certs, found.get("publish"))

    @property
    def host(self) -> str:
        """The engine's host name or address ('' for unix://)."""
        return urlsplit(self.url).hostname or ""

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0]

    def tls(self) -> docker.tls.TLSConfig | None:
        """docker-py's TLS settings: the client certificate, the engine's CA verified."""
        if self.certs is None:
            return None
        return docker.tls.TLSConfig(
            client_cert=(str(self.certs / "cert.pem"), str(self.certs / "key.pem")),
            ca_cert=str(self.certs / "ca.pem"),
            verify=True,
        )

    def environment(self) -> dict[str, str]:
        """What points the docker CLI at this engine, as a user would export it."""
        found = {"DOCKER_HOST": self.url}
        if self.certs is not None:
            found |= {"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(self.certs)}
        return found

    def client(self, timeout: float) -> docker.DockerClient:
        """A client on the API version the engine speaks; ssh:// runs the ssh binary, as the
        CLI does.

        The environment's proxies and CA bundle are not used: requests lets REQUESTS_CA_BUNDLE
        replace the engine's ca.pem (psf/requests#3829), and an engine is no web site. An ssh://
        host is first asked to run `true` in batch mode: a host key to confirm or a password to
        type fails at once with ssh's own line, where docker-py's ssh would wait or prompt.
        """
        if self.scheme == "ssh":
            ssh_answers(self.url, min(timeout, SSH_TIMEOUT))
        asking = self._client(docker.constants.MINIMUM_DOCKER_API_VERSION, timeout)
        try:
            version = str(asking.version(api_version=False)["ApiVersion"])
        finally:
            asking.close()
        return self._client(version, timeout)

    def _client(self, version: str, timeout: float) -> docker.DockerClient:
        client = docker.DockerClient(
            base_url=self.url,
            version=version,
            timeout=int(timeout),
            tls=self.tls() or False,
            use_ssh_client=self.scheme == "ssh",
        )
        client.api.trust_env = False
        return client

    def __str__(self) -> str:
        query = [f"certs={self.certs}"] if self.certs else []
        query += [f"publish={self.publish}"] if self.publish else []
        return self.url + ("?" + "&".join(query) if query else "")


@dataclass(frozen=True)
class Engine:
    """One engine the run uses: its client, its own arch, and where it is (None: local)."""

    client: docker.DockerClient
    native: str | None  # amd64, arm64: what it runs without emulation
    url: EngineURL | None = None
    # The engine host's address a sandbox port is published on for this machine to reach:
    # loopback for a local socket and behind an ssh forward; for tcp:// the URL's host when it is
    # loopback, else the operator's publish= (both resolved once, by
    # builder.engines.per_arch.connect).
    publish_address: str = LOOPBACK

    @classmethod
    def local(cls, client: docker.DockerClient) -> Engine:
        return cls(client, native_arch(client))

    @property
    def environment(self) -> Mapping[str, str]:
        """Added to the docker CLI's environment: none for the local engine."""
        return self.url.environment() if self.url else {}

    @contextlib.contextmanager
    def reach(self, port: int) -> Iterator[tuple[str, int]]:
        """Where this machine connects to a port published on `publish_address`: directly,
        or for ssh:// through an `ssh -N -L` forward held open for the block."""
        if self.url is None or self.url.scheme != "ssh":
            yield self.publish_address, port
            return
        with ssh_forward(self.url.url, port) as local:
            yield LOOPBACK, local

    def __str__(self) -> str:
        return str(self.url) if self.url else "the local engine"


def ssh_destination(url: str) -> list[str]:
    """ssh's arguments naming an ssh:// URL's host: its port, then `--` and [user@]host."""
    parts = urlsplit(url)
    destination = f"{parts.username}@{parts.hostname}" if parts.username else str(parts.hostname)
    return [*(["-p", str(parts.port)] if parts.port else []), "--", destination]


def ssh_answers(url: str, timeout: float) -> None:
    """`ssh HOST true` in batch mode: UserError with ssh's last line when it does not."""
    command = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}"]
    try:
        done = subprocess.run(
            [*command, *ssh_destination(url), "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout + 1,
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"ssh: no answer within {timeout:g}s") from None
    except FileNotFoundError:
        raise UserError("ssh:// needs the ssh client on PATH") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise UserError(f"ssh: {lines[-1] if lines else f'exit status {done.returncode}'}")


@contextlib.contextmanager
def ssh_forward(url: str, port: int) -> Iterator[int]:
    """`ssh -N -L` from a free local port to the engine host's 127.0.0.1:`port`.

    Its stderr goes to a file, read only for the error line: a pipe nobody reads while the
    forward is open could fill and stall ssh."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        local = int(probe.getsockname()[1])
    command = ["ssh", "-N", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes"]
    command += ["-L", f"{LOOPBACK}:{local}:{LOOPBACK}:{port}"]
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen([*command, *ssh_destination(url)], stderr=errors, text=True)
        try:
            deadline = time.monotonic() + FORWARD_TIMEOUT
            while not _accepts(local):
                if process.poll() is not None or time.monotonic() > deadline:
                    errors.seek(0)
                    why = errors.read().strip() if process.poll() is not None else "timeout"
                    raise UserError(
                        f"ssh forward to {url} port {port} failed: {why or 'no output'}"
                    )
                time.sleep(0.1)
            yield local
        finally:
            process.terminate()
            process.wait()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=1).close()
    except OSError:
        return False
    return True


def native_arch(client: docker.DockerClient) -> str | None:
    """The engine's own arch (amd64, arm64): it builds and verifies without emulation."""
    native = Platform.of_machine(str(client.info().get("Architecture") or ""))
    return native.architecture if native else None


def runs_emulated(native: str | None, arch: str) -> bool:
    """Whether an engine whose own arch is `native` runs an `arch` image under emulation.

    The one rule the delivery (which arch starts first, what its line says) and verify (which
    bounds hold a sandbox) share. Arches compare as machines: a hand-written image config, or
    a kernel's `uname -m`, may say x86_64 or aarch64. An arch either side leaves unnamed
    counts as native, so the native bounds apply.
    """
    if not (native and arch):
        return False
    return MACHINES.get(arch, arch) != MACHINES.get(native, native)


def holds_image(client: docker.DockerClient, image_id: str) -> bool:
    """Whether the engine still has the image: a prune may have removed an untagged one that
    a cache record or an earlier step remembers."""
    try:
        client.api.inspect_image(image_id)
    except docker.errors.NotFound:
        return False
    return True


def image_architecture(ref: ImageRef) -> str:
    """The architecture `ref`'s image is for (Docker's name: amd64, arm64), as the local engine
    will run it (pulled as `local_image` does): what a verify plans the image's programs for."""
    client = engine_client()
    if client is None:
        raise UserError("Docker engine not reachable: verify runs the image on it")
    try:
        return str(local_image(ref, client).attrs.get("Architecture") or "")
    finally:
        client.close()


def local_image(
    ref: ImageRef,
    client: docker.DockerClient,
    reporter: Reporter = QUIET,
    retries: Retries | None = None,
) -> Any:
    """The image to probe: the local one, unless its registry now names something newer.

    A platform may re-push a tag; a long-lived runner holding the old image must not plan
    against it. Images without a registry host (local builds) are used as they are. The engine
    is asked for the reference as written: that is the name it holds the image under.

    The registry is asked through the tool's own client, so a fault is tried again as every
    registry request is (the engine's own request is made once): a 500 on that one request
    used to make a run silently take the engine's copy, with a digest the registry does not
    serve and layers the push could not mount. A registry that does not hold the reference
    (a name tagged here) leaves the local copy; one still failing after the retries does too,
    with a warning that says what it costs.
    """
    image = ref.as_written
    credentials = engine_auth(ref.registry)
    try:
        local = client.images.get(image)
    except docker.errors.ImageNotFound:
        local = None
    if local is not None:
        if ref.is_hub and not image.startswith(("docker.io/", "index.docker.io/")):
            return local
        try:
            remote = registry(ref, f"base image {image}", retries).head_manifest(ref.reference)
        except RegistryNotFound:
            return local  # a name only this engine holds
        except RegistryError as error:
            reporter.warn(
                f"{error}; using the engine's copy of the base as it is: it may be older than"
                " what the registry names now, and its digest and layers not the registry's"
                " (a push to its registry uploads them instead of mounting them)"
            )
            return local
        if remote and remote in held_digests(ref, local):
            return local
    try:
        return client.images.pull(image, auth_config=credentials)
    except docker.errors.DockerException as exc:
        raise UserError(
            f"base image {image}: not on the local engine and pulling it failed:"
            f" {failure_reason(exc)}"
        ) from None


def held_digests(ref: ImageRef, image: Any) -> list[str]:
    """The digests the engine recorded pulling or pushing `image` under `ref`'s very name (the
    same content under another name says nothing of what this name's registry serves)."""
    held = []
    for entry in image.attrs.get("RepoDigests") or []:
        try:
            pinned = ImageRef.parse(entry, "RepoDigests entry")
        except UserError:
            continue  # the engine's own bookkeeping: nothing the operator can act on
        if pinned.name == ref.name and pinned.digest:
            held.append(pinned.digest)
    return held


def failure_reason(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()


def demultiplexed(raw: Any) -> tuple[bytes, bytes]:
    """stdout and stderr of an exec's attached stream (no tty), read until the engine closes it.

    The engine frames each write as an 8-byte header (stream, size) and its bytes. Read in
    large chunks and split here: docker-py's frame iterator reads frame by frame and took 30 s
    for 60 MB of bytecode that this reads in about one.
    """
    received = bytearray()
    while chunk := raw.recv(RECEIVE):
        received += chunk
    streams = {1: bytearray(), 2: bytearray()}
    position = 0
    while position + FRAME_HEADER <= len(received):
        kind = received[position]
        size = int.from_bytes(received[position + 4 : position + FRAME_HEADER], "big")
        start = position + FRAME_HEADER
        streams.get(kind, streams[2]).extend(received[start : start + size])
        position = start + size
    return bytes(streams[1]), bytes(streams[2])
