"""A second run over the same input downloads nothing and parses no ELF file."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder import fetch, inspect
from builder.cache import Cache
from builder.pipeline import Request, prepare
from builder.target import shipped_profile

pytestmark = pytest.mark.network


def test_second_run_is_served_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("lightgbm\nbeautifulsoup4\n")
    cache = Cache(tmp_path / "cache")

    def request(output: str) -> Request:
        return Request(
            requirement_files=(requirements,),
            constraint_files=(),
            arches=("amd64",),
            base=shipped_profile(),
            output=tmp_path / output,
            cache=cache,
        )

    first = prepare(request("first"))
    assert any(lib.package == "libgomp1" for lib in first.arches[0].libraries)

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"downloaded on the second run: {args[:1]}")

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"inspected a wheel again: {args[:1]}")

    monkeypatch.setattr(fetch, "_open", no_download)
    monkeypatch.setattr(inspect, "read_wheel", no_parse)
    second = prepare(request("second"))
    assert second.to_dict()["architectures"] == first.to_dict()["architectures"]
    assert (tmp_path / "second" / "Dockerfile").read_text() == (
        tmp_path / "first" / "Dockerfile"
    ).read_text()
