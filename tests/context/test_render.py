"""--output never deletes what the tool did not write: only its own marked contexts are replaced."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.plans import reference_profile

from builder.context.render import MARKER, render, update_report
from builder.errors import UserError
from builder.layers.extras import ExtrasLayer
from builder.layers.layer import Layer
from builder.plan.plan import ArchPlan, Plan


def empty_plan() -> Plan:
    """A plan that installs nothing: enough to render a complete context."""
    return Plan(
        base=reference_profile(),
        base_image="python-runtime:1",
        arches=(ArchPlan("amd64", (), (), (), (), ()),),
        import_modules=(),
        runtime_checks=(),
    )


def write_context(tmp_path: Path, output: Path) -> None:
    blob = tmp_path / "layer.tar"
    blob.write_bytes(b"not really a layer")
    layer = Layer(blob, "sha256:" + "b" * 64, 18, 315532800)
    stack = (ExtrasLayer("distribution", (), "none", layer),)
    render(empty_plan(), output, {"amd64": stack}, {"amd64": "lock-version = '1.0'\n"})


def test_a_user_directory_with_a_report_json_is_left_alone(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "report.json").write_text("{}")
    (project / "main.py").write_text("x\n")
    with pytest.raises(UserError) as caught:
        write_context(tmp_path, project)
    message = str(caught.value)
    assert message.startswith(f"{project}: exists with no {MARKER} marker (main.py, report.json)")
    assert (project / "main.py").read_text() == "x\n"
    assert sorted(p.name for p in project.iterdir()) == ["main.py", "report.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_the_listing_names_a_few_entries(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    for index in range(8):
        (project / f"f{index}").write_text("")
    with pytest.raises(UserError, match=r"\(f0, f1, f2, f3, f4 and 3 more\)"):
        write_context(tmp_path, project)


def test_a_marked_context_is_replaced_until_someone_adds_a_file(tmp_path: Path) -> None:
    output = tmp_path / "context"
    write_context(tmp_path, output)
    marker = (output / MARKER).read_text().splitlines()
    assert marker[0].startswith("build-sandbox-image ")
    assert {"Dockerfile", "report.json", "deps-extra-amd64-01.tar", MARKER} <= set(marker[1:])
    update_report(output, {"image": {"id": "sha256:1"}})
    write_context(tmp_path, output)  # our own context, even after the report was updated
    assert "sha256:1" not in (output / "report.json").read_text()
    (output / "mine.whl").write_text("user data")
    with pytest.raises(UserError, match=r"files this tool did not write \(mine.whl\)"):
        write_context(tmp_path, output)
    assert (output / "mine.whl").read_text() == "user data"


def test_new_and_empty_directories_are_written(tmp_path: Path) -> None:
    write_context(tmp_path, tmp_path / "a" / "b" / "new")
    assert (tmp_path / "a" / "b" / "new" / "Dockerfile").is_file()
    (tmp_path / "empty").mkdir()
    write_context(tmp_path, tmp_path / "empty")
    assert (tmp_path / "empty" / MARKER).is_file()


def test_a_symlink_to_a_context_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    write_context(tmp_path, tmp_path / "real")
    before = {p.name: p.read_bytes() for p in (tmp_path / "real").iterdir()}
    (tmp_path / "link").symlink_to("real")
    with pytest.raises(UserError, match=r"link: is a symbolic link;"):
        write_context(tmp_path, tmp_path / "link")
    assert {p.name: p.read_bytes() for p in (tmp_path / "real").iterdir()} == before


@pytest.mark.parametrize(
    ("setup", "fragment"),
    [
        (lambda t: (t / "out").write_text("x"), "exists and is not a directory"),
        (lambda t: (t / "out").symlink_to("out"), "is a symbolic link"),
        (lambda t: (t / "out").symlink_to("missing"), "is a symbolic link"),
    ],
)
def test_unusable_outputs_are_one_line(
    tmp_path: Path, setup: Callable[[Path], object], fragment: str
) -> None:
    setup(tmp_path)
    with pytest.raises(UserError) as caught:
        write_context(tmp_path, tmp_path / "out")
    assert str(caught.value).startswith(f"{tmp_path / 'out'}: {fragment}")
    assert "\n" not in str(caught.value)


def test_unusable_parents_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"file: exists and is not a directory$"):
        write_context(tmp_path, tmp_path / "file" / "out")
    # root may write anywhere on disk, but not into /sys
    with pytest.raises(UserError, match=r"^/sys/bsi-out: cannot write the build context"):
        write_context(tmp_path, Path("/sys/bsi-out"))
