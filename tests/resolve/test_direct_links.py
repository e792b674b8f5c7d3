"""A project's links that leave it (issue 59): a local project directory and a source
distribution are held to what a repository's export is held to.

A build backend follows links, so a link to a host file would ship the file in the wheel: real
projects and sdists (the tests' in-tree backend, built by uv with no index) with a link out are
refused in one line naming the requirement and the link; a link inside the project builds, and
the file it names is in the wheel.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from support.plans import AMD64, reference_profile
from support.projects import pure_project, pure_sdist

from builder.cache import Cache
from builder.errors import UserError
from builder.resolve.direct.trees import refuse_links_out
from builder.resolve.index import link_out
from builder.resolve.requirements import read_requirements
from builder.resolve.resolution import Resolution
from builder.resolve.target import Target
from builder.resolve.uv import resolve

HOST_FILE = "/etc/hostname"


def _resolve(tmp_path: Path, line: str) -> Resolution:
    top = tmp_path / "r.txt"
    top.write_text(f"--no-index\n{line}\n")
    target = Target(reference_profile(), (AMD64,))
    return resolve(read_requirements([top]), target, AMD64, Cache(tmp_path / "cache"))


def _refusal(tmp_path: Path, line: str) -> str:
    with pytest.raises(UserError) as caught:
        _resolve(tmp_path, line)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'r.txt'}:2: ") and "\n" not in message
    return message


def _wheel_files(tmp_path: Path) -> dict[str, bytes]:
    wheel = next((tmp_path / "cache").rglob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


@pytest.mark.parametrize("target", [HOST_FILE, "../../outside.txt", "../.."])
def test_a_local_project_linking_out_is_refused_naming_the_link(
    tmp_path: Path, target: str
) -> None:
    (tmp_path / "outside.txt").write_text("host secret\n")
    project = pure_project(tmp_path / "proj", "bsi-linked", "1.0", "bsi_linked", "")
    (project / "bsi_linked" / "stolen.py").symlink_to(target)
    message = _refusal(tmp_path, str(project))
    assert f"{project}: 'bsi_linked/stolen.py' links outside the project" in message
    assert not list((tmp_path / "cache").rglob("*.whl"))  # nothing was built


def test_a_linked_directory_out_of_a_local_project_is_refused(tmp_path: Path) -> None:
    project = pure_project(tmp_path / "proj", "bsi-linked", "1.0", "bsi_linked", "")
    (project / "bsi_linked" / "etc").symlink_to("/etc", target_is_directory=True)
    assert "'bsi_linked/etc' links outside the project" in _refusal(tmp_path, str(project))


def test_a_link_inside_a_local_project_builds(tmp_path: Path) -> None:
    project = pure_project(tmp_path / "proj", "bsi-linked", "1.0", "bsi_linked", "V = 1\n")
    (project / "bsi_linked" / "real.py").write_text("REAL = 1\n")
    (project / "bsi_linked" / "alias.py").symlink_to("real.py")
    (project / ".git").mkdir()  # a repository's own records are never built: not looked in
    (project / ".git" / "hooks").symlink_to("/usr/share/git-core/templates/hooks")
    found = _resolve(tmp_path, str(project))
    assert [(p.name, p.version) for p in found.packages] == [("bsi-linked", "1.0")]
    assert _wheel_files(tmp_path)["bsi_linked/alias.py"] == b"REAL = 1\n"


def _add_link(sdist: Path, name: str, target: str, hard: bool = False) -> None:
    """Rewrite the .tar.gz `sdist` with one more link member."""
    with tarfile.open(sdist) as archive:
        members = [(m, archive.extractfile(m)) for m in archive.getmembers()]
        contents = [(m, f.read() if f else None) for m, f in members]
    with tarfile.open(sdist, "w:gz") as archive:
        for member, data in contents:
            archive.addfile(member, io.BytesIO(data) if data is not None else None)
        link = tarfile.TarInfo(name)
        link.type, link.linkname = (tarfile.LNKTYPE if hard else tarfile.SYMTYPE), target
        archive.addfile(link)


@pytest.mark.parametrize(
    ("target", "hard"),
    [
        (HOST_FILE, False),
        ("../../../../etc/hostname", False),
        ("../../../x", False),
        (HOST_FILE, True),
    ],
)
def test_an_sdist_linking_out_is_refused_before_it_is_unpacked(
    tmp_path: Path, target: str, hard: bool
) -> None:
    sdist = pure_sdist(tmp_path / "src", "bsi-sourced", "1.2", "bsi_sourced", "V = 12\n")
    _add_link(sdist, "bsi_sourced-1.2/bsi_sourced/stolen.py", target, hard)
    message = _refusal(tmp_path, str(sdist))
    assert (
        f"{sdist}: 'bsi_sourced-1.2/bsi_sourced/stolen.py' links outside the source"
        f" distribution ({target!r})" in message
    )
    assert not list((tmp_path / "cache").rglob("*.whl"))


def test_an_sdist_linking_inside_builds(tmp_path: Path) -> None:
    sdist = pure_sdist(tmp_path / "src", "bsi-sourced", "1.2", "bsi_sourced", "V = 12\n")
    _add_link(sdist, "bsi_sourced-1.2/bsi_sourced/alias.py", "__init__.py")
    found = _resolve(tmp_path, str(sdist))
    assert [(p.name, p.version) for p in found.packages] == [("bsi-sourced", "1.2")]
    assert _wheel_files(tmp_path)["bsi_sourced/alias.py"] == b"V = 12\n"


@pytest.mark.parametrize(
    ("members", "out"),
    [
        ([("p/a", "b", False), ("p/b", "", False)], None),
        ([("p/d/a", "../b", False)], None),
        ([("p/a", "p/b", True)], None),
        ([("p/a", "../../x", False)], ("p/a", "../../x")),
        ([("p/a", "/etc/x", False)], ("p/a", "/etc/x")),
        ([("p/a", "../x", True)], ("p/a", "../x")),
        ([("../p/a", "", False)], ("../p/a", "../p/a")),
        ([("/p/a", "", False)], ("/p/a", "/p/a")),
        ([("p/up", "..", False), ("p/b", "up/../x", False)], ("p/b", "up/../x")),
        ([("p/d", "e", False), ("p/d/passwd", "", False)], ("p/d/passwd", "p/d/passwd")),
    ],
)
def test_a_link_out_is_judged_on_the_names_alone(
    members: list[tuple[str, str, bool]], out: tuple[str, str] | None
) -> None:
    """`p/up -> ..` stays in; `p/b -> up/../x` goes through it, so it is refused: `..` after a
    link is wherever that link leads (here out of the archive), not where its name says; a
    member under a linked directory is wherever that link leads too."""
    assert link_out(members) == out


def test_links_in_a_loop_or_a_chain_are_followed_to_where_they_lead(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "loop").symlink_to("loop")
    (tree / "pkg" / "hop").symlink_to("../pkg/loop")
    refuse_links_out(tree, "r.txt:1: ./proj")  # nothing leaves
    (tree / "pkg" / "out").symlink_to("..")
    (tree / "pkg" / "chain").symlink_to("out/..")  # through `out`: the project's parent
    with pytest.raises(UserError) as refused:
        refuse_links_out(tree, "r.txt:1: ./proj")
    assert str(refused.value) == "r.txt:1: ./proj: 'pkg/chain' links outside the project"
