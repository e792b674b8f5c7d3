"""What a node already holding the previous image must do to run the new one.

The push's own figures (bytes uploaded, mounted, already there) are the registry's side; a
platform operator also pays on every node that runs the template. A node that holds the image
the tag named before this push must:

- download every layer whose blob the previous image does not have (compressed bytes);
- unpack every layer whose chain ID the previous image does not have. containerd and Docker key
  unpacked layers (snapshots) by chain ID, the digest of the layer's diff ID together with every
  layer below it, so a layer changed low in the stack makes every layer above it unpack again,
  even one whose blob the node has and did not download. Counted as the layers' compressed
  sizes: what is decompressed and applied (the tars are larger).

The previous image is the one the state file records as last pushed (`rebuild`, and a build run
from a pipeline config, record one): the tag itself changes with the extras and the platform
version, so a node that runs the template holds the state's image, not the new tag's. Without a
state (a plain build) it is what the tag being pushed named before, read just before the write:
the same tag means the same extras, pushed again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from builder import credentials
from builder.errors import RegistryError, RegistryUnreachable, UserError
from builder.oci.client import RepositoryClient
from builder.oci.remote import platform_image, read
from builder.oci.v1 import Image, Platform
from builder.publish.state import load_state
from builder.reporter import QUIET, Reporter


class NodeUpdateRecord(TypedDict):
    """A `NodeUpdate` in report.json (docs/report.md: `node_update`)."""

    previous: str | None
    download: int
    download_layers: int
    unpack: int
    unpack_layers: int


@dataclass(frozen=True)
class NodeUpdate:
    """One arch's cost on a node holding `previous` (None: the tag named no such image)."""

    previous: str | None  # the previous arch image's manifest digest
    download: int  # compressed bytes of the layers whose blob the previous image lacks
    download_layers: int
    unpack: int  # compressed bytes of the layers whose chain ID the previous image lacks
    unpack_layers: int

    def to_dict(self) -> NodeUpdateRecord:
        return NodeUpdateRecord(
            previous=self.previous,
            download=self.download,
            download_layers=self.download_layers,
            unpack=self.unpack,
            unpack_layers=self.unpack_layers,
        )


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """Each layer's chain ID (the OCI image spec's ChainID of the layers up to it)."""
    chain: list[str] = []
    for diff_id in diff_ids:
        if not chain:
            chain.append(diff_id)
            continue
        joined = f"{chain[-1]} {diff_id}".encode()
        chain.append("sha256:" + hashlib.sha256(joined).hexdigest())
    return chain


def node_update(image: Image, previous: Image | None) -> NodeUpdate:
    """What a node holding `previous` downloads and unpacks to run `image`."""
    had_blobs = {layer.digest for layer in previous.layers} if previous else set()
    had_chains = set(chain_ids(previous.diff_ids)) if previous else set()
    fetched = [layer for layer in image.layers if layer.digest not in had_blobs]
    unpacked = [
        layer
        for layer, chain in zip(image.layers, chain_ids(image.diff_ids), strict=False)
        if chain not in had_chains
    ]
    return NodeUpdate(
        previous.digest if previous else None,
        sum(layer.size for layer in fetched),
        len(fetched),
        sum(layer.size for layer in unpacked),
        len(unpacked),
    )


def baseline(
    state: Path | None, target: RepositoryClient, tag: str
) -> tuple[RepositoryClient, str]:
    """Where the image a node holds now is: the state's last pushed image, else `tag` in the
    target (see the module docstring)."""
    try:
        recorded = load_state(state) if state else None
        ref = recorded.image_reference if recorded else None
        if recorded and recorded.image and ref:
            return credentials.registry(ref, recorded.image, target.retries), ref.reference
    except UserError:
        pass  # an unreadable state is the rebuild's error to report, not a figure's
    return target, tag


def previous_images(
    registry: RepositoryClient, reference: str, arches: Sequence[str], reporter: Reporter = QUIET
) -> tuple[str | None, dict[str, Image]]:
    """What `reference` names now (its digest), and each arch's image in it (none for an arch
    it lacks). A figure never fails a push: an unreadable reference is as good as none, said
    with a warning when the registry could not be reached (the figures count every layer)."""
    try:
        found = read(registry, reference)
        if isinstance(found, Image):
            return found.digest, {a: found for a in arches if found.architecture in ("", a)}
        images = {}
        for arch in arches:
            try:
                images[arch] = platform_image(registry, found, Platform.linux(arch))
            except RegistryUnreachable:
                raise
            except (UserError, RegistryError):
                continue  # the previous index lacks this arch: a node of it has nothing
        return found.digest, images
    except RegistryUnreachable as error:
        reporter.warn(f"{error}; the node-update figures count the image as new to every node")
        return None, {}
    except RegistryError:
        return None, {}


def total(previous: str | None, updates: Sequence[NodeUpdate]) -> NodeUpdate:
    """Every arch's figures added up (a node runs one arch; an operator pays for each);
    `previous` is what the tag named: the previous index, or image."""
    return NodeUpdate(
        previous,
        sum(u.download for u in updates),
        sum(u.download_layers for u in updates),
        sum(u.unpack for u in updates),
        sum(u.unpack_layers for u in updates),
    )
