"""The platform upgrade's fast path: same extras, new base, only the small blobs travel.

When a rebuild's resolution is unchanged, the previous image's deps-extra layer (its top layer)
is reused by digest; the apt layer is rebuilt against the new base's package state (a one-step
BuildKit build); a new config and manifest are written over the new base's layers. The result
is pushed by digest only (every blob HEAD-checked or mounted first) while the same config is
docker-loaded from this machine's blobs and verified (pulled by digest when the deps-extra tar
is not cached here), and only then tagged and named in the template: the image that was
verified has the config and layers, byte for byte, that the cluster gets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from builder import contract
from builder.analysis.plan import EXTRA_DEPS, Plan
from builder.cache import Cache
from builder.credentials import engine_auth
from builder.errors import RegistryError, UserError
from builder.image.apt import apt_layer
from builder.image.assemble import load
from builder.image.gzipped import gzipped
from builder.image.layer import Layer
from builder.image.publish import image_tags
from builder.image.rebase import Image, NewLayer, append, top
from builder.imageref import ImageRef
from builder.oci import INDEX_TYPES, Registry
from builder.verify import VerifyReport, verify_image
from builder.verify.run import STARTUP_TIMEOUT


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
    manifest: bytes = field(default=b"", repr=False)  # as pushed: an index names its digest
    media_type: str = ""

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
    startup_timeout: float = STARTUP_TIMEOUT,
    ahead: AptAhead | None = None,
) -> Rebased:
    """Put the previous image's deps-extra layer on the new base; push, verify, tag.

    With `tag=False` (one arch of an index) nothing but the digest is written: the caller
    writes the index once every arch has passed.
    """
    old_ref = ImageRef.parse(previous_image, "previous image")
    base_ref = ImageRef.parse(plan.base.image, "base image")
    if not plan.base.digest:
        raise UserError(f"base {plan.base.image}: no digest probed; cannot rebase onto it")
    target = Registry(ImageRef.parse_repository(repository))
    bases = Registry(base_ref)
    old_base = _image(bases, previous_base_digest, arch)
    new_base = _image(bases, plan.base.digest, arch)
    old = _image(Registry(old_ref), old_ref.digest or old_ref.reference, arch)
    added = top(old, old_base)
    if not added or EXTRA_DEPS not in added[-1].created_by:
        raise UserError(f"{previous_image}: its top layer is not {EXTRA_DEPS}")
    deps = added[-1]
    layers: list[NewLayer] = []
    local: dict[str, Path] = {}  # blobs only this machine has: digest -> file
    packages = next(a.apt_packages for a in plan.arches if a.arch == arch)
    if packages:
        built = ahead.get(arch, packages) if ahead else None
        if built is None:
            say(f"rebuilding the apt layer ({' '.join(packages)}) on {plan.base_image} ...")
            built = apt_layer(plan.base_image, packages, arch, cache, client)
        apt, created_by = built
        blob = gzipped(apt.path, apt.diff_id, cache)
        layers.append(NewLayer(blob.digest, apt.diff_id, blob.size, created_by))
        local[blob.digest] = blob.path
    layers.append(deps)
    image = append(
        new_base,
        layers,
        env={"PYTHONPATH": f"$PYTHONPATH:{EXTRA_DEPS}"},
        user=contract.SANDBOX_USER,
        labels=labels,
        created=created,
    )
    size = len(image.config_bytes) + sum(layer["size"] for layer in image.layers)
    result = Rebased(repository, "", (), arch, deps.digest, 0, size, manifest=image.manifest_bytes,
                     media_type=image.manifest["mediaType"])  # fmt: skip
    with ThreadPoolExecutor(max_workers=1) as pool:  # the push overlaps loading and verifying
        pushing = pool.submit(_push, target, image, base_ref, old_ref, local)
        engine_name = _into_engine(
            client, image, deps.diff_id, cache, pushing, repository, target.ref.registry, say
        )
        result.verification = verify_image(
            engine_name,
            modules=plan.import_modules,
            checks=plan.runtime_checks,
            client=client,
            startup_timeout=startup_timeout,
        )
        result.digest, result.bytes_pushed = pushing.result()
    if not result.verification.passed or not tag:
        return result  # pushed by digest only: no tag, no template names it
    tags = image_tags(repository, platform_version, extras)
    for name in tags:
        target.put_manifest(
            name.rsplit(":", 1)[1], image.manifest_bytes, image.manifest["mediaType"]
        )
    result.tags = tuple(tags)
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
        cache: Cache,
        client: docker.DockerClient,
    ) -> None:
        self.started = {
            arch: (tuple(wanted), pool.submit(apt_layer, base_image, wanted, arch, cache, client))
            for arch, wanted in packages.items()
            if wanted
        }

    def get(self, arch: str, packages: Sequence[str]) -> tuple[Layer, str] | None:
        """The layer started for `arch`, if it was started for exactly `packages`."""
        wanted, future = self.started.get(arch, ((), None))
        return future.result() if future is not None and wanted == tuple(packages) else None


def _image(registry: Registry, reference: str, arch: str) -> Image:
    """The `arch` image `reference` names (through an index when it is one).

    Documents of another shape (an index naming an index, layers that are not descriptors, no
    diff IDs) are a RegistryError naming the image, not a traceback from deep in the rebase.
    """
    manifest, digest = registry.manifest(reference)
    try:
        if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            entry = next(
                (
                    m
                    for m in manifest["manifests"]
                    if (m.get("platform") or {}).get("architecture") == arch
                    and (m.get("platform") or {}).get("os") == "linux"
                ),
                None,
            )
            if entry is None:
                raise UserError(f"{registry.label}@{digest}: no linux/{arch} image in the index")
            manifest, digest = registry.manifest(entry["digest"])
            if "manifests" in manifest:
                raise RegistryError(f"{registry.label}: its index names another index for {arch}")
        image = Image(manifest, registry.json_blob(manifest["config"]["digest"]))
        for layer in image.layers:
            if not isinstance(layer["digest"], str) or not isinstance(layer["size"], int):
                raise TypeError(f"layer descriptor {str(layer)[:80]}")
        if not all(isinstance(d, str) for d in image.diff_ids) or not all(
            isinstance(h, dict) for h in image.config.get("history") or []
        ):
            raise TypeError("rootfs.diff_ids or history")
    except (KeyError, TypeError, AttributeError) as error:  # JSON of the wrong shape
        raise RegistryError(
            f"{registry.label}@{digest}: malformed manifest or image config"
            f" ({type(error).__name__}: {str(error)[:100]})"
        ) from None
    return image


def _push(
    target: Registry, image: Image, base: ImageRef, old: ImageRef, local: dict[str, Path]
) -> tuple[str, int]:
    """Push `image` by digest only (no tag yet); its digest and the bytes that travelled."""
    uploaded = _push_blobs(target, image, base, old, local)
    digest = target.put_manifest(image.digest, image.manifest_bytes, image.manifest["mediaType"])
    return digest, uploaded + len(image.manifest_bytes)


def _into_engine(
    client: docker.DockerClient,
    image: Image,
    deps_diff_id: str,
    cache: Cache,
    pushing: Future[tuple[str, int]],
    repository: str,
    registry: str,
    say: Callable[[str], None],
) -> str:
    """The engine's name for `image`: docker-loaded from this machine's blobs when it can be.

    The engine holds the new base and apt layers (it built them); the deps-extra tar is in the
    cache when this machine wrote it. Its image id is then the config's digest, the one the
    pushed manifest names. Otherwise the pushed image is pulled by digest (the whole layer).
    """
    tar = cache.find_blob(deps_diff_id.removeprefix("sha256:"), "layer.tar")
    if tar is not None:
        try:
            image_id = load(client, image.config_bytes, tar)
        except (UserError, docker.errors.APIError, OSError) as error:
            say(f"note: loading {image.digest} locally failed ({error}); pulling it")
        else:
            say(f"verifying {image.digest} (loaded from local blobs as {image_id}) ...")
            return image_id
    digest = pushing.result()[0]
    say(f"pulling {repository}@{digest} to verify it ...")
    client.api.pull(repository, tag=digest, auth_config=engine_auth(registry), stream=False)
    return f"{repository}@{digest}"


def _push_blobs(
    target: Registry, image: Image, base: ImageRef, old: ImageRef, local: dict[str, Path]
) -> int:
    """Make every blob of `image` present in `target`; returns the bytes uploaded."""
    sources = {base.repository, old.repository} - {target.ref.repository}
    uploaded = 0
    for layer in image.layers:
        digest = layer["digest"]
        if target.blob_exists(digest):
            continue
        if target.ref.registry in {base.registry, old.registry} and any(
            target.mount(digest, source) for source in sorted(sources)
        ):
            continue
        if digest in local:
            target.upload_blob(local[digest], digest)
        else:  # a base layer from another registry: stream it across, verified on both ends
            with Registry(base).blob(digest) as blob:
                target.upload_blob(blob, digest)  # type: ignore[arg-type]
        uploaded += layer["size"]
    config = image.config_bytes
    if not target.blob_exists(image.manifest["config"]["digest"]):
        target.upload_blob(config, image.manifest["config"]["digest"])
        uploaded += len(config)
    return uploaded
