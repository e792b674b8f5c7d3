"""The layering the package promises: what each layer may import, and modules small enough to read.

Imports are read with `ast` (module level and inside functions alike), so a lazy import does
not slip past the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "builder"
MAX_LINES = 450
# layer -> the builder packages/modules it must never import
FORBIDDEN = {
    "analysis": ("builder.base", "builder.image", "builder.verify", "builder.engine",
                 "builder.pipeline", "builder.cli", "builder.oci", "docker"),
    "base": ("builder.image", "builder.verify", "builder.pipeline", "builder.cli"),
    "image": ("builder.verify", "builder.pipeline", "builder.cli"),
    "verify": ("builder.analysis", "builder.image", "builder.pipeline", "builder.cli"),
}  # fmt: skip


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])


def imported_names(source: str, package: str) -> set[str]:
    """Every module `source` imports, absolute names (relative imports resolved)."""
    tree = ast.parse(source)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}".rstrip(".")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_what_it_may(layer: str) -> None:
    assert modules(layer), f"builder/{layer} has no modules"
    offences = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in modules(layer)
        for name in sorted(imported_names(path.read_text(), package_of(path)))
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer])
    ]
    assert not offences, "\n".join(offences)


def test_every_layer_says_its_job_and_its_imports() -> None:
    for layer in FORBIDDEN:
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
        assert doc and "import" in doc, f"builder/{layer}/__init__.py must say what it may import"


def test_no_module_outside_runtime_is_too_long() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): n
        for path in PACKAGE.rglob("*.py")
        if "runtime" not in path.relative_to(PACKAGE).parts
        and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_import_rule_reader_sees_lazy_and_relative_imports() -> None:
    """The checker itself must catch what it exists to catch."""
    source = "def f():\n    from ..image import render\n    import docker\n"
    names = imported_names(source, "builder.analysis")
    assert "builder.image.render" in names and "docker" in names
