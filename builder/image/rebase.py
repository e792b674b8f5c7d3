"""Images as values: put layers on top of a base and write the config and manifest by hand.

This is what `crane append`/`crane rebase` and ko do, with no daemon: the deps-extra layer is
reused by digest on a new base, and only the small new blobs (apt layer, config, manifest) are
new. Pure functions over JSON documents; moving blobs is the registry client's job.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from builder.errors import UserError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
TOOL = "build-sandbox-image"


@dataclass(frozen=True)
class Image:
    """A single-platform image: its manifest and config documents."""

    manifest: dict[str, Any]
    config: dict[str, Any]

    @property
    def config_bytes(self) -> bytes:
        return canonical(self.config)

    @property
    def manifest_bytes(self) -> bytes:
        return canonical(self.manifest)

    @property
    def digest(self) -> str:
        return digest_of(self.manifest_bytes)

    @property
    def layers(self) -> list[dict[str, Any]]:
        return list(self.manifest["layers"])

    @property
    def diff_ids(self) -> list[str]:
        return list(self.config["rootfs"]["diff_ids"])


@dataclass(frozen=True)
class NewLayer:
    """A layer to put on top: its blob's digest and size, its tar's diff ID, and why."""

    digest: str
    diff_id: str
    size: int
    created_by: str


def canonical(document: Mapping[str, Any]) -> bytes:
    """Stable bytes for a document: the same content always has the same digest."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def digest_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def append(
    base: Image,
    layers: Sequence[NewLayer],
    *,
    env: Mapping[str, str],
    user: str,
    labels: Mapping[str, str],
    created: str,
) -> Image:
    """`base` plus `layers`, with `env` set (PYTHONPATH entries appended), `user` and `labels`."""
    if len(base.layers) != len(base.diff_ids):
        raise UserError(f"base image {base.digest}: manifest and config disagree on its layers")
    config = extend_config(base.config, layers, env=env, user=user, labels=labels, created=created)
    docker = base.manifest.get("mediaType") == DOCKER_MANIFEST
    config_bytes = canonical(config)
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST if docker else OCI_MANIFEST,
        "config": {
            "mediaType": DOCKER_CONFIG if docker else OCI_CONFIG,
            "digest": digest_of(config_bytes),
            "size": len(config_bytes),
        },
        "layers": [
            *base.layers,
            *(
                {"mediaType": DOCKER_LAYER if docker else OCI_LAYER, "digest": layer.digest,
                 "size": layer.size}
                for layer in layers
            ),
        ],
    }  # fmt: skip
    if not docker:
        manifest["annotations"] = dict(sorted(labels.items()))
    return Image(manifest, config)


def extend_config(
    base: Mapping[str, Any],
    layers: Sequence[NewLayer],
    *,
    env: Mapping[str, str],
    user: str,
    labels: Mapping[str, str],
    created: str,
) -> dict[str, Any]:
    """The image config of `base` plus `layers`: what `append` writes, and a full build loads.

    Env values may name `${VAR}`'s base value as `$VAR`: PYTHONPATH=`$PYTHONPATH:/app/deps-extra`
    extends the base's path the way the Dockerfile's ENV does, without a stray `:` when unset.
    """
    config = copy.deepcopy(dict(base))
    for stale in ("container", "container_config", "docker_version"):
        config.pop(stale, None)  # they describe the base's own last build step
    settings = config.setdefault("config", {})
    settings["Env"] = _environment(settings.get("Env") or [], env)
    settings["User"] = user
    settings["Labels"] = dict(sorted({**(settings.get("Labels") or {}), **labels}.items()))
    config["created"] = created
    config["rootfs"] = {
        "type": "layers",
        "diff_ids": [*base["rootfs"]["diff_ids"], *(layer.diff_id for layer in layers)],
    }
    config["history"] = [
        *config.get("history", []),
        *(
            {"created": created, "created_by": layer.created_by, "comment": TOOL}
            for layer in layers
        ),
        {
            "created": created,
            "created_by": f"ENV {' '.join(f'{k}={v}' for k, v in env.items())}; USER {user}",
            "comment": TOOL,
            "empty_layer": True,
        },
    ]
    return config


def top(image: Image, base: Image) -> list[NewLayer]:
    """The layers `image` adds over `base`, refusing an image that is not built on `base`."""
    count = len(base.layers)
    digests = [layer["digest"] for layer in image.layers]
    if digests[:count] != [layer["digest"] for layer in base.layers] or (
        image.diff_ids[:count] != base.diff_ids
    ):
        raise UserError(f"image {image.digest} is not built on base {base.digest}")
    history = [h for h in image.config.get("history", []) if not h.get("empty_layer")][count:]
    return [
        NewLayer(
            layer["digest"],
            diff_id,
            layer["size"],
            history[index].get("created_by", "") if index < len(history) else "",
        )
        for index, (layer, diff_id) in enumerate(
            zip(image.layers[count:], image.diff_ids[count:], strict=True)
        )
    ]


def _environment(base_env: Sequence[str], changes: Mapping[str, str]) -> list[str]:
    current = dict(entry.partition("=")[::2] for entry in base_env)
    for key, value in changes.items():
        prefix = f"${key}:"
        if value.startswith(prefix):
            value = (
                f"{current[key]}:{value[len(prefix) :]}"
                if current.get(key)
                else value[len(prefix) :]
            )
        current[key] = value
    return [f"{key}={value}" for key, value in current.items()]
