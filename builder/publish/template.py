"""Point a SandboxTemplate at a pushed image without disturbing the operator's YAML.

Operators keep their templates in git with comments and their own layout, so a re-dump through a
YAML emitter (which reflows indentation, quoting and comments) is not acceptable. ruamel composes
the file only to find the exact character span of the one `image` scalar; that span is replaced in
the original text, so every other byte stays as it was, and the result is parsed again to prove
that nothing but that value changed.

A run checks the template before it builds anything (`check_template`), renders the new text
in memory once the digest is known and before the push (`render_image`), and after the push
only writes that text (`write_edit`): nothing that can fail on the file's content is left
for after a tag moved.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from builder.errors import UserError
from builder.files import refuse_link, write_whole
from builder.publish.writable import check_replaceable

API_GROUP = "extensions.agents.x-k8s.io"
TEMPLATE_KIND = "SandboxTemplate"
WARM_POOL_KIND = "SandboxWarmPool"
# The controller's default: stale warm pods are replaced only when claimed or deleted.
DEFAULT_WARM_POOL_STRATEGY = "OnReplenish"
IMAGE_PATH = "spec.podTemplate.spec.containers[N].image"


@dataclass(frozen=True)
class TemplateChange:
    old_image: str
    new_image: str
    container: str  # name of the container whose image was set
    template_name: str | None = None  # metadata.name, what warm pools refer to

    @property
    def changed(self) -> bool:
        return self.old_image != self.new_image


@dataclass(frozen=True)
class TemplateEdit:
    """The template's new text, rendered in memory before the push: writing it is all that
    follows the push (`write_edit`)."""

    path: Path  # the file written (never a symlink: refused, builder.files)
    text: str | None  # None: the template names the image already, nothing is written
    change: TemplateChange


@dataclass(frozen=True)
class _Found:
    """The template's one image value, found and checked editable."""

    target: Path
    text: str
    documents: list[Node | None]
    node: ScalarNode
    span: tuple[int, int]  # the scalar's body in `text`
    in_flow: bool
    container: str
    template_name: str | None


@dataclass
class Pointing:
    """A run's template pointed at what it pushes: checked before anything is built (`check`),
    rendered with the warm pools' warnings once the digest is known and before the push
    (`render`), written after the push (`write`)."""

    path: Path
    container: str | None = None
    warm_pools: tuple[Path, ...] = ()
    edit: TemplateEdit | None = None
    notes: list[str] = field(default_factory=list)  # how to apply it; warm pools left stale

    def check(self) -> None:
        check_template(self.path, self.container)
        check_warm_pools(self.warm_pools)

    def render(self, image: str) -> None:
        self.edit = render_image(self.path, image, self.container)
        self.notes = [apply_hint(self.path)]
        if name := self.edit.change.template_name:  # else no warm pool can refer to it
            self.notes += warm_pool_warnings((self.path, *self.warm_pools), name)

    def write(self, image: str) -> TemplateChange:
        """Write what `render` made for `image`, the reference the push wrote."""
        if self.edit is None or self.edit.change.new_image != image:
            raise AssertionError(f"the template was not rendered for {image} before the push")
        return write_edit(self.edit)


def check_template(path: Path, container: str | None = None) -> None:
    """What pointing the template needs, checked before a run builds anything: UTF-8 YAML
    holding one SandboxTemplate, `container` (default: the first) with a one-line image
    value, and a file that can be replaced (builder.publish.writable). One UserError naming
    the file and what is wrong."""
    _find(path, container)


def render_image(path: Path, image: str, container: str | None = None) -> TemplateEdit:
    """The SandboxTemplate at `path` with a container's image set to `image`, in memory, no
    other byte changed; checked again as `check_template` does (the file may have changed
    since the run began).

    `container` names the container to edit; by default the first one.
    """
    if not image or any(ch.isspace() or not ch.isprintable() for ch in image):
        raise UserError(f"{image!r} is not an image reference")
    found = _find(path, container)
    change = TemplateChange(found.node.value, image, found.container, found.template_name)
    if not change.changed:
        return TemplateEdit(found.target, None, change)
    new_text = _replace_checked(
        path, found.text, found.documents, found.node, found.span, image, found.in_flow
    )
    return TemplateEdit(found.target, new_text, change)


def write_edit(edit: TemplateEdit) -> TemplateChange:
    """Write a rendered edit: the file is replaced atomically (mode kept), and only when the
    image actually changes."""
    if edit.text is not None:
        write_whole(edit.path, edit.text.encode("utf-8"), durable=True)
    return edit.change


