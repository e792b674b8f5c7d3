"""The extras as one layer per distribution (builder.layers.extras): digests that depend on the
wheel alone, a bump that rewrites only its own layer, a budget kept, and the stack holding what
one `pip install --target` of the set holds."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.files import sha256_of
from builder.layers.extras import LayerKind, distribution_layers
from builder.layers.layer import write_tar
from builder.plan.layering import BUCKETS

ROOT = "/app/deps-extra"


def _wheel(tmp_path: Path, name: str, files: dict[str, bytes], version: str = "1.0") -> Path:
    return make_wheel(tmp_path / "wheels" / version, name, version, "py3-none-any", files)


def _pins(wheels: list[Path]) -> tuple[list[tuple[str, str, str]], dict[str, Path]]:
    """Lock-order pins (name, version, sha256) and the sha256 -> file map the writer reads."""
    pins = []
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        pins.append((name.replace("_", "-"), version, sha256_of(wheel)))
    return pins, {sha256_of(w): w for w in wheels}


def _stack(tmp_path: Path, wheels: list[Path], cache: str, budget: int = 48) -> dict[str, str]:
    """Each layer's distributions (joined) -> its diff ID."""
    pins, paths = _pins(wheels)
    stack = distribution_layers(pins, paths, ROOT, Cache(tmp_path / cache), budget)
    assert all(one.kind == LayerKind.DISTRIBUTION for one in stack)
    return {" ".join(one.names): one.layer.diff_id for one in stack}


def _tree(tars: list[bytes]) -> dict[str, bytes | None]:
    tree: dict[str, bytes | None] = {}
    for data in tars:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive:
                body = archive.extractfile(member) if member.isfile() else None
                tree[member.name] = body.read() if body else None
    return tree


def test_the_same_wheel_gives_the_same_layer_in_two_sets(tmp_path: Path) -> None:
    shared = _wheel(tmp_path, "numpyish", {"numpyish/__init__.py": b"X = 1\n" * 500})
    alpha = _wheel(tmp_path, "alpha", {"alpha.py": b"A = 1\n"})
    omega = _wheel(tmp_path, "omega", {"omega.py": b"O = 1\n", "omega2.py": b"O = 2\n"})
    first = _stack(tmp_path, [alpha, shared], "one")
    second = _stack(tmp_path, [shared, omega], "two")
    assert first["numpyish"] == second["numpyish"]
    assert list(first) == ["numpyish", "alpha"]  # largest lowest


def test_a_bump_rewrites_only_its_own_layer(tmp_path: Path) -> None:
    big = _wheel(tmp_path, "big", {"big/__init__.py": b"B = 1\n" * 1000})
    small = _wheel(tmp_path, "small", {"small.py": b"S = 1\n"})
    other = _wheel(tmp_path, "other", {"other.py": b"O = 1\n" * 10})
    bumped = _wheel(tmp_path, "small", {"small.py": b"S = 2\n"}, version="2.0")
    before = _stack(tmp_path, [big, other, small], "c")
    after = _stack(tmp_path, [big, other, bumped], "c")
    assert before["big"] == after["big"] and before["other"] == after["other"]
    assert before["small"] != after["small"]


def test_a_set_over_the_budget_stays_within_it_and_a_change_rewrites_only_its_bucket(
    tmp_path: Path,
) -> None:
    wheels = [
        _wheel(tmp_path, f"dist{i:02d}", {f"dist{i:02d}.py": b"# x\n" * (100 * (i + 1))})
        for i in range(12)
    ]
    budget = BUCKETS + 3
    before = _stack(tmp_path, wheels, "c", budget)
    assert len(before) <= budget
    assert {"dist11", "dist10", "dist09"} <= set(before)  # the largest keep their own layers
    changed = _wheel(tmp_path, "dist00", {"dist00.py": b"# y\n" * 100}, version="2.0")
    after = _stack(tmp_path, [changed, *wheels[1:]], "c", budget)
    assert len(after) == len(before)
    differing = [names for names in before if before[names] != after.get(names)]
    assert len(differing) == 1 and "dist00" in differing[0].split()


def test_two_distributions_writing_one_path_end_as_pip_leaves_them(tmp_path: Path) -> None:
    """Lock order decides, as `pip install` of the set does: the later distribution's copy;
    a namespace directory stays in both layers; the stack holds what one install holds."""
    wheels = [
        _wheel(
            tmp_path,
            "aaa-one",
            {"google/one/__init__.py": b"ONE = 1\n" * 50, "shared/conf.py": b"WHO = 'aaa'\n"},
        ),
        _wheel(tmp_path, "bbb-two", {"google/two/__init__.py": b"TWO = 2\n"}),
        _wheel(tmp_path, "ccc-three", {"shared/conf.py": b"WHO = 'ccc'\n", "three.py": b"3\n"}),
    ]
    pins, paths = _pins(wheels)
    stack = distribution_layers(pins, paths, ROOT, Cache(tmp_path / "c"))
    assert stack[0].names == ("aaa-one",)  # the largest is lowest, below its file's winner
    stacked = _tree([one.layer.path.read_bytes() for one in stack])
    whole = io.BytesIO()
    write_tar(whole, wheels, ROOT, 0)
    assert stacked == _tree([whole.getvalue()])
    assert stacked["app/deps-extra/shared/conf.py"] == b"WHO = 'ccc'\n"
    assert "app/deps-extra/google/one/__init__.py" in stacked
    assert "app/deps-extra/google/two/__init__.py" in stacked


def test_a_rerun_reads_the_stack_from_its_record(tmp_path: Path) -> None:
    wheels = [_wheel(tmp_path, "alpha", {"alpha.py": b"A = 1\n"})]
    pins, paths = _pins(wheels)
    cache = Cache(tmp_path / "c")
    first = distribution_layers(pins, paths, ROOT, cache)
    assert distribution_layers(pins, {}, ROOT, cache) == first  # no wheel needed the second time


def test_an_empty_set_still_gets_the_root_in_one_layer(tmp_path: Path) -> None:
    stack = distribution_layers([], {}, ROOT, Cache(tmp_path / "c"))
    assert len(stack) == 1 and stack[0].names == ()
    assert "app/deps-extra" in _tree([stack[0].layer.path.read_bytes()])
