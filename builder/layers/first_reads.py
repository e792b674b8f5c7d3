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

The imports are read line by line, not from a syntax tree of the whole file: a line starting
with `import`/`from`, outside a triple-quoted string, whose enclosing block headers (the less
indented lines above it) are all `if`/`elif`/`else`/`try`/`except`/`finally`/`with`. Only that
statement is parsed. Parsing every module the import reaches cost a cold build 8 s of CPU for
the issue-38 set (4.3 s for sympy alone), and a 3.11 interpreter cannot parse 3.12 syntax
(`type X = ...`), so the order depended on which Python ran the tool. On the wheels of that set
the two readings give the same first reads.

Layout: directories first (sorted: their files' parents come before them), then the first
reads in import order, then every other file sorted.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import posixpath
import re
import threading
import zipfile
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from builder.cache import Cache
from builder.inspect.members import UNREADABLE, unreadable
from builder.layers.install_layout import LAYOUT_FORMAT, install_entries

# CPython 3.11's ast.parse is not thread-safe ("AST constructor recursion depth mismatch" when
# two threads parse at once); layers and compiles run on threads, so parses take turns.
PARSING = threading.Lock()
NOT_MODULES = (".dist-info", ".data", ".libs")
IMPORT_LINE = re.compile(rb"^([ \t]*)(?:import|from)[ \t\\(]", re.MULTILINE)
TRIPLE_QUOTE = re.compile(rb'"""|\'\'\'|#')  # a quote in a comment opens no string
FIRST_WORD = re.compile(rb"[ \t]*(\w*)")
# Blocks whose body runs when the module is imported, as the module-level reading follows them.
FOLLOWED = frozenset({b"if", b"elif", b"else", b"try", b"except", b"finally", b"with"})


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
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    lines = list(IMPORT_LINE.finditer(data))
    if not lines:
        return []
    strings = _triple_quoted(data, lines[-1].start())  # the strings above the last import
    found: list[str] = []
    for line in lines:
        start = line.start()
        if _inside(strings, start) or not _module_level(data, start, len(line[1]), strings):
            continue
        try:
            with PARSING:
                statements = ast.parse(_statement(data, start)).body
        except (SyntaxError, ValueError):
            continue
        for statement in statements:
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
    return found


def _triple_quoted(data: bytes, until: int) -> list[tuple[int, int]]:
    """(start, end) of the triple-quoted strings (docstrings) that start before `until`, in
    order; quotes in a comment open none."""
    spans: list[tuple[int, int]] = []
    position = 0
    while (found := TRIPLE_QUOTE.search(data, position, until)) is not None:
        if found[0] == b"#":
            position = data.find(b"\n", found.end())
            if position < 0:
                break
            continue
        end = data.find(found[0], found.end())
        end = len(data) if end < 0 else end + 3
        spans.append((found.start(), end))
        position = end
    return spans


def _inside(strings: list[tuple[int, int]], position: int) -> bool:
    """Whether `position` lies within one of `strings` (sorted spans)."""
    index = bisect.bisect_right(strings, position, key=lambda span: span[0]) - 1
    return index >= 0 and position < strings[index][1]


def _module_level(data: bytes, start: int, indent: int, strings: list[tuple[int, int]]) -> bool:
    """Whether the line at `start` (indented by `indent`) runs at import: every less indented
    line it sits under is a followed block's header, up to the module's own level."""
    position = start
    while indent and position > 0:
        end = position - 1
        position = data.rfind(b"\n", 0, end) + 1
        text = data[position:end]
        stripped = text.lstrip(b" \t")
        if not stripped or stripped.startswith(b"#") or _inside(strings, position):
            continue
        if len(text) - len(stripped) >= indent:
            continue
        header = FIRST_WORD.match(text)
        if header is None or header[1] not in FOLLOWED:
            return False  # a function, a class, a loop: its imports wait for a call
        indent = len(text) - len(stripped)
    return not indent


def _statement(data: bytes, start: int) -> bytes:
    """The logical line starting at `start`: through its brackets and backslash continuations."""
    depth, position = 0, start
    while position < len(data):
        byte = data[position]
        if byte in b"([{":
            depth += 1
        elif byte in b")]}":
            depth -= 1
        elif byte == ord("\\") and data[position + 1 : position + 2] == b"\n":
            position += 1
        elif byte == ord("#"):
            position = data.find(b"\n", position)
            if position < 0 or depth <= 0:
                break
        elif byte == ord("\n") and depth <= 0:
            break
        position += 1
    return data[start : position if position >= 0 else len(data)].lstrip(b" \t")


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
            try:
                return entry.data if entry.data is not None else archive.read(entry.member)
            except UNREADABLE as error:
                raise unreadable(wheel.name, entry.member, error) from None

        return first_reads(entries, source)
