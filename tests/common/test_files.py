"""Every file the tool writes where a team works goes through a fresh temporary file and a
rename, never through a symlink (builder.files): the writer itself, then each place that
writes one (the state, the config on `rebuild`, a shard table, a part record, the template, the
build context), each with symlinks planted at the names it used to write through."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.cli.fleet import fleet_output
from builder.config import load_config, set_platform_version, settings_of
from builder.context.render import add_to_output, render, update_report
from builder.errors import UserError
from builder.files import copy_whole, replacing, write_whole
from builder.layers.extras import ExtrasLayer, LayerKind
from builder.layers.layer import Layer
from builder.orchestration.runners.parts import PartRecord, Verified, _save
from builder.orchestration.shard import write_table
from builder.publish.state import BuildState, load_state, save_state
from builder.publish.template import render_image, write_edit

SECRET = b"the runner's key\n"
CONFIG = 'requirements = ["r.txt"]\nbase-repository = "reg.example/rt"\nplatform-version = "1.0"\n'
TEMPLATE = """\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: py}
spec:
  podTemplate:
    spec:
      containers:
        - name: runtime
          image: OLD_IMAGE
"""
NEW_IMAGE = "127.0.0.1:5000/team/python-sandbox@sha256:" + "0" * 64


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the project that a planted link points at."""
    keys = tmp_path / "runner" / "keys"
    keys.parent.mkdir()
    keys.write_bytes(SECRET)
    keys.chmod(0o600)
    return keys


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def plant(outside: Path, *links: Path) -> None:
    for link in links:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(outside)


def old_temporaries(path: Path) -> tuple[Path, ...]:
    """The fixed names the writers used to write through: `.<name>.new`, `.<name>.<pid>`."""
    return (path.with_name(f".{path.name}.new"), path.with_name(f".{path.name}.{os.getpid()}"))


def untouched(outside: Path) -> bool:
    return outside.read_bytes() == SECRET and stat.S_IMODE(outside.stat().st_mode) == 0o600


def regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


# -- the writer ----------------------------------------------------------------------------------


def test_a_link_at_an_old_temporary_name_is_never_followed(project: Path, outside: Path) -> None:
    path = project / "adv.state.json"
    plant(outside, *old_temporaries(path))
    write_whole(path, "{}\n", durable=True)
    assert untouched(outside) and regular(path) and path.read_text() == "{}\n"
    assert all(link.is_symlink() for link in old_temporaries(path))
    assert sorted(p.name for p in project.iterdir()) == sorted(
        [path.name, *(link.name for link in old_temporaries(path))]
    )  # no temporary file left behind


def test_a_link_at_the_target_is_refused_in_one_line(project: Path, outside: Path) -> None:
    path = project / "adv.state.json"
    plant(outside, path)
    with pytest.raises(UserError) as caught:
        write_whole(path, "{}\n")
    assert str(caught.value) == (
        f"{path}: is a symbolic link; the tool never writes through one"
        " (name the file or directory itself)"
    )
    assert untouched(outside) and path.is_symlink()


