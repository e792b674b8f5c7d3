"""Which engine does each arch's engine work: `--engine ARCH=URL` and the config's [engines].

The host runs what needs no engine (resolution, wheels, layers, pushes) and the probe of the
base; an arch named here has its system stage built, its image loaded and verified on its own
engine (natively when that engine's arch is the image's); an arch not named uses the local
engine, as a run without engines always has. Every named engine is asked for its version before
anything is built: one that does not answer within CONNECT_DEADLINE fails the run with one line
naming the arch and the URL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import docker

from builder.analysis.target import ARCHES
from builder.engine import API_TIMEOUT, Engine, EngineURL, failure_reason, native_arch
from builder.errors import UserError

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

    def compiler(self, arches: Sequence[str]) -> docker.DockerClient:
        """The one engine that compiles the bytecode (any arch's serves all): one that runs a
        target arch natively, the local engine first; the local one when none does."""
        for engine in (self.default, *self.named.values()):
            if engine.native in arches:
                return engine.client
        return self.default.client


def connect(urls: Mapping[str, EngineURL], default: docker.DockerClient) -> Engines:
    """Every named engine, asked for its arch at once; the first that does not answer within
    CONNECT_DEADLINE is the one-line error, before anything is built."""
    found: dict[str, Engine | Exception] = {}

    def one(arch: str, url: EngineURL) -> None:
        try:
            client = url.client(CONNECT_DEADLINE)
            native = native_arch(client)  # the engine's info: it answers, and says its arch
            client.api.timeout = API_TIMEOUT
            found[arch] = Engine(client, native, url)
        except Exception as error:  # any failure to reach it is the user's to fix: named below
            found[arch] = error

    # Daemon threads: an ssh that hangs past the deadline must not hold the exit.
    threads = [threading.Thread(target=one, args=item, daemon=True) for item in urls.items()]
    deadline = time.monotonic() + CONNECT_DEADLINE
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    engines: dict[str, Engine] = {}
    for arch, url in urls.items():
        answer = found.get(arch)
        if not isinstance(answer, Engine):
            why = failure_reason(answer) if answer else f"no answer within {CONNECT_DEADLINE:g}s"
            raise UserError(f"engine for {arch} at {url} not reachable: {why}")
        engines[arch] = answer
    return Engines(Engine.local(default), MappingProxyType(engines))
