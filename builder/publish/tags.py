"""Name what is published: the tag of a platform version and extras set.

Tags are for people and CI logs; the SandboxTemplate gets `repository@sha256:…`. The writes
themselves are builder.oci.remote's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from builder.digest import Sha256
from builder.errors import UserError

TAG_MAX = 128
HASH_LENGTH = 12


def extras_hash(lock_texts: Iterable[str]) -> str:
    """Short, order-independent fingerprint of the resolved extras (locks and apt sets per arch).

    Part of the tag, so two different extension sets for one platform version never overwrite
    each other's tag. Each text is length-prefixed so no two different lists hash alike.
    """
    digest = Sha256()
    for text in sorted(lock_texts):
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hex[:HASH_LENGTH]


def image_tag(platform_version: str, extras_hash: str) -> str:
    """The tag to push: `<platform-version>-x<extras hash>`.

    The platform version is made tag-safe (other characters become `-`) and shortened so the tag
    stays within docker's 128 characters while the hash part is always kept whole.
    """
    if not re.fullmatch(rf"[0-9a-f]{{{HASH_LENGTH},}}", extras_hash):
        raise ValueError(f"extras hash {extras_hash!r} is not hex of {HASH_LENGTH}+ digits")
    suffix = f"-x{extras_hash[:HASH_LENGTH]}"
    version = re.sub(r"[^A-Za-z0-9_.-]", "-", platform_version).lstrip(".-")
    version = version[: TAG_MAX - len(suffix)]
    if not version:
        raise UserError(f"platform version {platform_version!r} has nothing usable in an image tag")
    return f"{version}{suffix}"
