"""SandboxTemplate editing: only the image value changes, byte for byte; wrong files are refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from builder.errors import UserError
from builder.publish.template import (
    Pointing,
    TemplateChange,
    apply_hint,
    check_template,
    check_warm_pools,
    render_image,
    warm_pool_warnings,
    write_edit,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
NEW = "127.0.0.1:5000/team/python-sandbox@sha256:" + "0123456789abcdef" * 4


def set_image(path: Path, image: str, container: str | None = None) -> TemplateChange:
    """What a run does to its template: rendered in memory, then written."""
    return write_edit(render_image(path, image, container))


HEADER = "apiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxTemplate\n"

BLOCK = f"""\
# top comment, kept

{HEADER}metadata:
  name: py   # trailing comment
spec:
  podTemplate:
    spec:
      containers:
        # the runtime container
        - name: runtime
          image: OLD_IMAGE   # pinned by the tool
          ports:
            - containerPort: 8888


        - name: sidecar
          image: "busybox:1.36"
"""

INDENTLESS = f"""\
---
{HEADER}metadata: {{name: py}}
spec:
    podTemplate:
        spec:
            containers:
            - name: runtime
              image: OLD_IMAGE
              args: [ "--port",   '8888' ]   # odd spacing stays
...
"""

SINGLE_QUOTED = f"""\
{HEADER}spec:
  podTemplate:
    spec:
      containers:
      - {{name: runtime, image: 'OLD_IMAGE'}}   # flow mapping, single quotes
"""

DOUBLE_QUOTED = f"""\
{HEADER}spec:
  podTemplate:
    spec:
      containers:
      - name: runtime
        image:   "OLD_IMAGE"
"""


def write(tmp_path: Path, text: str, name: str = "template.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def swapped(text: str, old: str, new: str) -> str:
    """The expected file: the one old value replaced textually, nothing else."""
    assert text.count(old) == 1
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("text", "old", "new"),
    [
        (BLOCK, "OLD_IMAGE", NEW),
        (INDENTLESS, "OLD_IMAGE", NEW),
        (SINGLE_QUOTED, "'OLD_IMAGE'", f"'{NEW}'"),
        (DOUBLE_QUOTED, '"OLD_IMAGE"', f'"{NEW}"'),
    ],
    ids=["block-comments", "indentless-markers", "flow-single", "double"],
)
def test_only_the_image_changes(tmp_path: Path, text: str, old: str, new: str) -> None:
    path = write(tmp_path, text)
    change = set_image(path, NEW)
    assert path.read_bytes() == swapped(text, old, new).encode()
    assert (change.old_image, change.new_image, change.container) == ("OLD_IMAGE", NEW, "runtime")
    assert change.changed


def test_plain_value_in_flow_mapping_gets_quoted(tmp_path: Path) -> None:
    """`a: b:c` inside {...} is YAML 1.2 but PyYAML and old libyaml reject it: quote it."""
    text = f"{HEADER}spec: {{podTemplate: {{spec: {{containers: [{{name: r, image: old}}]}}}}}}\n"
    path = write(tmp_path, text)
    set_image(path, NEW)
    assert path.read_text() == swapped(text, "image: old", f'image: "{NEW}"')


def test_named_container(tmp_path: Path) -> None:
    path = write(tmp_path, BLOCK)
    change = set_image(path, NEW, container="sidecar")
    assert path.read_text() == swapped(BLOCK, '"busybox:1.36"', f'"{NEW}"')
    assert (change.old_image, change.container, change.template_name) == (
        "busybox:1.36",
        "sidecar",
        "py",
    )


def test_missing_container_lists_names(tmp_path: Path) -> None:
    path = write(tmp_path, BLOCK)
    with pytest.raises(UserError, match=r"no container named 'app'.*runtime, sidecar"):
        set_image(path, NEW, container="app")
    assert path.read_text() == BLOCK


def test_multi_document_edits_only_the_template(tmp_path: Path) -> None:
    before = (
        "apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n"
        "      containers:\n      - name: runtime\n        image: OLD_IMAGE\n"
    )
    after = (
        "---\n# the pool\napiVersion: extensions.agents.x-k8s.io/v1beta1\n"
        "kind: SandboxWarmPool\nspec:\n  sandboxTemplateRef: {name: py}\n"
    )
    text = f"{before}---\n{BLOCK}{after}"
    path = write(tmp_path, text)
    set_image(path, NEW)
    assert path.read_text() == f"{before}---\n{swapped(BLOCK, 'OLD_IMAGE', NEW)}{after}"


def test_crlf_bom_mode_and_anchor_kept(tmp_path: Path) -> None:
    text = "\ufeff" + DOUBLE_QUOTED.replace('"OLD_IMAGE"', "&img OLD_IMAGE").replace("\n", "\r\n")
    path = write(tmp_path, text)
    path.chmod(0o640)
    set_image(path, NEW)
    assert path.read_bytes() == swapped(text, "&img OLD_IMAGE", f"&img {NEW}").encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["template.yaml"]  # no temporary file left behind


def test_a_symlinked_template_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    """A link checked into a team's folder could point anywhere the runner may write."""
    target = write(tmp_path, BLOCK, "real.yaml")
    link = tmp_path / "template.yaml"
    link.symlink_to(target.name)
    with pytest.raises(UserError) as caught:
        set_image(link, NEW)
    assert str(caught.value).startswith(f"{link}: is a symbolic link;")
    assert link.is_symlink() and target.read_text() == BLOCK


