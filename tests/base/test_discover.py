"""Which facts a run plans against when it has no engine client: the shipped profile, said as
a note for the reference base it was read from and as a warning naming both images for any
other (the engine-held case: tests/integration/test_plan_local_base.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.base import discover
from builder.base.discover import base_profile
from builder.cache import Cache
from builder.oci.name import ImageRef
from builder.reporter import Reporter
from builder.resolve.target import REFERENCE_BASE, shipped_profile


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine answers (make test-fast covers the socket; elsewhere this says so)."""
    monkeypatch.setattr(discover, "engine_client", lambda: None)


@pytest.mark.usefixtures("no_engine")
@pytest.mark.parametrize(
    ("image", "kind"), [(REFERENCE_BASE, "note: "), ("my-runtime:2", "warning: ")]
)
def test_the_shipped_fallback_is_a_warning_for_another_base(
    image: str, kind: str, tmp_path: Path
) -> None:
    lines: list[str] = []
    ref = ImageRef.parse(image)
    profile = base_profile(ref, None, Cache(tmp_path / "cache"), Reporter(lines.append))
    assert profile == shipped_profile(ref)
    assert len(lines) == 1 and lines[0].startswith(kind), lines
    assert REFERENCE_BASE in lines[0] and image in lines[0]
