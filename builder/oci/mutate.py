"""Images as values: put layers on top of a base, set its config, take the layers of another.

What `crane append`/`crane rebase` and ko do, with no daemon: the deps-extra layer is reused
by digest on a new base, and only the small new blobs (apt layer, config, manifest) are new.
Pure functions from values to values; moving blobs is `remote`'s job.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from builder.errors import UserError
from builder.oci.v1 import ConfigFile, Descriptor, Image, canonical

TOOL = "build-sandbox-image"


@dataclass(frozen=True)
class NewLayer:
    """A layer to put on top: its blob's digest and size, its tar's diff ID, and why."""

    digest: str
    diff_id: str
    size: int
    created_by: str


@dataclass(frozen=True)
class ConfigChange:
    """What the tool sets in an image config: env (PYTHONPATH appended), user, labels, date."""

    env: Mapping[str, str]
    user: str
    labels: Mapping[str, str]
    created: str


def append(base: Image, layers: Sequence[NewLayer], change: ConfigChange) -> Image:
    """`base` plus `layers`, with the config `change` applied; typed as the base is."""
    if len(base.layers) != len(base.diff_ids):
        raise UserError(f"base image {base.digest}: manifest and config disagree on its layers")
    config = canonical(extend_config(base.config, layers, change))
    added = (Descriptor("", layer.digest, layer.size) for layer in layers)
    return Image.build(
        config, [*base.layers, *added], docker=base.is_docker, annotations=change.labels
    )


def extend_config(
    base: Mapping[str, Any], layers: Sequence[NewLayer], change: ConfigChange
) -> dict[str, Any]:
    """The image config of `base` plus `layers`: what `append` writes, and a full build loads.

    Env values may name `${VAR}`'s base value as `$VAR`: PYTHONPATH=`$PYTHONPATH:/app/deps-extra`
    extends the base's path the way the Dockerfile's ENV does, without a stray `:` when unset.
    """
    read = ConfigFile.of(base)
    config: dict[str, Any] = copy.deepcopy(dict(base))
    for stale in ("container", "container_config", "docker_version"):
        config.pop(stale, None)  # they describe the base's own last build step
    settings = config.setdefault("config", {})
    settings["Env"] = _environment(read.env, change.env)
    settings["User"] = change.user
    settings["Labels"] = dict(sorted({**read.labels, **change.labels}.items()))
    config["created"] = change.created
    config["rootfs"] = {
        "type": "layers",
        "diff_ids": [*read.diff_ids, *(layer.diff_id for layer in layers)],
    }
    env = " ".join(f"{key}={value}" for key, value in change.env.items())
    config["history"] = [
        *config.get("history", []),
        *(
            {"created": change.created, "created_by": layer.created_by, "comment": TOOL}
            for layer in layers
        ),
        {
            "created": change.created,
            "created_by": f"ENV {env}; USER {change.user}",
            "comment": TOOL,
            "empty_layer": True,
        },
    ]
    return config


def bare_config(architecture: str, diff_ids: Sequence[str], labels: Mapping[str, str]) -> bytes:
    """A config naming only `diff_ids` and `labels`: what an engine loads layers under before
    the image's own config exists."""
    config = {
        "architecture": architecture,
        "os": "linux",
        "config": {"Labels": dict(labels)},
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
    }
    return canonical(config)


def top(image: Image, base: Image) -> list[NewLayer]:
    """The layers `image` adds over `base`, refusing an image that is not built on `base`."""
    count = len(base.layers)
    digests = [layer.digest for layer in image.layers]
    if digests[:count] != [layer.digest for layer in base.layers] or (
        image.diff_ids[:count] != base.diff_ids
    ):
        raise UserError(f"image {image.digest} is not built on base {base.digest}")
    history = [h for h in image.config_file.history if not h.empty_layer][count:]
    return [
        NewLayer(
            layer.digest,
            diff_id,
            layer.size,
            history[index].created_by if index < len(history) else "",
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