def check_warm_pools(paths: Iterable[Path]) -> None:
    """Each warm-pool file reads as YAML, checked before a run builds anything (its warnings
    are read before the push)."""
    for path in paths:
        _load_all(path)


def _find(path: Path, container: str | None) -> _Found:
    """The image value to edit, every check made that does not depend on the new image; a
    template that is a symlink is refused, never written through (builder.files)."""
    refuse_link(path)
    target = path
    raw = _read(target)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    documents = _compose(path, text)
    _safe_data(path, text)
    document = _template_document(path, documents)
    template_name = _scalar(_child(document, "metadata"), "name")
    chosen, node, in_flow = _image_node(path, document, container)
    span = _scalar_body(path, node, text, documents)
    check_replaceable(target, "template")
    return _Found(target, text, documents, node, span, in_flow, chosen, template_name)


def warm_pool_warnings(paths: Iterable[Path], template_name: str) -> list[str]:
    """Warnings for warm pools in `paths` that will keep serving pods of the old image.

    A SandboxWarmPool whose `spec.updateStrategy.type` is missing or OnReplenish replaces its
    already-running pods only when they are claimed or deleted, so after a template update the pool
    keeps handing out the previous image.
    """
    warnings = []
    for path in paths:
        for doc in _load_all(path):
            if not _is_kind(doc, WARM_POOL_KIND):
                continue
            spec = _mapping(doc.get("spec"))
            if _mapping(spec.get("sandboxTemplateRef")).get("name") != template_name:
                continue
            explicit = _mapping(spec.get("updateStrategy")).get("type")
            strategy = explicit or DEFAULT_WARM_POOL_STRATEGY
            if strategy != DEFAULT_WARM_POOL_STRATEGY:
                continue
            pool = _mapping(doc.get("metadata")).get("name", "<unnamed>")
            how = "(set explicitly)" if explicit else "(the default)"
            warnings.append(
                f"SandboxWarmPool {pool} in {path} uses updateStrategy {strategy} {how}: its"
                f" running warm pods keep the old image until they are claimed or deleted. To"
                f" replace them as soon as the template changes, set"
                f" spec.updateStrategy.type: Recreate in {path} and apply it"
                f" (kubectl apply -f {shlex.quote(str(path))})."
            )
    return warnings


def apply_hint(path: Path) -> str:
    """How the operator rolls the edited template out; the tool itself never talks to a cluster."""
    return f"apply the updated template: kubectl apply -f {shlex.quote(str(path))}"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None


def _compose(path: Path, text: str) -> list[Node | None]:
    try:
        return list(YAML().compose_all(text))
    except YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({_one_line(exc)})") from None


