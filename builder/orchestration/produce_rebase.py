"""The rebase path's producer: same extras, new base, only the small blobs travel.

When a rebuild's resolution is unchanged, the previous image's extras layers (its top layers,
whose history lines name /app/deps-extra) are reused by digest; the apt layer is rebuilt
against the new base's package state (a one-step BuildKit build, usually started ahead:
`AptAhead`); a new config and manifest are written over
the new base's layers (builder.oci.mutate). The config is docker-loaded from this machine's
blobs for builder.orchestration.delivery to verify, while the apt layer's blob is gzipped.
Only when the extras tars are not all cached here is the image written by digest first (no
tag) and pulled by digest to verify it. builder.orchestration.delivery writes the image only
after every arch passed, and checks that its config is byte for byte the one verified.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import docker
import docker.errors

from builder import contract, credentials
from builder.assemble.apt import AptImage, build_apt_image, saved_layer
from builder.assemble.assemble import load
from builder.credentials import engine_auth
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.layers.extras import holding_layers
from builder.layers.gzipped import gzipped
from builder.layers.home import image_env
from builder.layers.install_layout import LAYER_TAR
from builder.oci.mutate import ConfigChange, NewLayer, append, extend_config, top
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, BlobSource, InRepository, LocalFile, Written, resolve, write
from builder.oci.v1 import Image, Platform, canonical
from builder.orchestration.delivery import Produced, Run
from builder.orchestration.prepare import Finish
from builder.plan.plan import EXTRA_DEPS, Plan
from builder.publish.blob_memory import blob_memory
from builder.publish.state import Route


@dataclass(frozen=True)
class Previous:
    """What a rebase starts from: the image last pushed, and the base it was built on."""

    image: ImageRef  # pinned by digest
    base_digest: str


class RebaseProducer:
    """Puts the previous image's extras layers on the new base, one arch at a time.

    A context manager: the apt layers' blobs are gzipped on its own thread while delivery
    verifies, and it waits for them when it ends.
    """

    path = Route.REBASE

    def __init__(
        self,
        previous: Previous,
        plan: Plan,
        finish: Finish,
        target: ImageRef,
        run: Run,
        ahead: AptAhead | None = None,
        apt_secrets: Mapping[str, Path] | None = None,
    ) -> None:
        if not plan.base.digest:
            raise UserError(f"base {plan.base.image}: no digest probed; cannot rebase onto it")
        self.previous, self.plan, self.finish, self.run = previous, plan, finish, run
        self.ahead, self.apt_secrets = ahead, apt_secrets
        self.target = credentials.registry(target, str(target), run.retries)
        self.bases = credentials.registry(plan.base.reference, retries=run.retries)
        self.olds = credentials.registry(previous.image, retries=run.retries)
        self.pool = ThreadPoolExecutor(max_workers=len(plan.arches))
        self.change = ConfigChange(
            {"PYTHONPATH": f"$PYTHONPATH:{EXTRA_DEPS}", **image_env(plan)},
            contract.SANDBOX_USER,
            finish.labels,
            finish.created,
        )

    @property
    def label(self) -> str:
        return str(self.target.ref)

    def announce(self, arch: str, emulated: bool) -> str:
        how = " (emulated)" if emulated else ""
        return f"rebasing {self.previous.image} onto {self.plan.base_image} for {arch}{how} ..."

    def produce(self, arch: str) -> Produced:
        """The rebased image's config loaded (or pulled) for verification; its value pending."""
        started = time.monotonic()
        platform = Platform.linux(arch)
        old_base = resolve(self.bases, platform, self.previous.base_digest)
        new_base = resolve(self.bases, platform, self.plan.base.digest)
        extras = extras_layers_of(top(resolve(self.olds, platform), old_base), self.previous.image)
        apt = self._apt(arch)
        loaded = [NewLayer("", apt.diff_id, 0, apt.created_by)] if apt else []
        config = canonical(extend_config(new_base.config, [*loaded, *extras], self.change))
        sources: dict[str, BlobSource] = {
            layer.digest: InRepository(self.bases) for layer in new_base.layers
        }
        sources |= {layer.digest: InRepository(self.olds) for layer in extras}
        blobs = Blobs(sources, (self.bases, self.olds))
        value = self.pool.submit(self._value, new_base, arch, apt, extras, blobs)

        def written() -> Written:
            image, blobs = value.result()
            return write(self.target, [image], blobs, memory=blob_memory(self.run.cache))

        diff_ids = [layer.diff_id for layer in extras]
        engine_name, early = into_engine(
            self.run, arch, config, diff_ids, written, self.target.ref.registry
        )
        wheels = next(a.wheels for a in self.plan.arches if a.arch == arch)
        return Produced(
            arch,
            engine_name,
            config,
            lambda target, scratch: value.result(),
            {"extras_layers": [layer.digest for layer in extras]},
            early=early,
            holding_layers=holding_layers(
                [(layer.diff_id, layer.created_by) for layer in extras], [w.name for w in wheels]
            ),
            seconds={"rebase": time.monotonic() - started},
        )

    def _apt(self, arch: str) -> AptImage | None:
        """The apt layer on the new base, with the browsers' wiring (builder.plan.browsers) in
        the same step; one started ahead has none, so an arch with wiring builds its own."""
        arch_plan = next(a for a in self.plan.arches if a.arch == arch)
        packages, wiring = arch_plan.apt_packages, arch_plan.browsers.commands()
        if not packages:
            return None
        apt = self.ahead.get(arch, packages) if self.ahead and not wiring else None
        if apt is None:
            self.run.reporter.say(
                f"rebuilding the apt layer ({' '.join(packages)}) on {self.plan.base_image} ..."
            )
            engine = self.run.engines.for_arch(arch)
            apt = build_apt_image(
                self.plan.base_image, packages, arch, engine, self.apt_secrets, wiring
            )
        return apt

    def _value(
        self,
        base: Image,
        arch: str,
        apt: AptImage | None,
        extras: Sequence[NewLayer],
        blobs: Blobs,
    ) -> tuple[Image, Blobs]:
        """Gzip the apt layer out of its image (on its arch's engine) and put the layers on
        the base: the image."""
        layers = []
        if apt is not None:
            client = self.run.engines.for_arch(arch).client
            tar = saved_layer(apt, self.run.cache, client)
            blob = gzipped(tar.path, tar.diff_id, self.run.cache)
            layers.append(NewLayer(blob.digest, apt.diff_id, blob.size, apt.created_by))
            blobs = blobs | Blobs({blob.digest: LocalFile(blob.path)})
        return append(base, [*layers, *extras], self.change), blobs

    def __enter__(self) -> RebaseProducer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def extras_layers_of(added: Sequence[NewLayer], image: ImageRef) -> list[NewLayer]:
    """The extras layers among the layers an image added to its base: the top ones whose
    history lines name /app/deps-extra (one for images of before layers by distribution)."""
    count = 0
    while count < len(added) and EXTRA_DEPS in added[len(added) - 1 - count].created_by:
        count += 1
    if count == 0:
        raise UserError(f"{image}: its top layer is not {EXTRA_DEPS}")
    return list(added[len(added) - count :])


