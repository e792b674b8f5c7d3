"""verify's `soci` line: the SOCI index attached to a pushed image, checked. Words only.

Apart from builder/cli/app.py so that module stays within its size; the check itself is
builder.layers.soci.attached_index_problems.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from builder.errors import RegistryError, UserError
from builder.verify.report import Check

if TYPE_CHECKING:
    from builder.oci.name import ImageRef
    from builder.retry import Retries


def soci_check(image: ImageRef, retries: Retries) -> Check | None:
    """Its SOCI index names only the image's layers and each ztoc matches its layer; None when
    `image` names no registry or carries no index (nothing to check)."""
    from builder.layers.soci import attached_index_problems

    try:
        found = attached_index_problems(image, retries)
    except (RegistryError, UserError) as error:
        return Check("soci", False, f"the SOCI index could not be read: {error}")
    if found is None:
        return None
    index, problems = found
    detail = "; ".join(problems[:3]) if problems else f"{index}: every ztoc matches its layer"
    return Check("soci", not problems, detail)
