"""OCI annotations/labels that let a base-aware tool (crane rebase, a registry UI) read an image.

Every value derives from the inputs, never from the clock: `.created` is the lock's
SOURCE_DATE_EPOCH, so the same inputs give the same config bytes and the same digest.
"""

from __future__ import annotations

import datetime
from importlib import metadata

BASE_NAME = "org.opencontainers.image.base.name"
BASE_DIGEST = "org.opencontainers.image.base.digest"
CREATED = "org.opencontainers.image.created"
VERSION = "org.opencontainers.image.version"
TOOL_VERSION = "org.build-sandbox-image.version"
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
    base_name: str, base_digest: str | None, epoch: int, platform_version: str, extras: str
) -> dict[str, str]:
    """Labels for an image or index built on `base_name` (a tag, without the digest)."""
    labels = {
        BASE_NAME: base_name.split("@", 1)[0],
        CREATED: created(epoch),
        VERSION: f"{platform_version}-x{extras}",
        TOOL_VERSION: tool_version(),
    }
    if base_digest:
        labels[BASE_DIGEST] = base_digest
    return dict(sorted(labels.items()))
