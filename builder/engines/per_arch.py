"""Which engine does each arch's engine work: `--engine ARCH=URL` and the config's [engines].

The host runs what needs no engine (resolution, wheels, layers, pushes) and the probe of the
base; an arch named here has its system stage built, its image loaded and verified on its own
engine (natively when that engine's arch is the image's); an arch not named uses the local
engine, as a run without engines always has. Every named engine is asked for its version before
anything is built: one that does not answer within CONNECT_DEADLINE fails the run with one line
naming the arch and the URL.

A tcp:// engine on another host is taken only with TLS (?certs=: the builds carry registry
logins and apt secrets) and with the address its sandbox ports are published on given
(publish=: anyone who reaches that address during a verification can run commands in the
sandbox); ssh:// keeps both on ssh and the port on the engine host's loopback.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import docker

from builder.engines.connection import (
    API_TIMEOUT,
    LOOPBACK,
    Engine,
    EngineURL,
    failure_reason,
    native_arch,
)
from builder.errors import UserError
from builder.resolve.target import ARCHES

CONNECT_DEADLINE = 8.0  # seconds for every named engine to answer, together (< 10 s promised)


def parse_engine(text: str, where: str, relative_to: Path = Path()) -> tuple[str, EngineURL]:
    """`ARCH=URL`, as --engine gives it."""
    arch, separator, url = text.partition("=")
    if not separator:
        raise UserError(f"{where}: {text!r} is not ARCH=URL")
    arch = known_arch(arch.strip(), where)
    return arch, EngineURL.parse(url, f"{where} {arch}", relative_to)


def known_arch(arch: str, where: str) -> str:
    if arch not in ARCHES:
        raise UserError(f"{where}: unknown arch {arch!r} (choose from {', '.join(ARCHES)})")
    return arch


def engine_flags(values: Iterable[str]) -> dict[str, EngineURL]:
    """The --engine flags as arch -> URL; an arch given twice is refused."""
    found: dict[str, EngineURL] = {}
    for text in values:
        arch, url = parse_engine(text, "--engine")
        if arch in found:
            raise UserError(f"--engine: {arch} given twice ({found[arch]} and {url})")
        found[arch] = url
    return found


@dataclass(frozen=True)
class Engines:
    """arch -> the engine that builds, loads and verifies its image; the local one otherwise."""

    default: Engine
    named: Mapping[str, Engine] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def local(cls, client: docker.DockerClient) -> Engines:
        """Only the local engine: every arch on it, as a run without --engine."""
        return cls(Engine.local(client))

    def for_arch(self, arch: str) -> Engine:
        return self.named.get(arch, self.default)

    def compiling_client(self, arches: Sequence[str]) -> docker.DockerClient:
        """The client of the one engine that compiles the bytecode (any arch's serves all): one
        reached over a unix socket that runs a target arch natively, the local engine first;
        the local one when none does.

        Only a unix socket: the compile feeds its sources through an exec socket and half-closes
        it (SHUT_WR) for EOF, which docker-py's ssh socket cannot do and TLS turns into a close.
        """
        for engine in (self.default, *self.named.values()):
            reached = engine.url is None or engine.url.scheme == "unix"
            if reached and engine.native in arches:
                return engine.client
        return self.default.client

    def close(self) -> None:
        """Close the named engines' clients (the local one is its caller's)."""
        for engine in self.named.values():
            engine.client.close()

    def __enter__(self) -> Engines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def unheeded(urls: Mapping[str, EngineURL], no_build: bool, local_answers: bool) -> str | None:
    """Named engines a build will not use: with --no-build, the line saying so; with no local
    engine (it probes the base, so nothing could be built) the run is refused instead."""
    if not urls:
        return None
    named = ", ".join(f"{arch}={url}" for arch, url in urls.items())
    if no_build:
        return f"--engine/[engines] ignored ({named}): --no-build builds nothing"
    if not local_answers:
        raise UserError(
            f"engines named ({named}) but no local Docker engine answers: it probes the base"
            " before anything is built there (start it, or plan only with --no-build)"
        )
    return None


def publish_address(arch: str, url: EngineURL) -> str:
    """Where a verification on `url` publishes the sandbox's port, resolved once; a tcp://
    engine on another host without TLS, or without publish=, is refused (module docstring)."""
    if url.scheme != "tcp":
        return LOOPBACK  # unix: this machine; ssh: the engine host's, through a forward
    address = resolved(url.host, arch, url)
    if ipaddress.ip_address(address).is_loopback:
        return address
    if url.certs is None:
        raise UserError(
            f"engine for {arch} at {url}: plain tcp:// to another host would send registry and"
            " apt credentials in cleartext: add ?certs=DIR (TLS), or use ssh://"
        )
    if url.publish is None:
        raise UserError(
            f"engine for {arch} at {url}: verification would publish the sandbox's port (it runs"
            f" commands) on {url.host}'s routable address: use ssh:// (it stays on that host's"
            " loopback), or accept that with publish=ADDRESS"
        )
    return resolved(url.publish, arch, url)


def resolved(host: str, arch: str, url: EngineURL) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as error:
        raise UserError(f"engine for {arch} at {url}: cannot resolve {host}: {error}") from None


def connect(urls: Mapping[str, EngineURL], default: docker.DockerClient) -> Engines:
    """Every named engine, asked for its arch at once; the first that does not answer within
    CONNECT_DEADLINE is the one-line error, before anything is built (the clients of those
    that did answer are closed then, and any that answers later closes its own)."""
    addresses = {arch: publish_address(arch, url) for arch, url in urls.items()}
    found: dict[str, Engine | Exception] = {}
    abandoned = threading.Event()

    def one(arch: str, url: EngineURL) -> None:
        try:
            client = url.client(CONNECT_DEADLINE)
            native = native_arch(client)  # the engine's info: it answers, and says its arch
            client.api.timeout = API_TIMEOUT
            found[arch] = Engine(client, native, url, addresses[arch])
            if abandoned.is_set():
                client.close()
        except Exception as error:  # any failure to reach it is the user's to fix: named below
            found[arch] = error

    # Daemon threads: an ssh that hangs past the deadline must not hold the exit.
    threads = [threading.Thread(target=one, args=item, daemon=True) for item in urls.items()]
    deadline = time.monotonic() + CONNECT_DEADLINE
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    failed = [arch for arch in urls if not isinstance(found.get(arch), Engine)]
    if failed:
        abandoned.set()  # before reading `found`: a late answer closes its own client
        for answer in list(found.values()):
            if isinstance(answer, Engine):
                answer.client.close()
        arch, error = failed[0], found.get(failed[0])
        why = (
            failure_reason(error)
            if isinstance(error, Exception)
            else f"no answer within {CONNECT_DEADLINE:g}s"
        )
        raise UserError(f"engine for {arch} at {urls[arch]} not reachable: {why}")
    engines = {arch: answer for arch, answer in found.items() if isinstance(answer, Engine)}
    return Engines(Engine.local(default), MappingProxyType(engines))
