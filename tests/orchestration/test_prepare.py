"""A second run over the same input resolves, downloads and parses nothing again."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.plans import reference_profile

from builder.cache import Cache
from builder.config import RunSettings
from builder.inspect import wheel_reader as inspect
from builder.orchestration.prepare import Grounds, prepare
from builder.resolve import index as fetch
from builder.resolve import uv as resolve

pytestmark = pytest.mark.usefixtures("package_index")


def test_second_run_is_served_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("lightgbm\nbeautifulsoup4\n")
    base = reference_profile()
    grounds = Grounds(base, ("amd64",), Cache(tmp_path / "cache"))

    def settings(output: str) -> RunSettings:
        return RunSettings((requirements,), base.pinned, output=tmp_path / output)

    first = prepare(settings("first"), grounds)
    assert any(lib.package == "libgomp1" for lib in first.arches[0].libraries)

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"downloaded on the second run: {args[:1]}")

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"inspected a wheel again: {args[:1]}")

    monkeypatch.setattr(fetch, "_open", no_download)

    def no_resolve(*args: object, **kwargs: object) -> None:
        raise AssertionError("ran the resolver again for an unchanged input")

    monkeypatch.setattr(inspect, "read_wheel", no_parse)
    monkeypatch.setattr(resolve, "_uv_compile", no_resolve)
    second = prepare(settings("second"), grounds)
    assert second.to_dict()["architectures"] == first.to_dict()["architectures"]
    assert (tmp_path / "second" / "Dockerfile").read_text() == (
        tmp_path / "first" / "Dockerfile"
    ).read_text()