def test_unchanged_image_does_not_rewrite(tmp_path: Path) -> None:
    path = write(tmp_path, BLOCK)
    inode = path.stat().st_ino
    change = set_image(path, "OLD_IMAGE")
    assert not change.changed
    assert path.stat().st_ino == inode


def test_aliased_image_is_refused(tmp_path: Path) -> None:
    text = BLOCK.replace("image: OLD_IMAGE", "image: &img OLD_IMAGE").replace(
        'image: "busybox:1.36"', "image: *img"
    )
    path = write(tmp_path, text)
    with pytest.raises(UserError, match="alias"):
        set_image(path, NEW)
    assert path.read_text() == text


def test_block_scalar_image_is_refused(tmp_path: Path) -> None:
    text = DOUBLE_QUOTED.replace('"OLD_IMAGE"', "|\n          OLD_IMAGE")
    path = write(tmp_path, text)
    with pytest.raises(UserError, match="one line"):
        set_image(path, NEW)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (
            "apiVersion: apps/v1\nkind: Deployment\nspec: {}\n",
            "kind: Deployment, apiVersion: apps/v1",
        ),
        (
            "apiVersion: agents.x-k8s.io/v1alpha1\nkind: SandboxTemplate\nspec: {}\n",
            "kind: SandboxTemplate, apiVersion: agents.x-k8s.io/v1alpha1",
        ),
        ("# nothing here\n", "an empty file"),
    ],
    ids=["deployment", "wrong-group", "empty"],
)
def test_not_a_sandbox_template_is_refused(tmp_path: Path, text: str, found: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UserError) as caught:
        set_image(path, NEW)
    message = str(caught.value)
    assert str(path) in message and "is not a SandboxTemplate" in message and found in message
    assert path.read_text() == text


def test_other_version_of_the_group_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, BLOCK.replace("/v1beta1", "/v1alpha1"))
    assert set_image(path, NEW).old_image == "OLD_IMAGE"


def test_template_without_containers(tmp_path: Path) -> None:
    path = write(tmp_path, f"{HEADER}spec:\n  podTemplate:\n    spec: {{}}\n")
    with pytest.raises(UserError, match=r"no spec\.podTemplate\.spec\.containers"):
        set_image(path, NEW)


def pool(strategy: str | None, template: str = "py", group: str = "extensions") -> str:
    lines = [
        f"apiVersion: {group}.agents.x-k8s.io/v1beta1",
        "kind: SandboxWarmPool",
        f"metadata:\n  name: pool-{strategy or 'default'}",
        f"spec:\n  replicas: 2\n  sandboxTemplateRef:\n    name: {template}",
    ]
    if strategy:
        lines.append(f"  updateStrategy:\n    type: {strategy}")
    return "\n".join(lines) + "\n"


def test_warm_pool_warnings(tmp_path: Path) -> None:
    pools = write(
        tmp_path,
        "---\n".join(
            [
                pool(None),
                pool("OnReplenish"),
                pool("Recreate"),
                pool(None, template="other"),
                pool(None, group="notextensions"),
            ]
        ),
        "pools.yaml",
    )
    template = write(tmp_path, BLOCK)
    warnings = warm_pool_warnings([template, pools], "py")
    assert len(warnings) == 2
    default, explicit = warnings
    assert "pool-default" in default and "OnReplenish (the default)" in default
    assert "pool-OnReplenish" in explicit and "(set explicitly)" in explicit
    for warning in warnings:
        assert "keep the old image" in warning
        assert "spec.updateStrategy.type: Recreate" in warning and str(pools) in warning


def test_warm_pool_file_that_is_not_yaml(tmp_path: Path) -> None:
    broken = write(tmp_path, "a: [unclosed\n", "broken.yaml")
    with pytest.raises(UserError, match=r"broken\.yaml: not valid YAML"):
        warm_pool_warnings([broken], "py")


def test_apply_hint_quotes_the_path() -> None:
    assert apply_hint(Path("deploy/t.yaml")).endswith("kubectl apply -f deploy/t.yaml")
    assert apply_hint(Path("my dir/t.yaml")).endswith("kubectl apply -f 'my dir/t.yaml'")


