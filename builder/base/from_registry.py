"""Probe a base image through its registry alone: no engine, no container, no pull to disk.

Resolve `repo:tag` or `repo@digest` to a manifest (for an index: the linux/amd64 entry and the
linux/arm64 one when present), read the config blob (Env, User) and stream every layer once
through `layers.Layers`, then turn the facts into a profile with `profile.profile_from_facts`.
The record is cached by the manifest (or index) digest, so a repeat probe asks the registry only
what the tag names now. Transport, auth, digest checks and the platform rule are `builder.oci`'s.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypedDict, cast

from builder.base.layers import Layers
from builder.base.profile import (
    DEBIAN_VERSION,
    ArchFacts,
    profile_from_facts,
    pythonpath_dirs,
)
from builder.cache import Cache
from builder.credentials import registry
from builder.errors import RegistryError, UserError
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.remote import platform_image, read
from builder.oci.v1 import Image, Index, Platform
from builder.resolve.target import ARCHES, Arch, BaseProfile
from builder.retry import Retries

RECORD_KIND = "registry-probe"
RECORD_VERSION = 2  # bump when the collected facts change shape or meaning
ZSTD_TYPES = ("zstd",)  # media types tarfile cannot stream


class RegistryRecord(TypedDict):
    """What the cache keeps of a registry probe, by the manifest (index) digest."""

    version: int  # RECORD_VERSION
    digest: str
    arches: dict[str, ArchFacts]  # ARCHES name -> its facts


def probe_registry(ref: ImageRef, cache: Cache, retries: Retries | None = None) -> BaseProfile:
    """The profile of `ref` read from its registry; cached by the manifest (index) digest."""
    image = ref.as_written
    client = registry(ref, f"base image {image}", retries)
    digest = ref.digest or client.head_manifest(ref.reference)
    record = _cached(cache, digest) if digest else None
    if record is None:
        top = read(client, ref.reference, expected=digest)
        digest = top.digest
        record = _cached(cache, digest)  # a registry that gave no digest to the HEAD
        if record is None:
            record = RegistryRecord(version=RECORD_VERSION, digest=digest, arches={})
            try:
                platforms = list(_platform_images(client, top))
                with ThreadPoolExecutor(max_workers=max(1, len(platforms))) as pool:
                    # each arch's layers at once: gunzip and hashing release the GIL
                    probed = pool.map(
                        lambda p: (p[0].name, _probe_image(client, p[1], p[0])), platforms
                    )
                    record["arches"] = dict(probed)
            except (KeyError, TypeError, AttributeError) as exc:  # JSON of the wrong shape
                raise RegistryError(
                    f"{client.label}: malformed manifest or image config"
                    f" ({type(exc).__name__}: {str(exc)[:100]})"
                ) from None
            if not record["arches"]:
                raise UserError(
                    f"base image {image}: the registry has no linux/amd64 or linux/arm64 image"
                )
            cache.put_record(RECORD_KIND, digest.removeprefix("sha256:"), record)
    arches = record["arches"]
    main = arches.get("amd64") or next(iter(arches.values()))
    return profile_from_facts(
        ref,
        arches,
        pythonpath=main["pythonpath"],
        user=main["user"],
        digest=record["digest"],
        source=f"registry {record['digest'].removeprefix('sha256:')[:12]}",
    )


def _cached(cache: Cache, digest: str) -> RegistryRecord | None:
    record = cache.get_record(RECORD_KIND, digest.removeprefix("sha256:"))
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    return cast(RegistryRecord, record)  # of this version: its shape


def _platform_images(client: RepositoryClient, top: Image | Index) -> Iterator[tuple[Arch, Image]]:
    """(arch, image) for amd64 and arm64: from an index, or the one image's config."""
    if isinstance(top, Index):
        for arch in ARCHES.values():
            platform = Platform.linux(arch.name)
            if top.pick(platform) is not None:  # an arch the index lacks is not probed
                yield arch, platform_image(client, top, platform)
        return
    config_arch = ARCHES.get(top.architecture)
    if config_arch is None:
        supported = ", ".join(ARCHES)
        raise UserError(f"{client.label} is {top.architecture or None}; supported: {supported}")
    yield config_arch, top


def _probe_image(client: RepositoryClient, image: Image, arch: Arch) -> ArchFacts:
    """Config facts and layer facts of one image."""
    env = image.config_file.environment
    pythonpath = env.get("PYTHONPATH", "")
    layers = Layers(arch, [d.strip("/") for d in pythonpath_dirs(pythonpath)])
    for layer in image.layers:
        if any(word in layer.media_type for word in ZSTD_TYPES):
            raise UserError(f"{client.label}: layer type {layer.media_type} is not supported")
        if "foreign" in layer.media_type or "nondistributable" in layer.media_type:
            continue  # Windows-style foreign layers are never served by the registry
        try:
            # The blob checks its digest when it ends, also after a tar error, so a tampered
            # layer is reported as such rather than as unreadable; one cut short is read again
            # (`apply` lays a layer over only once its whole tar was read: restartable).
            client.read_blob(layer.digest, layers.apply)
        except (tarfile.TarError, zlib.error, OSError, EOFError) as exc:
            raise UserError(f"{client.label}: layer {layer.digest} is unreadable: {exc}") from None
    facts = layers.facts()
    found = facts["distributions"]  # keyed as the engine's facts are: as PYTHONPATH says
    facts["distributions"] = {d: found[d.strip("/")] for d in pythonpath_dirs(pythonpath)}
    facts["python"] = env.get("PYTHON_VERSION") or _python_from_packages(facts)
    facts["user"] = image.config_file.user
    facts["pythonpath"] = pythonpath
    return facts


def _python_from_packages(facts: ArchFacts) -> str:
    """`python3.13` 3.13.5-2 -> 3.13.5; the one /usr/bin/python3 runs, else the newest."""
    versions = facts.get("python_packages") or {}
    runs = posixpath.basename(facts.get("python3_link") or "")
    names = sorted(versions, key=lambda n: [int(x) for x in re.findall(r"\d+", n)], reverse=True)
    names.sort(key=lambda n: n.removesuffix("-minimal") != runs)
    for name in names:
        match = DEBIAN_VERSION.match(versions[name])
        if match:
            return match.group(1)
    return ""
