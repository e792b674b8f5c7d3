"""The platform upgrade's fast path: same extras, new base, only the small blobs travel.

When a rebuild's resolution is unchanged, the previous image's deps-extra layer (its top layer)
is reused by digest; the apt layer is rebuilt against the new base's package state (a one-step
BuildKit build); a new config and manifest are written over the new base's layers. The config
is docker-loaded from this machine's blobs and verified (pulled by digest when the deps-extra
tar is not cached here) while the apt layer's blob is made and everything is pushed by digest
only (every blob HEAD-checked or mounted first); only then are the tags moved and the template
updated: the image that was verified has the config and layers, byte for byte, that the
cluster gets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from builder import contract, credentials
from builder.analysis.plan import EXTRA_DEPS, Plan
from builder.cache import Cache
from builder.credentials import engine_auth
from builder.errors import UserError
from builder.image.apt import AptImage, build_apt_image, saved_layer
from builder.image.assemble import load
from builder.image.gzipped import gzipped
from builder.image.publish import image_tags
from builder.oci.client import Registry
from builder.oci.mutate import ConfigChange, NewLayer, append, extend_config, top
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, BlobSource, InRepository, LocalFile, resolve, write
from builder.oci.v1 import Image, Platform, canonical
from builder.verify import VerifyReport, verify_image


@dataclass
class Rebased:
    """What the rebase path pushed, and how much of it actually travelled."""

    repository: str
    digest: str
    tags: tuple[str, ...]
    arch: str
    deps_extra: str  # digest of the reused deps-extra layer
    bytes_pushed: int
    image_size: int  # config plus every layer, compressed
    verification: VerifyReport | None = None
    notes: list[str] = field(default_factory=list)
    image: Image | None = field(default=None, repr=False)  # as pushed: an index names it

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"

    def record(self) -> dict[str, Any]:
        """The report.json entry: what was pushed and what it cost."""
        return {
            "pushed": self.reference,
            "tags": list(self.tags),
            "arch": self.arch,
            "deps_extra_layer": self.deps_extra,
            "bytes_pushed": self.bytes_pushed,
            "image_size": self.image_size,
            "verification": self.verification.to_dict() if self.verification else None,
        }


def rebase(
    previous_image: str,
    previous_base_digest: str,
    plan: Plan,
    arch: str,
    repository: str,
    platform_version: str,
    extras: str,
    client: docker.DockerClient,
    cache: Cache,
    say: Callable[[str], None],
    *,
    labels: Mapping[str, str],
    created: str,
    tag: bool = True,
    ahead: AptAhead | None = None,
    apt_secrets: Mapping[str, Path] | None = None,
) -> Rebased:
    """Put the previous image's deps-extra layer on the new base; push, verify, tag.

    With `tag=False` (one arch of an index) nothing but the digest is written: the caller
    writes the index once every arch has passed.
    """
    old_ref = ImageRef.parse(previous_image, "previous image")
    base_ref = ImageRef.parse(plan.base.image, "base image")
    if not plan.base.digest:
        raise UserError(f"base {plan.base.image}: no digest probed; cannot rebase onto it")
    target = credentials.registry(ImageRef.parse_repository(repository), repository)
    bases = credentials.registry(base_ref)
    olds = credentials.registry(old_ref)
    platform = Platform.linux(arch)
    old_base = resolve(bases, platform, previous_base_digest)
    new_base = resolve(bases, platform, plan.base.digest)
    old = resolve(olds, platform)
    added = top(old, old_base)
    if not added or EXTRA_DEPS not in added[-1].created_by:
        raise UserError(f"{previous_image}: its top layer is not {EXTRA_DEPS}")
    deps = added[-1]
    packages = next(a.apt_packages for a in plan.arches if a.arch == arch)
    apt: AptImage | None = None
    if packages:
        apt = ahead.get(arch, packages) if ahead else None
        if apt is None:
            say(f"rebuilding the apt layer ({' '.join(packages)}) on {plan.base_image} ...")
            apt = build_apt_image(plan.base_image, packages, arch, client, apt_secrets)
    change = ConfigChange(
        {"PYTHONPATH": f"$PYTHONPATH:{EXTRA_DEPS}"}, contract.SANDBOX_USER, labels, created
    )
    loaded = [NewLayer("", apt.diff_id, 0, apt.created_by)] if apt else []
    config = canonical(extend_config(new_base.config, [*loaded, deps], change))
    sources: dict[str, BlobSource] = {
        layer.digest: InRepository(bases) for layer in new_base.layers
    }
    sources[deps.digest] = InRepository(olds)
    blobs = Blobs(sources, (bases, olds))
    result = Rebased(repository, "", (), arch, deps.digest, 0, 0)
    with ThreadPoolExecutor(max_workers=1) as pool:  # the push overlaps loading and verifying
        pushing = pool.submit(_publish, target, new_base, apt, deps, change, blobs, cache, client)
        engine_name = _into_engine(
            client, config, deps.diff_id, cache, pushing, repository, target.ref.registry, say
        )
        result.verification = verify_image(
            engine_name,
            modules=plan.import_modules,
            checks=plan.runtime_checks,
            client=client,
        )
        image, result.bytes_pushed = pushing.result()
    if image.config_bytes != config:
        raise UserError(f"rebase of {previous_image}: the pushed config is not the one verified")
    result.digest, result.image = image.digest, image
    result.image_size = image.size
    if not result.verification.passed or not tag:
        return result  # pushed by digest only: no tag, no template names it
    tags = image_tags(repository, platform_version, extras)
    result.tags = write(target, [image], Blobs(), tags=tags).tags
    return result


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
        client: docker.DockerClient,
        secret_files: Mapping[str, Path] | None = None,
    ) -> None:
        self.started = {
            arch: (
                tuple(wanted),
                pool.submit(build_apt_image, base_image, wanted, arch, client, secret_files),
            )
            for arch, wanted in packages.items()
            if wanted
        }

    def get(self, arch: str, packages: Sequence[str]) -> AptImage | None:
        """The image started for `arch`, if it was started for exactly `packages`."""
        wanted, future = self.started.get(arch, ((), None))
        return future.result() if future is not None and wanted == tuple(packages) else None


def _publish(
    target: Registry,
    base: Image,
    apt: AptImage | None,
    deps: NewLayer,
    change: ConfigChange,
    blobs: Blobs,
    cache: Cache,
    client: docker.DockerClient,
) -> tuple[Image, int]:
    """Gzip the apt layer out of its image, put the layers on the base, write it by digest.

    Returns the image as written (no tag yet) and the bytes that travelled.
    """
    layers = []
    if apt is not None:
        tar = saved_layer(apt, cache, client)
        blob = gzipped(tar.path, tar.diff_id, cache)
        layers.append(NewLayer(blob.digest, apt.diff_id, blob.size, apt.created_by))
        blobs = blobs | Blobs({blob.digest: LocalFile(blob.path)})
    image = append(base, [*layers, deps], change)
    return image, write(target, [image], blobs).bytes_uploaded


def _into_engine(
    client: docker.DockerClient,
    config: bytes,
    deps_diff_id: str,
    cache: Cache,
    pushing: Future[tuple[Image, int]],
    repository: str,
    registry: str,
    say: Callable[[str], None],
) -> str:
    """The engine's name for the rebased image: docker-loaded from this machine's blobs if it can.

    The engine holds the new base and apt layers (it built them); the deps-extra tar is in the
    cache when this machine wrote it. The loaded image's id is the config's digest, the config
    the pushed manifest names. Otherwise the pushed image is pulled by digest (the whole layer).
    """
    tar = cache.find_blob(deps_diff_id.removeprefix("sha256:"), "layer.tar")
    if tar is not None:
        try:
            image_id = load(client, config, tar)
        except (UserError, docker.errors.APIError, OSError) as error:
            say(f"note: loading the rebased image locally failed ({error}); pulling it")
        else:
            say(f"verifying {image_id} (loaded from local blobs) ...")
            return image_id
    image = pushing.result()[0]
    say(f"pulling {repository}@{image.digest} to verify it ...")
    client.api.pull(repository, tag=image.digest, auth_config=engine_auth(registry), stream=False)
    return f"{repository}@{image.digest}"
