"""What a run writes after its push is checked replaceable before anything is built
(builder.publish.writable), the state well-formed too (builder.publish.state.check_state)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.errors import UserError
from builder.publish.state import check_state
from builder.publish.writable import check_replaceable

REPO_ROOT = Path(__file__).resolve().parents[2]
UNSHARE = ("unshare", "--mount", "--propagation", "private")  # a mount namespace of its own


def test_a_file_that_can_be_replaced_passes(tmp_path: Path) -> None:
    check_replaceable(tmp_path / "new.json", "build state")  # not there yet: made on the write
    (tmp_path / "old.json").write_text("{}")
    check_replaceable(tmp_path / "old.json", "build state")
    assert sorted(os.listdir(tmp_path)) == ["old.json"]


@pytest.mark.parametrize(
    ("name", "culprit"),
    [
        ("missing/state.json", "its directory"),
        ("folder", "is not a regular file"),
        ("locked.json", "is read-only (mode 0440)"),
    ],
)
def test_a_file_that_cannot_be_replaced_is_one_line(
    tmp_path: Path, name: str, culprit: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "locked.json").write_text("{}")
    (tmp_path / "locked.json").chmod(0o440)
    with pytest.raises(UserError) as caught:
        check_replaceable(tmp_path / name, "build state")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / name}: {culprit}")
    assert message.endswith("so the build state cannot be written")


@pytest.mark.parametrize("content", [b"[1, 2]", b"{not json", b"\xff\xfe{"])
def test_a_state_that_is_not_one_is_refused_before_the_run(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bsi.state.json"
    path.write_bytes(content)
    with pytest.raises(UserError, match=r"bsi\.state\.json: unreadable build state"):
        check_state(path)
    assert path.read_bytes() == content


def test_no_state_yet_is_none_and_a_state_in_no_directory_is_refused(tmp_path: Path) -> None:
    assert check_state(tmp_path / "bsi.state.json") is None
    with pytest.raises(UserError, match=r"its directory .* does not exist"):
        check_state(tmp_path / "gone" / "bsi.state.json")


def test_a_file_on_a_read_only_file_system_is_refused(tmp_path: Path) -> None:
    """A real read-only mount (a tmpfs remounted ro in a mount namespace of its own)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a read-only file system")
    mount = tmp_path / "ro"
    mount.mkdir()
    probe = (
        "import sys; from pathlib import Path; from builder.errors import UserError;"
        " from builder.publish.writable import check_replaceable\n"
        "try:\n check_replaceable(Path(sys.argv[1]), 'template')\n"
        "except UserError as error:\n print(error)\n"
    )
    script = (
        'mount -t tmpfs tmpfs "$1" && echo x > "$1/t.yaml" && mount -o remount,ro "$1"'
        ' && exec "$2" -c "$3" "$1/t.yaml"'
    )
    result = subprocess.run(
        [*UNSHARE, "sh", "-c", script, "sh", str(mount), sys.executable, probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )
    if "mount" in result.stderr and result.returncode:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")
    assert result.stdout == (
        f"{mount}/t.yaml: is on a read-only file system, so the template cannot be written\n"
    )
