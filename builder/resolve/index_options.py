"""Which indexes a run reads, and which PyTorch build it asks uv for.

An index over plain http is read only on this machine's loopback (a test's, a local mirror's):
pip ignores any other unless its host is declared trusted, since anyone on the path could serve
other files, with the hashes to match, and read the credentials the URL carries. uv's
`--torch-backend` takes the PyTorch family from PyTorch's own index for one build (`cpu`: no
CUDA wheels); `auto` is refused, as it would detect the build machine's GPU, which is neither
the sandbox node's nor the same on every CI runner.
"""

from __future__ import annotations

import re
import urllib.parse

from builder.errors import UserError
from builder.oci.name import is_loopback

TORCH_BACKEND = re.compile(r"cpu|xpu|cu[0-9]{2,3}|rocm[0-9]+(\.[0-9]+)*")


def index_url(url: str, option: str, origin: str) -> str:
    """`url`, unless it names an index over plain http on another host than loopback; the
    refusal names the host only (the URL's path or user part may carry a token)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() != "http" or is_loopback(parts.hostname or ""):
        return url
    raise UserError(
        f"{origin}: {option} http://{parts.hostname}/…: plain http is not accepted for an index"
        " on another host; use https (plain http only on loopback: 127.0.0.1, ::1, localhost)"
    )


def torch_backend(value: str, where: str) -> str:
    """`value` as uv's --torch-backend, when it names one build (cpu, cu128, rocm6.4, xpu)."""
    if value == "auto":
        raise UserError(
            f"{where}: torch backend 'auto' would pick the build machine's GPU, not the"
            " sandbox node's; name one (cpu, cu128, …)"
        )
    if not TORCH_BACKEND.fullmatch(value):
        raise UserError(
            f"{where}: torch backend {value[:20]!r} is not one of uv's (cpu, cu128, rocm6.4, xpu)"
        )
    return value