def test_a_taken_temporary_name_is_passed_over(
    project: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The random name is made exclusively: one that exists (a link here) is not opened."""
    path = project / "table.json"
    taken = project / f".{path.name}.{'00' * 6}.tmp"
    plant(outside, taken)
    real = os.urandom
    names = iter([b"\0" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(names, None) or real(n))
    write_whole(path, "[]\n")
    assert untouched(outside) and regular(path) and taken.is_symlink()


def test_a_replaced_file_keeps_its_mode_and_a_new_one_gets_the_umask(
    project: Path, umask_022: None
) -> None:
    kept, new = project / "bsi.toml", project / "new.json"
    kept.write_text("a = 1\n")
    kept.chmod(0o640)
    write_whole(kept, "a = 2\n")
    write_whole(new, "{}\n")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "a = 2\n"
    assert stat.S_IMODE(new.stat().st_mode) == 0o644  # open()'s, not mkstemp's 0600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(project: Path) -> None:
    path = project / "state.json"
    path.write_text("old\n")
    with pytest.raises(RuntimeError), replacing(path) as out:
        out.write(b"half a rec")
        raise RuntimeError("stopped")
    assert path.read_text() == "old\n" and [p.name for p in project.iterdir()] == [path.name]


def test_a_copy_shares_nothing_an_edit_could_reach(project: Path) -> None:
    source = project / "cached.tar"
    source.write_bytes(os.urandom(3 << 20) + b"end")
    copy = project / "context.tar"
    copy_whole(source, copy)
    assert copy.read_bytes() == source.read_bytes()
    assert source.stat().st_nlink == copy.stat().st_nlink == 1
    assert source.stat().st_ino != copy.stat().st_ino
    original = source.read_bytes()
    with copy.open("r+b") as edit:  # written over in place, as an editor may
        edit.seek(100)
        edit.write(b"EDITED")
    assert source.read_bytes() == original


@pytest.mark.parametrize("kernel", ["refuses", "absent"])
def test_a_copy_falls_back_to_memory_where_the_kernel_cannot(
    project: Path, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """ext4 has no reflinks (FICLONE says EOPNOTSUPP here); an old kernel's copy_file_range
    refuses two file systems (EXDEV), and another OS has none."""
    source = project / "cached.tar"
    source.write_bytes(os.urandom(1 << 20))
    if kernel == "absent":
        monkeypatch.delattr(os, "copy_file_range")
    else:

        def refuse(*args: object) -> int:
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(os, "copy_file_range", refuse)
    copy_whole(source, project / "context.tar")
    assert (project / "context.tar").read_bytes() == source.read_bytes()


# -- each place that writes one ------------------------------------------------------------------


def test_the_state(project: Path, outside: Path) -> None:
    path = project / "adv.state.json"
    plant(outside, *old_temporaries(path))
    state = BuildState("1.0", "reg.example/rt:1.0", None, "3.13.5", {}, {})
    save_state(path, state)
    assert untouched(outside) and regular(path) and load_state(path) == state
    path.unlink()
    plant(outside, path)
    for action in (lambda: save_state(path, state), lambda: load_state(path)):
        with pytest.raises(UserError, match="is a symbolic link"):
            action()
    assert untouched(outside)


def test_the_config_on_rebuild(project: Path, outside: Path, umask_022: None) -> None:
    path = project / "bsi.toml"
    path.write_text(CONFIG)
    path.chmod(0o640)
    plant(outside, *old_temporaries(path))
    set_platform_version(load_config(path), "1.1")
    assert untouched(outside) and regular(path)
    assert 'platform-version = "1.1"' in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_config_that_is_a_link_is_refused_before_any_work(project: Path, outside: Path) -> None:
    real = project / "real.toml"
    real.write_text(CONFIG)
    path = project / "bsi.toml"
    path.symlink_to(real.name)
    config = load_config(path)  # read for a build, which never writes it
    for action in (lambda: settings_of(config), lambda: set_platform_version(config, "1.1")):
        with pytest.raises(UserError, match=f"^{path}: is a symbolic link"):
            action()
    assert real.read_text() == CONFIG


@pytest.mark.parametrize("setting", ["state", "template"])
def test_a_state_or_template_that_is_a_link_is_refused_before_any_work(
    project: Path, outside: Path, setting: str
) -> None:
    path = project / "bsi.toml"
    path.write_text(CONFIG + f'{setting} = "planted"\n')
    plant(outside, project / "planted")
    with pytest.raises(UserError, match="planted: is a symbolic link"):
        settings_of(load_config(path))
    assert untouched(outside)


@pytest.mark.parametrize("setting", ["state", "template", "output"])
def test_a_directory_link_on_the_way_to_a_written_file_is_refused(
    project: Path, outside: Path, setting: str
) -> None:
    """`st/x` with `st` a link to the runner's directory would write beside its keys."""
    (project / "st").symlink_to(outside.parent, target_is_directory=True)
    path = project / "bsi.toml"
    path.write_text(CONFIG + f'{setting} = "st/adv.state.json"\n')
    with pytest.raises(UserError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{project / 'st'}: is a symbolic link;")
    assert untouched(outside) and sorted(outside.parent.iterdir()) == [outside]


def test_a_written_file_may_lie_above_the_config_when_no_link_leads_there(project: Path) -> None:
    """The example config writes its context beside the project (`output = "../…"`)."""
    (project / "team").mkdir()
    path = project / "team" / "bsi.toml"
    path.write_text(CONFIG + 'output = "../sandbox-image"\n')
    assert load_config(path).output == project / "team" / ".." / "sandbox-image"


def test_the_shard_table(project: Path, outside: Path) -> None:
    path = project / "out" / "table.json"
    plant(outside, *old_temporaries(path))
    document = {"new_version": "1.1", "check": True, "shard": None, "rows": [], "failed": []}
    write_table(path, document)  # type: ignore[arg-type]
    assert untouched(outside) and regular(path)
    path.unlink()
    plant(outside, path)
    with pytest.raises(UserError, match="is a symbolic link"):
        write_table(path, document)  # type: ignore[arg-type]
    for shard in (None, "1/2"):  # refused when the command is read, before the fleet runs
        with pytest.raises(UserError, match="is a symbolic link"):
            fleet_output((project / "a.toml",), shard, path, False)
    assert untouched(outside)


def test_a_part_record(project: Path, outside: Path) -> None:
    record = PartRecord("id", "amd64", "reg.example/x", Verified.PASSED, "sha256:" + "a" * 64)
    path = project / "parts" / "amd64.json"
    plant(outside, *old_temporaries(path))
    assert _save(project, record) == path
    assert untouched(outside) and regular(path) and PartRecord.read(path) == record
    elsewhere = project.parent / "elsewhere"
    elsewhere.mkdir()
    (project / "parts").rename(project / "moved")
    (project / "parts").symlink_to(elsewhere)  # the folder itself planted as a link
    with pytest.raises(UserError, match="parts: is a symbolic link"):
        _save(project, record)
    assert list(elsewhere.iterdir()) == []


def test_the_template(project: Path, outside: Path) -> None:
    path = project / "template.yaml"
    path.write_text(TEMPLATE)
    plant(outside, *old_temporaries(path))
    write_edit(render_image(path, NEW_IMAGE))
    assert untouched(outside) and regular(path) and NEW_IMAGE in path.read_text()


def _context(project: Path, output: Path) -> None:
    from support.plans import reference_profile

    from builder.plan.plan import ArchPlan, Plan

    plan = Plan(
        base=reference_profile(),
        base_image="python-runtime:1",
        arches=(ArchPlan("amd64", (), (), (), (), ()),),
        import_modules=(),
        runtime_checks=(),
    )
    blob = project / "cached-layer.tar"
    blob.write_bytes(b"not really a layer")
    layer = Layer(blob, "sha256:" + "b" * 64, 18, 315532800)
    stack = (ExtrasLayer(LayerKind.DISTRIBUTION, (), "none", layer),)
    render(plan, output, {"amd64": stack}, {"amd64": "lock-version = '1.0'\n"})


def test_the_context_output(project: Path, outside: Path) -> None:
    output = project / "sandbox-image"
    plant(outside, project / f".{output.name}.old-{os.getpid()}")
    _context(project, output)
    _context(project, output)  # the old one retired under a fresh name, not the planted one
    layer = output / "deps-extra-amd64-01.tar"
    assert layer.stat().st_nlink == 1  # a copy of the cache's tar, not a link to it
    for name in ("report.json", "sbom-amd64.cdx.json"):
        (output / name).unlink(missing_ok=True)
        plant(outside, output / name)
    with pytest.raises(UserError, match=r"report\.json: is a symbolic link"):
        update_report(output, {"image": {"id": "sha256:1"}})
    with pytest.raises(UserError, match=r"sbom-amd64\.cdx\.json: is a symbolic link"):
        add_to_output(output, "sbom-amd64.cdx.json", b"{}")
    (output / "sbom-amd64.cdx.json").unlink()  # not the tool's: it would keep the context
    _context(project, output)  # a link among our own files: the directory is replaced whole
    assert untouched(outside) and regular(output / "report.json")


def test_a_template_flag_that_is_a_link_is_one_error_line_before_any_work(
    project: Path, outside: Path
) -> None:
    from click.testing import CliRunner

    from builder.cli.app import main

    (project / "r.txt").write_text("bsi-none\n")
    plant(outside, project / "template.yaml")
    output = project / "sandbox-image"
    result = CliRunner().invoke(
        main,
        ["-r", str(project / "r.txt"), "--template", str(project / "template.yaml"),
         "--no-build", "--output", str(output), "--cache-dir", str(project / "cache")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: {project / 'template.yaml'}: is a symbolic link; the tool never writes through"
        " one (name the file or directory itself)"
    ]
    assert untouched(outside) and not output.exists() and not (project / "cache").exists()