def _load_all(path: Path) -> list:
    try:
        return list(YAML().load_all(_read(path).decode("utf-8")))
    except (YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid YAML ({_one_line(exc)})") from None


def _mapping(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _is_kind(doc: object, kind: str) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kind") == kind
        and str(doc.get("apiVersion", "")).startswith(f"{API_GROUP}/")
    )


def _child(node: Node | None, key: str) -> Node | None:
    """The value under `key` of a mapping node (None when absent or not a mapping)."""
    if not isinstance(node, MappingNode):
        return None
    for key_node, value_node in node.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return value_node
    return None


def _scalar(node: Node | None, key: str) -> str | None:
    value = _child(node, key)
    return value.value if isinstance(value, ScalarNode) else None


def _template_document(path: Path, documents: list[Node | None]) -> MappingNode:
    """The one SandboxTemplate document of the file; refuses anything else with what it found."""
    found = []
    templates: list[MappingNode] = []
    for doc in documents:
        kind, api_version = _scalar(doc, "kind"), _scalar(doc, "apiVersion")
        found.append(f"kind: {kind or '(none)'}, apiVersion: {api_version or '(none)'}")
        # Only a mapping has scalars under keys, so a matching kind implies a MappingNode.
        if (
            isinstance(doc, MappingNode)
            and kind == TEMPLATE_KIND
            and (api_version or "").startswith(f"{API_GROUP}/")
        ):
            templates.append(doc)
    if not templates:
        seen = "; ".join(found) if found else "an empty file"
        raise UserError(f"{path} is not a SandboxTemplate ({API_GROUP}/v1beta1): found {seen}")
    if len(templates) > 1:
        names = ", ".join(_scalar(_child(t, "metadata"), "name") or "<unnamed>" for t in templates)
        raise UserError(
            f"{path} holds {len(templates)} SandboxTemplates ({names}); keep one a file"
        )
    return templates[0]


def _image_node(
    path: Path, document: MappingNode, container: str | None
) -> tuple[str, ScalarNode, bool]:
    """(container name, its image scalar, whether it sits in a flow mapping) of containers[N]."""
    containers = _child(
        _child(_child(_child(document, "spec"), "podTemplate"), "spec"), "containers"
    )
    if not isinstance(containers, SequenceNode) or not containers.value:
        raise UserError(f"{path}: the SandboxTemplate has no spec.podTemplate.spec.containers")
    names = [_scalar(c, "name") or f"#{i}" for i, c in enumerate(containers.value)]
    if container is None:
        index = 0
    elif container in names:
        index = names.index(container)
    else:
        raise UserError(
            f"{path}: no container named {container!r} in the SandboxTemplate"
            f" (containers: {', '.join(names)})"
        )
    node = _child(containers.value[index], "image")
    if not isinstance(node, ScalarNode):
        where = IMAGE_PATH.replace("N", str(index))
        raise UserError(f"{path}: {where} (container {names[index]}) is missing or not a string")
    return names[index], node, bool(containers.value[index].flow_style)


def _scalar_body(
    path: Path, node: ScalarNode, text: str, documents: list[Node | None]
) -> tuple[int, int]:
    """Start and end offsets of the scalar itself, past any anchor or tag written before it."""
    if sum(_uses(doc, node) for doc in documents) > 1:
        raise UserError(
            f"{path}: the image is a YAML anchor that other places alias; write the image"
            " out in place so only the container's image changes"
        )
    start, end = node.start_mark.index, node.end_mark.index
    span = text[start:end]
    if node.style in ("'", '"'):
        body = span.find(node.style)
        prefix_ok = body >= 0
    else:
        body = len(span) - len(node.value)
        prefix_ok = node.style is None and span.endswith(node.value)
    if not prefix_ok or (body and not span[:body][-1].isspace()):
        raise UserError(
            f"{path}: the image value at line {node.start_mark.line + 1} is a block or multi-line"
            " scalar; write it on one line to let the tool update it"
        )
    return start + body, end


def _uses(node: Node | None, target: Node) -> int:
    """How many places of the document tree hold `target` (aliases share the node object)."""
    if node is target:
        return 1
    if isinstance(node, MappingNode):
        return sum(_uses(k, target) + _uses(v, target) for k, v in node.value)
    if isinstance(node, SequenceNode):
        return sum(_uses(item, target) for item in node.value)
    return 0


def _replace_checked(
    path: Path,
    text: str,
    documents: list[Node | None],
    node: ScalarNode,
    span: tuple[int, int],
    image: str,
    in_flow: bool,
) -> str:
    """The text with the scalar swapped, in its original quoting style when that parses back.

    A plain scalar inside a flow mapping falls back to double quotes when the image holds `:` or
    a flow indicator: YAML 1.2 reads it, but YAML 1.1 parsers (PyYAML, older libyaml) refuse it.
    """
    expected = _safe_data(path, text)
    doc_index, keys = next(
        (i, keys) for i, doc in enumerate(documents) if (keys := _data_path(doc, node)) is not None
    )
    parent = expected[doc_index]
    for key in keys[:-1]:
        parent = parent[key]
    parent[keys[-1]] = image
    double = '"' + image.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if node.style == "'":
        first = "'" + image.replace("'", "''") + "'"
    elif node.style == '"' or (in_flow and set(image) & set(":,[]{}#")):
        first = double
    else:
        first = image
    for rendered in dict.fromkeys((first, double)):
        candidate = text[: span[0]] + rendered + text[span[1] :]
        try:
            if _data(candidate) == expected:
                return candidate
        except YAMLError:
            continue
    raise UserError(
        f"{path}: cannot write {image!r} into the template without changing its meaning"
    )


def _safe_data(path: Path, text: str) -> list:
    """The documents as plain data, as a YAML 1.1 reader sees them too (a duplicate key is
    refused here, where composing lets it through)."""
    try:
        return _data(text)
    except YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({_one_line(exc)})") from None


def _data(text: str) -> list:
    return list(YAML(typ="safe", pure=True).load_all(text))


def _data_path(node: Node | None, target: Node) -> list | None:
    """Keys and indexes leading from `node` to `target`, or None when it is not below `node`."""
    if node is target:
        return []
    children: list[tuple[object, Node]] = []
    if isinstance(node, MappingNode):
        children = [(k.value, v) for k, v in node.value if isinstance(k, ScalarNode)]
    elif isinstance(node, SequenceNode):
        children = list(enumerate(node.value))
    for key, child in children:
        below = _data_path(child, target)
        if below is not None:
            return [key, *below]
    return None
