"""One layer per distribution (builder.layers.layer.wheels_layer): the same wheel gives the same
layer in any set, and the stacked layers hold exactly what one `pip install --target` of the
set (the single-layer writer) holds, whichever order they stack in."""

from __future__ import annotations

import io
import itertools
import tarfile
from pathlib import Path

from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.files import sha256_of
from builder.layers.bytecode import source_of
from builder.layers.extras import distribution_layers, own_layers_as_ready
from builder.layers.layer import LayerWheels, shadowed_files, wheels_layer, write_tar

ROOT = "/app/deps-extra"


def _wheel(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    return make_wheel(tmp_path / "wheels", name, "1.0", "py3-none-any", files)


def _tree(tars: list[bytes]) -> dict[str, tuple[int, bytes | None]]:
    """What stacking `tars` bottom to top gives: path -> (mode, bytes or None for a directory)."""
    tree: dict[str, tuple[int, bytes | None]] = {}
    for data in tars:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive:
                body = archive.extractfile(member) if member.isfile() else None
                tree[member.name] = (member.mode, body.read() if body else None)
    return tree


def _set(tmp_path: Path) -> list[Path]:
    """Three wheels in lock order: a namespace package shared by two, a file shipped by two."""
    return [
        _wheel(
            tmp_path,
            "aaa-one",
            {"google/one/__init__.py": b"ONE = 1\n", "shared/conf.py": b"WHO = 'aaa'\n"},
        ),
        _wheel(tmp_path, "bbb-two", {"google/two/__init__.py": b"TWO = 2\n"}),
        _wheel(
            tmp_path,
            "ccc-three",
            {"shared/conf.py": b"WHO = 'ccc'\n", "three.py": b"THREE = 3\n"},
        ),
    ]


def test_stacked_layers_hold_what_one_install_holds_in_any_order(tmp_path: Path) -> None:
    wheels = _set(tmp_path)
    cache = Cache(tmp_path / "cache")
    shadowed = shadowed_files(wheels)
    assert shadowed[wheels[0]] == {"shared/conf.py"}, "the later wheel's copy wins, as in pip"
    assert shadowed[wheels[1]] == frozenset() and shadowed[wheels[2]] == frozenset()
    layers = [
        wheels_layer(LayerWheels(((sha256_of(w), w),), shadowed[w]), ROOT, cache).path.read_bytes()
        for w in wheels
    ]
    one = io.BytesIO()
    write_tar(one, wheels, ROOT, 0)
    expected = _tree([one.getvalue()])
    for order in itertools.permutations(layers):
        stacked = _tree(list(order))
        assert {k: v[1] for k, v in stacked.items()} == {k: v[1] for k, v in expected.items()}
    assert expected["app/deps-extra/shared/conf.py"][1] == b"WHO = 'ccc'\n"
    assert "app/deps-extra/google/one/__init__.py" in expected
    assert "app/deps-extra/google/two/__init__.py" in expected


def test_the_same_wheel_gives_the_same_layer_in_two_sets(tmp_path: Path) -> None:
    shared = _wheel(tmp_path, "numpyish", {"numpyish/__init__.py": b"X = 1\n"})
    other_a = _wheel(tmp_path, "alpha", {"alpha.py": b"A = 1\n"})
    other_b = _wheel(tmp_path, "omega", {"omega.py": b"O = 1\n"})
    digests = []
    for others, cache_dir in (([other_a], "a"), ([other_b], "b")):
        wheels = [*others, shared]
        shadowed = shadowed_files(wheels)
        layer = wheels_layer(
            LayerWheels(((sha256_of(shared), shared),), shadowed[shared]),
            ROOT,
            Cache(tmp_path / cache_dir),
        )
        digests.append(layer.diff_id)
    assert digests[0] == digests[1]


def test_pyc_paths_name_their_sources() -> None:
    assert source_of("pkg/sub/__pycache__/mod.cpython-313.pyc") == "pkg/sub/mod.py"
    assert source_of("__pycache__/top.cpython-313.pyc") == "top.py"


def test_layers_written_as_wheels_arrive_are_the_stack_written_after(tmp_path: Path) -> None:
    """A wheel's own layer is written as its download ends, before shadowing is known
    (start_own_layers): the stack is the same as when every layer waits for the whole set,
    and the wheel whose file a later one shadows gets its layer without that file."""
    wheels = _set(tmp_path)
    pins = [(w.name.split("-")[0], "1.0", sha256_of(w)) for w in wheels]
    by_sha = {sha256_of(w): w for w in wheels}
    after_all = distribution_layers(pins, by_sha, ROOT, Cache(tmp_path / "after-all"))
    early_cache = Cache(tmp_path / "early")
    marked: list[str] = []
    own_layers_as_ready(
        reversed([(w, sha256_of(w)) for w in wheels]), ROOT, early_cache, marked.append
    )
    assert marked == [sha256_of(w) for w in reversed(wheels)]
    early = distribution_layers(pins, by_sha, ROOT, early_cache)
    assert [one.layer.diff_id for one in early] == [one.layer.diff_id for one in after_all]
    shadowing = next(one for one in early if one.shadowed)
    assert shadowing.shadowed == {"shared/conf.py"}
    with tarfile.open(shadowing.layer.path) as archive:
        assert f"{ROOT[1:]}/shared/conf.py" not in archive.getnames()


def test_a_tampered_layer_in_the_cache_is_made_again(tmp_path: Path) -> None:
    """The tar a context copies out of the cache is checked against its diff ID when found: one
    written over in place is dropped with a warning and written again from the wheel."""
    wheel = _wheel(tmp_path, "solo", {"solo.py": b"S = 1\n"})
    said: list[str] = []
    pins = [("solo", "1.0", sha256_of(wheel))]
    first = distribution_layers(pins, {pins[0][2]: wheel}, ROOT, Cache(tmp_path / "cache"))
    path, clean = first[0].layer.path, first[0].layer.path.read_bytes()
    with path.open("r+b") as edit:
        edit.seek(600)
        edit.write(b"TAMPERED")
    cache = Cache(tmp_path / "cache", warn=said.append)
    again = distribution_layers(pins, {pins[0][2]: wheel}, ROOT, cache)
    assert again[0].layer.path == path and path.read_bytes() == clean
    assert again[0].layer.diff_id == f"sha256:{sha256_of(path)}" == first[0].layer.diff_id
    assert len(said) == 1 and said[0].startswith(f"cache: {path} no longer hashes to")
