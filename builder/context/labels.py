"""OCI annotations/labels that let a base-aware tool (crane rebase, a registry UI) read an image.

Every value derives from the inputs, never from the clock: `.created` is the lock's
SOURCE_DATE_EPOCH, so the same inputs give the same config bytes and the same digest.
"""

from __future__ import annotations

import datetime
from importlib import metadata

from builder.contract import BYTECODE_LABEL

BASE_NAME = "org.opencontainers.image.base.name"
BASE_DIGEST = "org.opencontainers.image.base.digest"
CREATED = "org.opencontainers.image.created"
VERSION = "org.opencontainers.image.version"
TOOL_VERSION = "org.build-sandbox-image.version"
BYTECODE = BYTECODE_LABEL  # verify reads it too: its home is the contract
DISTRIBUTION = "build-sandbox-image"


def tool_version() -> str:
    """The installed tool's version; a source checkout that is not installed says so."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def created(epoch: int) -> str:
    """RFC 3339 in UTC, as OCI asks for `created`."""
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def image_labels(
    base_name: str,
    base_digest: str | None,
    epoch: int,
    platform_version: str,
    extras: str,
    bytecode: str | None = None,
) -> dict[str, str]:
    """Labels for an image or index built on `base_name` (a tag, without the digest).

    `bytecode`: the BYTECODE label's value, when the image has extras.
    """
    labels = {
        BASE_NAME: base_name.split("@", 1)[0],
        CREATED: created(epoch),
        VERSION: f"{platform_version}-x{extras}",
        TOOL_VERSION: tool_version(),
    }
    if base_digest:
        labels[BASE_DIGEST] = base_digest
    if bytecode is not None:
        labels[BYTECODE] = bytecode
    return dict(sorted(labels.items()))