def test_examples_are_hardened_and_editable(tmp_path: Path) -> None:
    source = (REPO_ROOT / "examples/sandbox-template.yaml").read_text()
    doc = YAML(typ="safe").load(source)
    pod = doc["spec"]["podTemplate"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    hardening = container["securityContext"]
    assert hardening["readOnlyRootFilesystem"] is True
    assert hardening["allowPrivilegeEscalation"] is False
    assert hardening["capabilities"]["drop"] == ["ALL"]
    assert container["ports"][0]["containerPort"] == 8888
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[next(n for n, p in mounts.items() if p == "/workspace")]

    path = write(tmp_path, source)
    change = set_image(path, NEW)
    assert path.read_text() == swapped(source, change.old_image, NEW)
    warnings = warm_pool_warnings(
        [path, REPO_ROOT / "examples/sandbox-warmpool.yaml"], change.template_name
    )
    assert len(warnings) == 1 and "OnReplenish (the default)" in warnings[0]


# -- checked before the run builds anything, rendered before the push --------------------------


@pytest.mark.parametrize(
    ("text", "container", "culprit"),
    [
        ("a: [unclosed\n", None, "not valid YAML"),
        ("kind: SandboxTemplate\nkind: SandboxTemplate\n", None, "not valid YAML"),
        ("apiVersion: v1\nkind: ConfigMap\n", None, "is not a SandboxTemplate"),
        (BLOCK, "nosuch", "no container named 'nosuch'"),
        (BLOCK.replace('image: "busybox:1.36"', "args: []"), "sidecar", "is missing"),
        (BLOCK.replace("image: OLD_IMAGE", "image: |\n            OLD_IMAGE"), None, "one line"),
    ],
    ids=["not-yaml", "duplicate-key", "wrong-kind", "no-container", "no-image", "block-scalar"],
)
def test_a_template_that_cannot_be_pointed_is_refused_by_the_check(
    tmp_path: Path, text: str, container: str | None, culprit: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UserError) as caught:
        check_template(path, container)
    assert str(caught.value).startswith(str(path)) and culprit in str(caught.value)
    assert "\n" not in str(caught.value)
    assert path.read_text() == text


def test_a_read_only_template_is_refused_and_left_alone(tmp_path: Path) -> None:
    """Marked read-only by its owner: refused even for root, whom the bits do not stop."""
    path = write(tmp_path, BLOCK)
    path.chmod(0o444)
    with pytest.raises(UserError, match=r"template\.yaml: is read-only \(mode 0444\)"):
        check_template(path)
    with pytest.raises(UserError, match="read-only"):
        render_image(path, NEW)
    assert path.read_text() == BLOCK


def test_the_check_passes_a_good_template_and_changes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, BLOCK)
    before = path.stat()
    check_template(path, "sidecar")
    assert path.read_text() == BLOCK and path.stat().st_mtime_ns == before.st_mtime_ns


def test_rendering_writes_nothing_until_the_edit_is_written(tmp_path: Path) -> None:
    path = write(tmp_path, BLOCK)
    edit = render_image(path, NEW)
    assert path.read_text() == BLOCK  # in memory only: the push comes between
    assert edit.text == swapped(BLOCK, "OLD_IMAGE", NEW) and edit.path == path.resolve()
    write_edit(edit)
    assert path.read_text() == edit.text


def test_pointing_renders_before_and_writes_only_what_it_rendered(tmp_path: Path) -> None:
    pools = write(tmp_path, pool(None), "pools.yaml")
    path = write(tmp_path, BLOCK)
    pointing = Pointing(path, "runtime", (pools,))
    pointing.check()
    with pytest.raises(AssertionError, match="not rendered"):
        pointing.write(NEW)
    pointing.render(NEW)
    assert path.read_text() == BLOCK
    assert pointing.notes[0] == apply_hint(path) and "pool-default" in pointing.notes[1]
    with pytest.raises(AssertionError, match="not rendered"):
        pointing.write(NEW.replace("0123", "3210"))  # the push wrote another digest
    change = pointing.write(NEW)
    assert (change.old_image, change.new_image) == ("OLD_IMAGE", NEW)
    assert path.read_text() == swapped(BLOCK, "OLD_IMAGE", NEW)


def test_a_warm_pool_file_is_checked_with_the_template(tmp_path: Path) -> None:
    broken = write(tmp_path, "a: [unclosed\n", "broken.yaml")
    pointing = Pointing(write(tmp_path, BLOCK), None, (broken,))
    with pytest.raises(UserError, match=r"broken\.yaml: not valid YAML"):
        pointing.check()
    with pytest.raises(UserError, match=r"gone\.yaml: cannot read"):
        check_warm_pools([tmp_path / "gone.yaml"])