def into_engine(
    run: Run,
    arch: str,
    config: bytes,
    diff_ids: Sequence[str],
    written: Callable[[], Written],
    registry: str,
) -> tuple[str, Written | None]:
    """The engine's name for the rebased image, and the write that got it there (if any).

    `registry`: the host `written` writes to, whose login the engine's pull needs.
    `arch`'s engine holds the new base and apt layers (it built them); when every extras tar is in
    the cache (this machine wrote them) the image is docker-loaded: its id is the config's
    digest. Otherwise the image is written by digest (no tag) and pulled by digest.
    """
    client = run.engines.for_arch(arch).client
    tars = [run.cache.checked_blob(d.removeprefix("sha256:"), LAYER_TAR) for d in diff_ids]
    if all(tar is not None for tar in tars):
        try:
            image_id = load(client, config, [tar for tar in tars if tar is not None], 0)
        except (UserError, docker.errors.APIError, OSError) as error:
            run.reporter.note(f"loading the rebased image locally failed ({error}); pulling it")
        else:
            run.reporter.say(f"rebased image {image_id} loaded from local blobs")
            return image_id, None
    pushed = written()
    run.reporter.say(f"pulling {pushed.reference} to verify it ...")
    client.api.pull(
        pushed.repository, tag=pushed.digest, auth_config=engine_auth(registry), stream=False
    )
    return pushed.reference, pushed


class AptAhead:
    """Apt layers started before the plan exists, for the previous build's apt sets.

    A platform upgrade usually keeps the apt set, so the one BuildKit step of a rebase runs
    while the extras are re-resolved; a layer is used only if the new plan asks for that set.
    """

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        packages: Mapping[str, Sequence[str]],
        base_image: str,
        engines: Engines,
        secret_files: Mapping[str, Path] | None = None,
    ) -> None:
        self.started = {
            arch: (
                tuple(wanted),
                pool.submit(
                    build_apt_image,
                    base_image,
                    wanted,
                    arch,
                    engines.for_arch(arch),
                    secret_files,
                ),
            )
            for arch, wanted in packages.items()
            if wanted
        }

    def get(self, arch: str, packages: Sequence[str]) -> AptImage | None:
        """The image started for `arch`, if it was started for exactly `packages`."""
        wanted, future = self.started.get(arch, ((), None))
        return future.result() if future is not None and wanted == tuple(packages) else None
