"""A wheel's names and its unpacked size, checked before anything unpacks it (issue 59).

Real wheels from the tests' wheel factory: names that would leave their root (console and
gui scripts, members, `.data` paths) are refused in one line naming the wheel, by the check a
download is held to and by the layout the layer writer follows; a zip bomb is refused from its
zip directory alone, in well under a second; a member whose declared size lies is cut there and
refused, and the layer it was going into leaves nothing behind.
"""

from __future__ import annotations

import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.wheelfactory import make_wheel, zip_bomb

from builder.cache import Cache
from builder.errors import UserError
from builder.inspect.members import (
    RATIO_FLOOR,
    UNPACKED_MAX,
    check_unpacked_size,
    path_fault,
    script_fault,
)
from builder.inspect.wheel_reader import check_housed, check_wheel, read_wheel
from builder.layers.install_layout import install_entries
from builder.layers.layer import LayerWheels, wheels_layer

INFO = "bsi_named-1.0.dist-info"
DATA = "bsi_named-1.0.data"


def _entry_points(section: str, name: str) -> dict[str, bytes]:
    return {f"{INFO}/entry_points.txt": f"[{section}]\n{name} = bsi_named:main\n".encode()}


def _laid_out(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return [entry.path for entry in install_entries(archive, 0, wheel.name)]


@pytest.mark.parametrize(
    ("files", "said"),
    [
        (_entry_points("console_scripts", "../../../etc/x"), "console script '../../../etc/x'"),
        (_entry_points("console_scripts", "-rf"), "console script '-rf' is not a plain"),
        (_entry_points("gui_scripts", ".profile"), "gui script '.profile' is not a plain"),
        (_entry_points("console_scripts", "a\\b"), "console script 'a\\\\b'"),
        (_entry_points("console_scripts", "tab\tname"), "holds a control character"),
        (_entry_points("console_scripts", "x" * 300), "'" + "x" * 80 + "'… has a name longer"),
        ({"bsi_named/" + "y" * 256 + ".py": b""}, "has a name longer than 255 bytes"),
        ({"../evil.py": b""}, "member '../evil.py' leaves its root"),
        ({"/etc/evil.py": b""}, "member '/etc/evil.py' is absolute"),
        ({"bsi_named/./x.py": b""}, "has an empty or '.' part"),
        ({f"{DATA}/scripts/../../../etc/x": b""}, "leaves its root"),
        ({f"{DATA}/purelib/../../x.py": b""}, "leaves its root"),
        ({f"{DATA}/elsewhere/x": b""}, "is under no install scheme"),
    ],
)
def test_a_name_out_of_its_root_is_refused_naming_the_wheel(
    tmp_path: Path, files: dict[str, bytes], said: str
) -> None:
    wheel = make_wheel(tmp_path, "bsi-named", "1.0", "py3-none-any", files)
    for check in (check_wheel, _laid_out):  # as the download ends, and as the layer lays it out
        with pytest.raises(UserError) as refused:
            check(wheel)
        message = str(refused.value)
        assert message.startswith(f"{wheel.name}: ") and said in message
        assert "\n" not in message and len(message) < 300


def test_a_member_compressed_otherwise_than_deflate_is_refused(tmp_path: Path) -> None:
    """zipfile inflates bzip2 and lzma with no bound on one read's output."""
    wheel = make_wheel(tmp_path, "bsi-named", "1.0", "py3-none-any", {})
    with zipfile.ZipFile(wheel, "a", zipfile.ZIP_BZIP2) as archive:
        archive.writestr("bsi_named/data.bin", bytes(1000))
    with pytest.raises(UserError, match=r"'bsi_named/data.bin' is compressed with method 12"):
        check_wheel(wheel)


def test_plain_names_are_laid_out_where_pip_puts_them(tmp_path: Path) -> None:
    files = {
        **_entry_points("console_scripts", "bsi-named.tool_2"),
        "bsi_named/__init__.py": b"",
        f"{DATA}/scripts/run-it": b"#!python\n",
        f"{DATA}/purelib/bsi_extra.py": b"",
        f"{DATA}/data/share/doc.txt": b"",
    }
    wheel = make_wheel(tmp_path, "bsi-named", "1.0", "py3-none-any", files)
    check_wheel(wheel)
    paths = _laid_out(wheel)
    assert {"bin/bsi-named.tool_2", "bin/run-it", "bsi_extra.py", "bsi_named/__init__.py"} <= {
        *paths
    }
    assert not any(path.startswith(("/", "..")) or "share/doc.txt" in path for path in paths)


@pytest.mark.parametrize(
    "path", ["a/b.py", "pkg/__init__.py", "x.dist-info/RECORD", "a b/c~d.py", "é/ü.py"]
)
def test_plain_paths_and_names_pass(path: str) -> None:
    assert path_fault(path) is None
    assert script_fault(path.rsplit("/", 1)[-1]) is None


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """256 MiB of zeros in a wheel of about 256 kB."""
    return zip_bomb(tmp_path_factory.mktemp("bomb"), "bsi-bomb", 256 << 20)


def test_a_zip_bomb_is_refused_from_its_directory_in_no_time(bomb: Path) -> None:
    assert bomb.stat().st_size < 1 << 20
    started = time.monotonic()
    with pytest.raises(UserError) as refused:
        check_wheel(bomb, limit=64 << 20)
    assert time.monotonic() - started < 1
    message = str(refused.value)
    assert message.startswith(f"{bomb.name}: unpacks to 268.4 MB from ")
    assert "more than the bound of 67.1 MB" in message and "--wheel-max" in message
    check_wheel(bomb)  # under the default bound and the ratio's floor
    check_wheel(bomb, limit=0)


def test_a_wheelhouse_s_wheels_are_held_to_their_size_alone(bomb: Path, tmp_path: Path) -> None:
    """Before uv unpacks them: a wheelhouse may hold wheels the run never picks, whose names
    are checked if it does, and files uv is to refuse itself."""
    with pytest.raises(UserError, match=r"unpacks to 268\.4 MB"):
        check_housed(bomb, limit=64 << 20)
    odd = make_wheel(tmp_path, "bsi-odd", "1.0", "py3-none-any", {"../odd.py": b""})
    check_housed(odd)
    with pytest.raises(UserError, match=r"'\.\./odd\.py' leaves its root"):
        check_wheel(odd)
    broken = tmp_path / "bsi_broken-1.0-py3-none-any.whl"
    broken.write_bytes(b"PK\x03\x04 not a zip")
    check_housed(broken)


def _infos(*sizes: int) -> list[zipfile.ZipInfo]:
    infos = []
    for index, size in enumerate(sizes):
        info = zipfile.ZipInfo(f"bsi_big/part{index}.bin")
        info.file_size = size
        infos.append(info)
    return infos


def test_past_its_floor_a_wheel_unpacking_to_100_times_its_size_is_refused(
    tmp_path: Path,
) -> None:
    """torch's CUDA wheel unpacks to about 2 GB from 900 MB, real wheels to under 10 times;
    a zip bomb to 1000 times: past 1 GiB, 100 times its size is refused."""
    wheel = tmp_path / "bsi_big-1.0-py3-none-any.whl"
    wheel.write_bytes(bytes(20 << 20))  # only its size is read here
    check_unpacked_size(_infos(RATIO_FLOOR), wheel, UNPACKED_MAX)  # 51 times: a real wheel's
    check_unpacked_size(_infos(1 << 30, 900 << 20), wheel, UNPACKED_MAX)  # 96 times
    with pytest.raises(UserError, match=r"unpacks to 2\.1 GB from 21\.0 MB, more than 100 times"):
        check_unpacked_size(_infos(1 << 30, 1 << 30), wheel, UNPACKED_MAX)
    with pytest.raises(UserError, match=r"more than the bound of 8\.6 GB"):
        check_unpacked_size(_infos(5 << 30, 4 << 30), wheel, UNPACKED_MAX)
    check_unpacked_size(_infos(5 << 30, 4 << 30), wheel, 0)  # 0: unbounded


def _file_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


@pytest.fixture(scope="module")
def liar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A wheel whose 64 MiB module declares 1000 bytes: its sum passes any bound."""
    directory = tmp_path_factory.mktemp("liar")
    yield zip_bomb(directory, "bsi-liar", 64 << 20, declared=1000, member="bsi_liar/big.py")


def test_a_member_inflating_past_its_declared_size_is_cut_there_and_refused(
    liar: Path, tmp_path: Path
) -> None:
    check_wheel(liar, limit=1 << 20)  # what it declares is small: the readers hold it to that
    cache = Cache(tmp_path / "cache")
    started = time.monotonic()
    with pytest.raises(UserError) as refused:
        wheels_layer(LayerWheels((("0" * 64, liar),)), "app/deps-extra", cache)
    message = str(refused.value)
    assert message.startswith(f"{liar.name}: 'bsi_liar/big.py' does not unpack (Bad CRC-32")
    with pytest.raises(UserError, match=f"{liar.name}: .*Bad CRC-32"):
        read_wheel(liar, "0" * 64)
    assert time.monotonic() - started < 10
    assert _file_bytes(tmp_path) < 1 << 20  # no layer, no temporary file left


def test_a_file_that_is_another_s_directory_is_refused_naming_both(tmp_path: Path) -> None:
    """`docker load` fails on such a layer naming nothing: a script file `bin/tool` and a
    `.data/scripts/tool/x` of another distribution would make one."""
    scripts = {"bsi_first-1.0.dist-info/entry_points.txt": b"[console_scripts]\ntool = a:b\n"}
    first = make_wheel(tmp_path, "bsi-first", "1.0", "py3-none-any", scripts)
    second = make_wheel(
        tmp_path, "bsi-second", "1.0", "py3-none-any", {"bsi_second-1.0.data/scripts/tool/x": b""}
    )
    with pytest.raises(UserError) as refused:
        wheels_layer(
            LayerWheels((("1" * 64, first), ("2" * 64, second))), "app/deps-extra", Cache(tmp_path)
        )
    assert str(refused.value) == (
        f"{first.name}: 'bin/tool' is a file, and {second.name} has 'bin/tool/x' under it"
    )
