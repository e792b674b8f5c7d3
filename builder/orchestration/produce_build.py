"""The build path's producer: BuildKit builds each arch's system stage, the tool assembles.

ko-style: BuildKit builds only the Dockerfile's `system` stage (the base plus the apt layer),
started while the deps-extra layers are still being written (`SystemStages`); then
builder.assemble.assemble puts the extras layers on it and loads the result into the engine. Each
arch's stage is built, and its image loaded, on that arch's engine (builder.engines.per_arch);
the layers are written here, on the host, whichever engine takes them.
`BuildProducer.produce` makes one arch's image; builder.orchestration.delivery runs every arch
at once, verifies and writes them. The OCI value written is made from exactly the blobs the
engine was given (builder.assemble.from_engine), only when a push asks for it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import docker
import docker.errors

from builder.assemble.assemble import (
    Assembled,
    Assembly,
    assemble,
    preload,
    remove_provisional,
    system_layers,
)
from builder.assemble.build import BuildSpec, Log, base_logins, build_image, secret_arguments
from builder.assemble.from_engine import assembled_image, base_layers
from builder.assemble.saved import read_save, save_cached
from builder.base.platforms import offered_arches, select_arches
from builder.cache import Cache
from builder.context.render import Secrets, dockerfile
from builder.credentials import Credentials
from builder.engines.connection import holds_image
from builder.engines.per_arch import Engines
from builder.layers.extras import ExtrasLayer, LayerKind
from builder.layers.home import (
    distribution_names,
    image_env,
    seed_layer,
    seeds_of,
)
from builder.oci.client import RepositoryClient
from builder.oci.remote import Blobs
from builder.oci.v1 import Image
from builder.orchestration.delivery import Produced
from builder.orchestration.prepare import Finish
from builder.plan.plan import Plan
from builder.publish.state import Route
from builder.reporter import QUIET, Reporter
from builder.resolve.target import ARCHES, BaseProfile
from builder.retry import Retries

SYSTEM_STAGE = "system"  # the Dockerfile stage BuildKit builds: the base and the apt layer
SYSTEM_RECORD = "system-stage"  # cache records: a system stage's inputs -> the image they built


def target_arches(
    requested: Sequence[str],
    base: BaseProfile,
    client: docker.DockerClient | None,
    cache: Cache | None = None,
    reporter: Reporter = QUIET,
    retries: Retries | None = None,
) -> tuple[str, ...]:
    """The arches to build: those the base offers (its registry asked through the run's
    `retries`), narrowed by `requested` (which it must offer)."""
    offered = offered_arches(base.reference, client, base.digest, cache, reporter, retries)
    return select_arches(requested, offered, base.image)


class SystemStages:
    """Each arch's system stage (base + apt), built while the deps-extra layers are written.

    `prepare` hands over the plan as soon as the apt sets are known (`start`); BuildKit builds
    the very stage the context's Dockerfile holds, from a context with only that Dockerfile,
    so the stage never waits for the gigabyte of wheels being laid out. Its log is shown, and
    a failure raised, when the producer asks for the stage; a build nobody asked for by the
    end (planning failed, or nothing needed building) is stopped, not waited for.

    With a cache, a stage whose inputs (`stage_key`) built an image before that its engine still
    holds is that image, without `docker build`: a rerun that changed nothing would only have
    had BuildKit find every step cached and write the same image (about half a second of a
    no-change rerun). Any other input, or an engine that lost the image, builds as before.

    Once the distribution layers are written (`preload`), each is loaded on its arch's stage
    while the bytecode compiles, under a provisional image removed at the end, and the stage's
    save read meanwhile for its config and apt layer (with a cache, which keeps them): the
    image's own load then sends only the bytecode layers and its config.
    """

    def __init__(
        self,
        secret_files: Mapping[str, Path],
        engines: Engines | None = None,
        cache: Cache | None = None,
        push: bool = False,
    ) -> None:
        self.secret_files = secret_files  # BuildKit secret id -> file, as the build mounts them
        self.engines = engines  # each arch's stage is built on its engine; None: the local one
        self.cache = cache  # where the images built before are recorded; None: always build
        self.push = push  # the run pushes: the apt layer's tar is kept for it (`keeps_apt`)
        self.pool = ThreadPoolExecutor(max_workers=len(ARCHES))
        self.temp = tempfile.TemporaryDirectory(prefix="bsi-system-")
        self.started: dict[str, Future[str]] = {}
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.loader = ThreadPoolExecutor(max_workers=len(ARCHES))
        self.preloads: dict[str, Future[_Preloaded]] = {}
        self.apt_layers: dict[str, bool] = {}  # arch -> whether its stage has an apt layer

    def start(self, plan: Plan) -> None:
        context = Path(self.temp.name) / "context"
        context.mkdir()
        (context / "Dockerfile").write_text(dockerfile(plan, Secrets.of(self.secret_files)))
        self.apt_layers = {a.arch: bool(a.apt_packages) for a in plan.arches}
        logins = base_logins(plan.base_reference)
        for arch in (a.arch for a in plan.arches):
            self.started[arch] = self.pool.submit(
                self._build, context, arch, logins, plan.base_image
            )

    def preload(self, layers: Mapping[str, Sequence[ExtrasLayer]]) -> None:
        """Start loading each arch's `layers` (its distribution layers, written before its
        bytecode) on its stage as soon as the stage is built."""
        if self.engines is None:
            return
        for arch, stack in layers.items():
            if arch in self.started and stack:
                stage = self.started[arch]
                self.preloads[arch] = self.loader.submit(self._preload, arch, stage, stack)

    def _preload(self, arch: str, stage: Future[str], stack: Sequence[ExtrasLayer]) -> _Preloaded:
        assert self.engines is not None  # preload starts none without engines
        client = self.engines.for_arch(arch).client
        system = stage.result()
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=1) as beside:
            saving = beside.submit(self._save, client, system, arch)
            image = preload(client, system, arch, stack)
            saving.exception()  # a failed save is tried again, and reported, by the assembly
        return _Preloaded(client, image, time.monotonic() - began)

    def _save(self, client: docker.DockerClient, system: str, arch: str) -> None:
        """The stage's config, and its apt layer for a push, into the cache, as the assembly
        would read them."""
        if self.cache is None:
            return
        below = system_layers(client, system, arch)
        keep = below[-1] if self.keeps_apt(self.apt_layers.get(arch, False)) and below else None
        if not save_cached(system, self.cache, keep):
            read_save(client, system, self.cache, keep_layer=keep)

    def keeps_apt(self, has_apt: bool) -> bool:
        """Whether a stage's apt layer tar is kept in the cache: only a push sends it (gzipped
        from that tar); a build that only loads the image would hold a second copy of its
        largest system layer (chromium's, hundreds of MB) for nothing."""
        return has_apt and self.push

    def preloaded(self, arch: str) -> float | None:
        """Wait for `arch`'s preload to end; how long it took. None: none ran, or it failed
        (the image's own load then sends every layer, and meets the same error, if any, where
        it is reported)."""
        future = self.preloads.get(arch)
        if future is None or future.exception() is not None:
            return None
        return future.result().seconds

    def _build(
        self, context: Path, arch: str, logins: Mapping[str, Credentials] | None, base: str
    ) -> str:
        with self._log(arch).open("w") as log:
            engine = self.engines.for_arch(arch) if self.engines is not None else None
            spec = BuildSpec(
                platform=f"linux/{arch}",
                target=SYSTEM_STAGE,
                secrets=self.secret_files,
                logins=logins,
                engine=engine,
            )
            key = self._key(context, spec, base, arch)
            if key is not None and (kept := self._kept(key, spec)) is not None:
                log.write(
                    f"system stage unchanged: {kept}, built before from this Dockerfile,"
                    f" platform and base image\n"
                )
                return kept
            image = build_image(
                context, spec, log, lambda process: self.processes.__setitem__(arch, process)
            )
            if key is not None and self.cache is not None:
                self.cache.put_record(SYSTEM_RECORD, key, {"image": image})
            return image

    def _key(self, context: Path, spec: BuildSpec, base: str, arch: str) -> str | None:
        """The stage's `stage_key` when its image can be kept: with a cache, on an engine
        that holds the base for the arch."""
        if self.cache is None or spec.engine is None:
            return None
        base_id = held_base(spec.engine.client, base, arch)
        if base_id is None:
            return None
        return stage_key((context / "Dockerfile").read_text(), spec, base_id)

    def _kept(self, key: str, spec: BuildSpec) -> str | None:
        """The image these inputs built before, if the engine still holds it."""
        assert self.cache is not None and spec.engine is not None  # _key gave a key
        secret_arguments(spec.secrets)  # a missing secret fails a reuse as it fails a build
        record = self.cache.get_record(SYSTEM_RECORD, key)
        if record is None or not holds_image(spec.engine.client, record["image"]):
            return None
        return str(record["image"])

    def _log(self, arch: str) -> Path:
        return Path(self.temp.name) / f"{arch}.log"

    def built(self, arch: str, log: Log) -> str | None:
        """The stage's image id once its build ends, its log written to `log`; None: not started."""
        future = self.started.pop(arch, None)
        if future is None:
            return None
        try:
            return future.result()
        finally:
            if self._log(arch).exists():
                for line in self._log(arch).read_text().splitlines(keepends=True):
                    log.write(line)

    def __enter__(self) -> SystemStages:
        return self

    def __exit__(self, *exc: object) -> None:
        for arch in self.started:  # never asked for: stop it rather than wait minutes for it
            if arch in self.processes:
                self.processes[arch].terminate()
        try:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.loader.shutdown(wait=True, cancel_futures=True)
            for future in self.preloads.values():  # the images built hold the layers now
                if not future.cancelled() and future.exception() is None:
                    loaded = future.result()
                    if loaded.image is not None:
                        remove_provisional(loaded.client, loaded.image)
        finally:
            self.temp.cleanup()


@dataclass(frozen=True)
class _Preloaded:
    """A stage's distribution layers loaded early: the provisional image that holds them."""

    client: docker.DockerClient
    image: str | None  # None: the engine held them all already
    seconds: float


class BuildProducer:
    """Builds one arch's image: its system stage with BuildKit, then the extras layers."""

    path = Route.BUILD

    def __init__(
        self,
        plan: Plan,
        context: Path,
        finish: Finish,
        tag: str,
        engines: Engines,
        stages: SystemStages,
        reporter: Reporter,
    ) -> None:
        self.plan, self.context, self.finish, self.tag = plan, context, finish, tag
        self.engines, self.stages, self.reporter = engines, stages, reporter
        self.base = plan.base_reference
        self.logins = base_logins(self.base)  # BuildKit pulls the base itself, as docker would
        self.multi = len(plan.arches) > 1

    @property
    def label(self) -> str:
        return self.tag

    def local_tag(self, arch: str) -> str:
        return arch_tag(self.tag, arch) if self.multi else self.tag

    def announce(self, arch: str, emulated: bool) -> str:
        how = " (emulated)" if emulated else ""
        return f"building {arch} image {self.local_tag(arch)} with BuildKit{how} ..."

    def produce(self, arch: str) -> Produced:
        """BuildKit's system stage (started early, or built now) plus the extras layers, on
        the arch's engine."""
        log = _Said(self.reporter, f"[{arch}] " if self.multi else "")
        engine = self.engines.for_arch(arch)
        spec = BuildSpec(
            platform=f"linux/{arch}",
            target=SYSTEM_STAGE,
            secrets=self.stages.secret_files,
            logins=self.logins,
            engine=engine,
        )
        started = time.monotonic()
        system = self.stages.built(arch, log) or build_image(self.context, spec, log)
        built_at = time.monotonic()  # a preload outlasting the bytecode is waited for in `load`
        preloaded = self.stages.preloaded(arch)
        tag = self.local_tag(arch)
        arch_plan = next(a for a in self.plan.arches if a.arch == arch)
        names = distribution_names(arch_plan)
        assembly = Assembly(
            arch,
            self.plan.pythonpath_entry,
            self.finish.labels,
            self.finish.created,
            tag,
            apt_layer=self.stages.keeps_apt(bool(arch_plan.apt_packages)),
            env=image_env(self.plan),
        )
        built = assemble(
            engine.client, system, self.finish.layers[arch], assembly, self.finish.cache
        )
        if seeds := seeds_of(names):
            built = self._seeded(engine.client, built, assembly, seeds)
        return Produced(
            arch,
            built.image_id,
            built.config,
            partial(self._value, built),
            {"id": built.image_id, "tag": tag},
            local_tag=tag,
            extras_layers=[one.to_dict() for one in built.extras],
            holding_layers={
                name: one.layer.diff_id
                for one in built.extras
                if one.kind == LayerKind.DISTRIBUTION
                for name in one.names
            },
            seconds=_seconds(built_at - started, preloaded, time.monotonic() - built_at),
            facts=self.finish.facts,
        )

    def _seeded(
        self,
        client: docker.DockerClient,
        built: Assembled,
        assembly: Assembly,
        seeds: tuple[str, ...],
    ) -> Assembled:
        """`built` run once to build the caches of `seeds` (builder.layers.home), assembled
        again with them as a layer above the extras: only that layer travels to the engine,
        which holds the others in `built`. `built` stays in the engine untagged (its layers
        are the new image's), so a rerun finds it and its seed without loading anything."""
        cache = self.finish.cache
        epoch = max(one.layer.source_date_epoch for one in built.extras)
        layer = seed_layer(client, built.image_id, seeds, epoch, cache)
        seeded = ExtrasLayer(LayerKind.HOME_SEED, seeds, " ".join(seeds), layer)
        extras = (*built.extras, seeded)
        return assemble(client, built.system_id, extras, assembly, cache)

    def _value(
        self, built: Assembled, target: RepositoryClient, scratch: Path
    ) -> tuple[Image, Blobs]:
        base = base_layers(self.base, built.arch, target)
        client = self.engines.for_arch(built.arch).client  # its layers are saved from there
        return assembled_image(client, built, base, self.finish.cache, scratch)


def _seconds(build: float, preloaded: float | None, load: float) -> dict[str, float]:
    """report.json's phases of a build: `preload` overlapped the bytecode compile."""
    early = {"preload": preloaded} if preloaded is not None else {}
    return {"build": build, **early, "load": load}


def stage_key(text: str, spec: BuildSpec, base_id: str) -> str:
    """What a system stage's image is a function of, hashed: its Dockerfile (the apt set, the
    base's reference, the secrets' mounts), the stage and platform, and the base's image id as
    the engine holds it (BuildKit takes a FROM the engine holds without pulling it). A secret's
    content is not in it: BuildKit's own cache ignores it too."""
    inputs = {
        "dockerfile": text,
        "target": spec.target,
        "platform": spec.platform,
        "base": base_id,
        "secrets": sorted(spec.secrets),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def held_base(client: docker.DockerClient, image: str, arch: str) -> str | None:
    """The id of `image` as the engine holds it for `arch`; None when it holds no such image
    (BuildKit would pull it, so what it builds on is not known here)."""
    try:
        attrs = client.api.inspect_image(image)
    except docker.errors.DockerException:
        return None
    return str(attrs["Id"]) if attrs.get("Architecture") == arch else None


def arch_tag(tag: str, arch: str) -> str:
    """The local tag of one arch's image: `name:tag-arm64`, or `name:arm64` without a tag."""
    if ":" in tag.rsplit("/", 1)[-1]:
        return f"{tag}-{arch}"
    return f"{tag}:{arch}"


class _Said:
    """BuildKit's log, one line at a time, through the run's reporter (a fleet's leads each
    line with its template) and led by its arch: concurrent builds stay readable."""

    def __init__(self, reporter: Reporter, prefix: str) -> None:
        self.reporter, self.prefix = reporter, prefix

    def write(self, text: str) -> int:  # builder.assemble.build writes whole lines
        self.reporter.say(self.prefix + text.rstrip("\n"))
        return len(text)
