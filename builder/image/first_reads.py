"""Which files of a layer the first import reads, so the layer writers put them first.

A lazy node (SOCI) fetches a layer by spans as files are read: when the files that importing
a distribution reads sit together at the front of its layer, the first import fetches a few
spans instead of touching spans across the whole layer. What importing reads is known from the
wheel itself: starting at each top-level module the wheel installs, the modules its
module-level `import` statements name within the distribution (absolute or relative, through
`if`/`try`/`with` blocks, not inside functions or classes), breadth first; the extension
modules among them, and a vendored `<name>.libs/` directory when any extension is read (the
loader maps those libraries at import). Static reading overshoots a little (an import guarded
by a condition) and misses what is imported dynamically; either way it only moves files within
the layer. The order is a pure function of the installed paths and the sources, so a layer stays
byte-identical on any machine, and the same wheel gives the same layer in every set.

Layout: directories first (sorted: their files' parents come before them), then the first
reads in import order, then every other file sorted.
"""

from __future__ import annotations

import ast
import hashlib
import posixpath
import threading
import zipfile
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from builder.cache import Cache
from builder.image.install_layout import install_entries

# Bump when the order changes, or where install_layout puts a wheel's files: it keys the layers
# and the first reads kept in the cache (which name those installed paths).
LAYOUT_FORMAT = "first-reads/1"
# CPython 3.11's ast.parse is not thread-safe ("AST constructor recursion depth mismatch" when
# two threads parse at once); layers and compiles run on threads, so parses take turns.
PARSING = threading.Lock()
NOT_MODULES = (".dist-info", ".data", ".libs")


def module_name(path: str) -> str | None:
    """The module a source or extension path installs (`a/b/__init__.py` is `a.b`)."""
    directory, base = posixpath.split(path)
    if base.endswith(".py"):
        stem = base[:-3]
    elif base.endswith(".so"):
        stem = base.split(".", 1)[0]
    else:
        return None
    parts = [p for p in directory.split("/") if p]
    if any(p.endswith(NOT_MODULES) or p in ("bin", "__pycache__") for p in parts):
        return None
    if not stem.isidentifier() or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts if stem == "__init__" else [*parts, stem]) or None


def first_reads(paths: Iterable[str], source: Callable[[str], bytes]) -> tuple[str, ...]:
    """The installed `paths` importing every top-level module reads, in import order.

    `source(path)` gives a `.py` file's bytes (read only for the modules visited).
    """
    files = sorted(paths)
    modules: dict[str, str] = {}
    for path in files:
        name = module_name(path)
        if name is not None:
            modules.setdefault(name, path)  # one file per module: the first in sorted order
    queue = deque(sorted({name.split(".")[0] for name in modules}))
    seen: set[str] = set(queue)
    order: list[str] = []
    while queue:
        current = queue.popleft()
        found = modules.get(current)
        if found is None:
            continue
        order.append(found)
        if not found.endswith(".py"):
            continue
        for imported in _imports(current, found, source(found)):
            parts = imported.split(".")
            for depth in range(1, len(parts) + 1):
                candidate = ".".join(parts[:depth])
                if candidate in modules and candidate not in seen:
                    seen.add(candidate)
                    queue.append(candidate)
    if any(path.endswith(".so") for path in order):
        order += [p for p in files if p.split("/")[0].endswith(".libs")]
    return tuple(order)


def _imports(name: str, path: str, data: bytes) -> list[str]:
    """The modules a source's module-level imports name (relative ones made absolute)."""
    try:
        with PARSING:
            tree = ast.parse(data, filename=path)
    except (SyntaxError, ValueError):
        return []
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: list[str] = []
    statements: list[ast.stmt] = list(tree.body)
    while statements:
        statement = statements.pop(0)
        if isinstance(statement, ast.Import):
            found += [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom):
            base = statement.module or ""
            if statement.level:
                anchor = package.split(".")[: len(package.split(".")) - statement.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base:
                found.append(base)
                found += [f"{base}.{alias.name}" for alias in statement.names]
        elif isinstance(statement, (ast.If, ast.Try, ast.With)):
            statements[:0] = [
                *statement.body,
                *getattr(statement, "orelse", []),
                *[s for handler in getattr(statement, "handlers", []) for s in handler.body],
                *getattr(statement, "finalbody", []),
            ]
    return found


def laid_out(names: Sequence[str], directories: Iterable[str], first: Sequence[str]) -> list[str]:
    """`names` (tar member names) in layer order: directories, the first reads, the rest."""
    folders = set(directories)
    present = set(names)
    leading = list(dict.fromkeys(n for n in first if n in present and n not in folders))
    placed = set(leading)
    return [
        *sorted(n for n in names if n in folders),
        *leading,
        *sorted(n for n in names if n not in folders and n not in placed),
    ]


def cached_first_reads(wheel: Path, wheel_sha256: str, cache: Cache) -> tuple[str, ...]:
    """`wheel_first_reads`, kept by the wheel's sha256: the distribution layer and the bytecode
    layer both lay the wheel out, and a compile cache hit needs it again, while reading it
    parses every source the import reaches (4.0 s for sympy, 2.8 s for pandas). One caller
    reads it at a time: a compile and the layer writer on other threads wait for it."""
    key = hashlib.sha256(f"{LAYOUT_FORMAT}\n{wheel_sha256}".encode()).hexdigest()

    def made() -> tuple[str, ...]:
        first = wheel_first_reads(wheel)
        cache.put_record("first-reads", key, {"paths": list(first)})
        return first

    return cache.made_once("first-reads", key, lambda: _kept(key, cache), made)


def _kept(key: str, cache: Cache) -> tuple[str, ...] | None:
    """The first reads the cache keeps under `key`, or None."""
    record = cache.get_record("first-reads", key)
    kept = record.get("paths") if isinstance(record, dict) else None
    if isinstance(kept, list) and all(isinstance(path, str) for path in kept):
        return tuple(kept)
    return None


def wheel_first_reads(wheel: Path) -> tuple[str, ...]:
    """`first_reads` of what `wheel` installs (paths under the --target root)."""
    with zipfile.ZipFile(wheel) as archive:
        entries = {e.path: e for e in install_entries(archive, 0, wheel.name)}

        def source(path: str) -> bytes:
            entry = entries[path]
            return entry.data if entry.data is not None else archive.read(entry.member)

        return first_reads(entries, source)
