"""The server run as the sandbox user from wherever the checkout lives (issue 39).

A checkout under a directory only its owner may enter (a 0700 home, anything under
``mktemp -d``) is out of uid 65532's reach: the tests that run the server as that user run a
copy of it (support.sandboxserver.reachable_copy), and what still cannot work fails at once
with one line naming the directory, the uid and the permission, not after a wait.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import sandboxserver
from support.sandboxserver import (
    SANDBOX_UID,
    ServerProcess,
    as_sandbox_user,
    reach_problem,
    reachable_copy,
    sandbox_dir,
)

from builder.runtime import SERVER, copy_server

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a server of another uid needs root")


@pytest.fixture
def private_checkout() -> Iterator[Path]:
    """The server package of a checkout cloned into a 0700 directory whose name holds a space
    (in a directory anyone may enter), its files as a umask of 077 leaves them (0700
    directories, 0600 files)."""
    parent = sandbox_dir()
    os.chown(parent, 0, 0)
    checkout = parent / "my checkout"
    server = checkout / "builder" / "runtime" / "server"
    copy_server(server)
    for directory, _, files in os.walk(checkout):
        os.chmod(directory, 0o700)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o600)
    yield server
    shutil.rmtree(parent)


def test_the_sandbox_user_runs_a_copy_of_a_server_it_could_not_reach(
    private_checkout: Path, sandbox_workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandboxserver, "SERVER", private_checkout)
    assert reach_problem(SANDBOX_UID, private_checkout / "__main__.py", "read") == (
        f"uid {SANDBOX_UID} cannot enter {private_checkout.parents[2]} (drwx------ 0:0)"
    )
    user = as_sandbox_user()
    copy = user["server"]
    assert reach_problem(SANDBOX_UID, copy / "__main__.py", "read") is None
    assert reachable_copy(private_checkout) == copy  # once a process
    names = sorted(p.relative_to(copy) for p in copy.rglob("*"))
    assert names == sorted(p.relative_to(private_checkout) for p in private_checkout.rglob("*"))
    for path in (copy, *copy.rglob("*")):
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o444), path
    server = ServerProcess(sandbox_workspace, **user)
    try:
        assert server.request("GET", "/")[0] == 200
        assert Path(f"/proc/{server.proc.pid}").stat().st_uid == SANDBOX_UID
    finally:
        assert server.stop() == 0


def test_a_server_out_of_reach_fails_at_once_saying_where_and_why(
    private_checkout: Path, sandbox_workspace: Path
) -> None:
    user = as_sandbox_user()
    with pytest.raises(pytest.fail.Exception) as failed:
        ServerProcess(sandbox_workspace, **{**user, "server": private_checkout})
    assert str(failed.value) == (
        f"uid {SANDBOX_UID} cannot enter {private_checkout.parents[2]} (drwx------ 0:0),"
        f" so it cannot run the server: the server is {private_checkout / '__main__.py'}"
    )


def test_a_workspace_the_user_cannot_write_fails_at_once(tmp_path: Path) -> None:
    root_owned = sandbox_dir()
    os.chown(root_owned, 0, 0)
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            ServerProcess(root_owned, log=tmp_path / "log", **as_sandbox_user())
    finally:
        root_owned.rmdir()
    assert str(failed.value) == (
        f"uid {SANDBOX_UID} cannot write {root_owned} (drwxr-xr-x 0:0),"
        f" so it cannot run the server: the workspace is {root_owned}"
    )


def test_a_server_that_dies_at_start_fails_with_its_status_and_last_words(
    tmp_path: Path,
) -> None:
    script = tmp_path / "dies.py"
    script.write_text("import sys\nprint('starting', file=sys.stderr)\nsys.exit('no port today')\n")
    (tmp_path / "ws").mkdir()
    with pytest.raises(pytest.fail.Exception) as failed:
        ServerProcess(tmp_path / "ws", server=script)
    assert str(failed.value) == (
        "the server did not report its port (exit status 1); its log ends: no port today"
    )


def test_the_copy_is_of_the_package_the_image_installs() -> None:
    copy = reachable_copy(SERVER)
    assert copy.name == SERVER.name and copy.parent.name.startswith("bsi-server-")
    expected = {p.relative_to(SERVER) for p in SERVER.rglob("*") if "__pycache__" not in p.parts}
    assert {p.relative_to(copy) for p in copy.rglob("*")} == expected
