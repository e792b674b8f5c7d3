"""Native libraries Python code loads at run time, read from its syntax tree.

ctypes (`CDLL`, `PyDLL`, `cdll.LoadLibrary`, `ctypes.util.find_library`) and cffi
(`ffi.dlopen`) name the library in a string; an ELF scan cannot see it. The names are
followed through the usual indirections: a module-level constant, a local or a small helper
function returning the name, a list of candidates tried in a loop, and a helper whose
parameter is what gets loaded (`_dlopen(ffi, "gobject-2.0", "libgobject-2.0.so.0")`).
Anything computed at run time (paths from `__file__`, environment variables) is not a system
library need and is left alone. Windows-only loaders (`WinDLL`, `windll`, `OleDLL`) are ignored.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# Only files containing one of these words are parsed: most of a big wheel set never loads.
MARKERS = re.compile(rb"ctypes|cffi|dlopen|find_library")
LOADERS = {"CDLL", "PyDLL", "LoadLibrary", "dlopen"}  # the called name's last part
FINDERS = {"find_library"}
WINDOWS_ONLY = {"WinDLL", "windll", "OleDLL", "oledll"}
SKIPPED_DIRS = {"tests", "test", "testing", "__pycache__"}  # never run in the sandbox


@dataclass(frozen=True)
class LoadSite:
    """One place in a wheel that loads a native library by name, with the names it tries."""

    path: str  # tree path of the .py file
    line: int
    names: tuple[str, ...]  # candidate names in order: any one of them satisfies the load

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "names": list(self.names)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoadSite:
        return cls(data["path"], data["line"], tuple(data["names"]))


def worth_reading(path: str) -> bool:
    """A .py file outside test directories: the code the sandbox may run."""
    parts = path.split("/")
    if not path.endswith(".py") or SKIPPED_DIRS.intersection(parts[:-1]):
        return False
    return parts[-1].removesuffix(".py") not in {"conftest", "setup"}


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id in WINDOWS_ONLY:
            return None
        if isinstance(func.value, ast.Attribute) and func.value.attr in WINDOWS_ONLY:
            return None
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _strings(node: ast.AST | None) -> list[str] | None:
    """A literal string or a list/tuple of them, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple):
        found = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        strings = [value for value in found if isinstance(value, str)]
        return strings if strings else None
    return None


Scalar = str | int


def _bind(function: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call) -> dict[str, Scalar]:
    """The helper's parameters that the call (or a default) gives a literal value."""
    arguments = function.args
    positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
    defaults = arguments.defaults
    given: dict[str, ast.AST] = {}
    if defaults:
        given |= dict(zip(positional[-len(defaults) :], defaults, strict=True))
    given |= dict(zip(positional, call.args, strict=False))  # *args beyond are not bound
    given |= {k.arg: k.value for k in call.keywords if k.arg is not None}
    return {
        name: node.value
        for name, node in given.items()
        if isinstance(node, ast.Constant) and isinstance(node.value, str | int)
    }


def _evaluate(node: ast.AST, env: Mapping[str, Scalar]) -> str | None:
    """A string built from literals and bound parameters (f-string, +), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int):
        return str(node.value)
    if isinstance(node, ast.Name) and node.id in env:
        return str(env[node.id])
    if isinstance(node, ast.FormattedValue) and node.format_spec is None:
        return _evaluate(node.value, env)
    if isinstance(node, ast.JoinedStr):
        parts = [_evaluate(value, env) for value in node.values]
        return None if None in parts else "".join(part or "" for part in parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        return None if left is None or right is None else left + right
    return None


class _Module:
    """Name bindings of one module, enough to follow a name back to its literal strings."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        self.assigned: dict[str, list[ast.AST]] = {}  # name -> values assigned anywhere
        self.loops: dict[str, list[ast.AST]] = {}  # loop variable -> iterables
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.assigned.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                if isinstance(node.target, ast.Name):
                    self.assigned.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.For | ast.comprehension) and isinstance(
                node.target, ast.Name
            ):
                self.loops.setdefault(node.target.id, []).append(node.iter)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.setdefault(node.name, node)

    def enclosing(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None

    def names(
        self, node: ast.AST, depth: int = 0, env: Mapping[str, Scalar] = MappingProxyType({})
    ) -> list[str]:
        """Every literal library name `node` can evaluate to, in source order."""
        if depth > 4:
            return []
        if (literal := _strings(node)) is not None:
            return literal
        if env and (text := _evaluate(node, env)) is not None:
            return [text]
        found: list[str] = []
        if isinstance(node, ast.Name):
            for value in self.assigned.get(node.id, []):
                found += self.names(value, depth + 1)
            for iterable in self.loops.get(node.id, []):
                found += self.names(iterable, depth + 1)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                found += self.names(value, depth + 1, env)
        elif isinstance(node, ast.IfExp):
            found += self.names(node.body, depth + 1, env)
            found += self.names(node.orelse, depth + 1, env)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            function = self.functions.get(node.func.id)
            if function is not None:
                bound = _bind(function, node)
                returns = [n for n in ast.walk(function) if isinstance(n, ast.Return) and n.value]
                for inner in sorted(returns, key=lambda n: (n.lineno, n.col_offset)):
                    if inner.value is not None:
                        found += self.names(inner.value, depth + 1, bound)
        return list(dict.fromkeys(found))

    def parameter(self, node: ast.AST) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, int] | None:
        """(helper, position) when `node` is a helper's parameter, or a loop over its *args
        (position -1): then the helper's callers name the library."""
        function = self.enclosing(node)
        if function is None or not isinstance(node, ast.Name):
            return None
        arguments = function.args
        positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
        if node.id in positional:
            return function, positional.index(node.id)
        vararg = arguments.vararg.arg if arguments.vararg else None
        for iterable in self.loops.get(node.id, []):
            if isinstance(iterable, ast.Name) and iterable.id == vararg:
                return function, -1
            if isinstance(iterable, ast.Name) and iterable.id in positional:
                return function, positional.index(iterable.id)
        return None

    def helper_calls(
        self, function: ast.FunctionDef | ast.AsyncFunctionDef, position: int
    ) -> Iterator[tuple[int, list[str]]]:
        skip = len(function.args.posonlyargs) + len(function.args.args) if position < 0 else 0
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call) or _called(node) != function.name:
                continue
            args = node.args[skip:] if position < 0 else node.args[position : position + 1]
            names = [name for arg in args for name in self.names(arg)]
            if names:
                yield node.lineno, names


def scan_source(path: str, source: bytes) -> list[LoadSite]:
    """Every load of a library by a name the code spells out, with file:line."""
    if not MARKERS.search(source):
        return []
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError):
        return []  # not Python 3 source: the interpreter could not run it either
    module = _Module(tree)
    sites: dict[tuple[int, tuple[str, ...]], LoadSite] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        called = _called(node)
        if called not in LOADERS and called not in FINDERS:
            continue
        argument = node.args[0]
        if called in LOADERS and isinstance(argument, ast.Call) and _called(argument) in FINDERS:
            continue  # CDLL(find_library("x")): the inner call is the site
        names = module.names(argument)
        if names:
            sites[(node.lineno, tuple(names))] = LoadSite(path, node.lineno, tuple(names))
        elif (helper := module.parameter(argument)) is not None:
            for line, called_with in module.helper_calls(*helper):
                sites[(line, tuple(called_with))] = LoadSite(path, line, tuple(called_with))
    return sorted(sites.values(), key=lambda site: (site.line, site.names))
