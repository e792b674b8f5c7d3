"""A layer pulled from a --cache-from image stands for its wheels' layer only when it is exactly
what the writer makes of them: the same members, types, modes, owner, date and bytes."""

from __future__ import annotations

import copy as copy_module
import io
import tarfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from layers.test_layer import layer_of, wheels

from builder.cache import Cache
from builder.layers.install_layout import Expected, Member, layer_mismatch, tar_bound
from builder.layers.layer import Layer, expected_layer, pulled_mismatch

ROOT = "/app/deps-extra"
Forge = Callable[[tarfile.TarInfo, bytes], list[tuple[tarfile.TarInfo, bytes]]]


def changed(info: tarfile.TarInfo, **fields: object) -> tarfile.TarInfo:
    """A copy of `info` with `fields` changed (TarInfo.replace is Python 3.12's; 3.11 is the
    floor)."""
    copy = copy_module.copy(info)
    for name, value in fields.items():
        setattr(copy, name, value)
    return copy


def check(layer: Layer, files: list[Path], shadowed: frozenset[str] = frozenset()) -> str | None:
    return pulled_mismatch(layer, expected_layer(files, ROOT, shadowed))


def forged(good: Layer, path: Path, forge: Forge) -> Layer:
    """`good`'s tar rewritten member by member through `forge` (PAX, as the writer writes)."""
    with tarfile.open(good.path) as tar, tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as out:
        for info in tar.getmembers():
            body = tar.extractfile(info).read() if info.isfile() else b""  # type: ignore[union-attr]
            for one, data in forge(info, body):
                one.size = len(data) if one.isfile() else 0
                out.addfile(one, io.BytesIO(data) if one.isfile() else None)
    return replace(good, path=path)


def first_file(info: tarfile.TarInfo) -> bool:
    return info.name.endswith("alpha/__init__.py")


def extra(info: tarfile.TarInfo, body: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    if not first_file(info):
        return [(info, body)]
    more = replace_name(info, info.name.replace("__init__", "evil"))
    return [(info, body), (more, b"import os\n")]


def replace_name(info: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    return changed(info, name=name)


def edit(change: Callable[[tarfile.TarInfo, bytes], tuple[tarfile.TarInfo, bytes] | None]) -> Forge:
    def forge(info: tarfile.TarInfo, body: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
        if not first_file(info):
            return [(info, body)]
        changed = change(info, body)
        return [] if changed is None else [changed]

    return forge


def symlinked(info: tarfile.TarInfo, body: bytes) -> tuple[tarfile.TarInfo, bytes]:
    link = changed(info, linkname="/etc/passwd")
    link.type = tarfile.SYMTYPE
    return link, b""


FORGES: dict[str, tuple[Forge, str]] = {
    "an extra file": (extra, "is not a file these wheels install"),
    "a path out of the root": (
        edit(lambda info, body: (changed(info, name="app/deps-extra/../../etc/profile"), body)),
        "is not a file these wheels install",
    ),
    "a symlink": (edit(symlinked), "is not a regular file"),
    "a setuid file": (edit(lambda info, body: (changed(info, mode=0o4755), body)), "has mode"),
    "another owner": (edit(lambda info, body: (changed(info, uid=1000), body)), "owned by root"),
    "another date": (edit(lambda info, body: (changed(info, mtime=1), body)), "is dated"),
    "other bytes": (
        edit(lambda info, body: (info, b"import os; os.system('id')\n")),
        "does not hold what the wheel's RECORD says",
    ),
    "a missing file": (edit(lambda info, body: None), "is missing"),
    "a file twice": (lambda info, body: [(info, body)] * (2 if first_file(info) else 1), "twice"),
}


def test_the_writers_own_layer_is_its_wheels(tmp_path: Path) -> None:
    files = wheels(tmp_path)
    good = layer_of(files, Cache(tmp_path / "c"))
    assert check(good, files) is None
    assert good.size <= tar_bound(expected_layer(files, ROOT, frozenset()).members)
    # the same tar rewritten member by member, unchanged, is still it
    assert check(forged(good, tmp_path / "same.tar", extra_none), files, frozenset()) is None


def extra_none(info: tarfile.TarInfo, body: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    return [(info, body)]


@pytest.mark.parametrize("case", sorted(FORGES))
def test_a_forged_layer_is_not_its_wheels(tmp_path: Path, case: str) -> None:
    files = wheels(tmp_path)
    good = layer_of(files, Cache(tmp_path / "c"))
    forge, why = FORGES[case]
    problem = check(forged(good, tmp_path / "forged.tar", forge), files, frozenset())
    assert problem is not None and why in problem


def test_a_layer_of_other_wheels_or_another_date_is_not_its_wheels(tmp_path: Path) -> None:
    files = wheels(tmp_path)
    good = layer_of(files, Cache(tmp_path / "c"))
    problem = check(good, files[:1], frozenset())
    assert problem is not None and "is not a file these wheels install" in problem
    shadowed = check(good, files, frozenset({"alpha/__init__.py"}))
    assert shadowed is not None and "alpha/__init__.py" in shadowed
    dated = check(replace(good, source_date_epoch=1), files, frozenset())
    assert dated is not None and "date" in dated


def test_a_pax_header_the_writer_never_writes_is_refused() -> None:
    expected = {"a": Expected(0o644, 1, "00" * 32)}
    member = Member("a", tarfile.REGTYPE, 0o644, 0, 0, ("", ""), 5, 1, "00" * 32)
    assert layer_mismatch(expected, [member], 5) is None
    capability = replace(member, headers=("SCHILY.xattr.security.capability",))
    assert "header" in str(layer_mismatch(expected, [capability], 5))
    hardlink = replace(member, type=tarfile.LNKTYPE)
    assert "regular file" in str(layer_mismatch(expected, [hardlink], 5))
