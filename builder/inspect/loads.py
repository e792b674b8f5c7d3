"""Native libraries Python code loads at run time, read from its syntax tree.

ctypes (`CDLL`, `PyDLL`, `cdll.LoadLibrary`, `ctypes.util.find_library`) and cffi
(`ffi.dlopen`) name the library in a string; an ELF scan cannot see it. The names are
followed through the usual indirections: a module-level constant, a local or a small helper
function returning the name, a list of candidates tried in a loop, and a helper whose
parameter is what gets loaded (`_dlopen(ffi, "gobject-2.0", "libgobject-2.0.so.0")`).
A helper defined in one module of a wheel and imported by another (cairocffi's `pixbuf.py`
calls `dlopen` from its package's `__init__.py`) is followed one import deep. A load inside
a `try` whose handler carries on without the library is optional.
Anything computed at run time (paths from `__file__`, environment variables) is not a system
library need and is left alone. Windows-only loaders (`WinDLL`, `windll`, `OleDLL`) are ignored.
What an expression is, its literals known, is inspect.literals' (shared with program runs);
`Module` holds where a name is bound, for both readers.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NotRequired, TypedDict

from builder.inspect.literals import Function, Scalar, bound, branches, positional, returns, strings

LOADERS = frozenset({"CDLL", "PyDLL", "LoadLibrary", "dlopen"})  # the called name's last part
FINDERS = frozenset({"find_library"})
# Only files spelling a loader's name are parsed (a site is a call to one): most of a big
# wheel set never loads. Substring tests, as they are several times faster than a regex.
NOTHING_BOUND: Mapping[str, Scalar] = MappingProxyType({})  # outside a helper's call
MARKERS = tuple(name.encode() for name in sorted(LOADERS | FINDERS))
WINDOWS_ONLY = frozenset({"WinDLL", "windll", "OleDLL", "oledll"})
# What a failed load raises (or a catch-all): a handler for one of these that does not raise
# carries on without it.
LOAD_ERRORS = frozenset({"OSError", "EnvironmentError", "Exception", "BaseException"})
SKIPPED_DIRS = frozenset({"tests", "test", "testing", "docs", "doc", "__pycache__"})  # never run


class LoadRecord(TypedDict):
    """A `LoadSite` as the wheel inspection cache holds it (JSON): `optional` only when true."""

    path: str
    line: int
    names: list[str]
    optional: NotRequired[bool]


@dataclass(frozen=True)
class LoadSite:
    """One place in a wheel loading a native library (or running a program) by names it tries."""

    path: str  # tree path of the .py file
    line: int
    names: tuple[str, ...]  # candidate names in order: any one of them satisfies the load
    optional: bool = False  # inside a `try` whose handler carries on without the library

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def to_dict(self) -> LoadRecord:
        data = LoadRecord(path=self.path, line=self.line, names=list(self.names))
        if self.optional:
            data["optional"] = True
        return data

    @classmethod
    def from_dict(cls, data: LoadRecord) -> LoadSite:
        return cls(data["path"], data["line"], tuple(data["names"]), data.get("optional", False))


@dataclass(frozen=True)
class Helper:
    """A function whose argument at `position` is a library it loads (-1: every argument from
    `skip` on, a `*names` parameter): its callers name the library."""

    qualified: str  # module.function
    position: int
    skip: int


def mentions_loader(source: bytes) -> bool:
    return any(marker in source for marker in MARKERS)


def worth_reading(path: str) -> bool:
    """A .py file an import can reach outside test directories: the code the sandbox may run.
    Sources shipped as data (a template under `third-party/`, a module named `1.0.py`) are no
    module: every part of the path must be a name `import` can spell."""
    parts = path.split("/")
    if not path.endswith(".py") or SKIPPED_DIRS.intersection(parts[:-1]):
        return False
    module = parts[-1].removesuffix(".py")
    if not all(part.isidentifier() for part in [*parts[:-1], module]):
        return False
    return module not in {"conftest", "setup"}


def module_name(path: str) -> str:
    """`pkg/sub/__init__.py` → `pkg.sub`, `pkg/mod.py` → `pkg.mod`."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id in WINDOWS_ONLY:
            return None
        if isinstance(func.value, ast.Attribute) and func.value.attr in WINDOWS_ONLY:
            return None
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _walked(tree: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.AST]:
    """Every node of `tree` in ast.walk's (breadth-first) order, each child's parent recorded.

    The inner loop is the hottest of a cold inspection (torch: millions of nodes): it reads
    each node's fields once and skips the scalars (names, numbers) without a call."""
    nodes = [tree]
    append = nodes.append
    AST, list_ = ast.AST, list
    for node in nodes:  # grows as it goes: breadth first
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list_):
                for child in value:
                    if isinstance(child, AST):
                        parents[child] = node
                        append(child)
            elif isinstance(value, AST):
                parents[value] = node
                append(value)
    return nodes


_BINDING = frozenset(
    {
        ast.Assign,
        ast.AnnAssign,
        ast.NamedExpr,
        ast.For,
        ast.comprehension,
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.Import,
        ast.ImportFrom,
    }
)  # the node types `Module._record` reads a binding from


class Module:
    """Name bindings of one module, enough to follow a name back to its literal strings."""

    def __init__(self, tree: ast.Module, path: str = "") -> None:
        self.tree = tree
        self.path = path
        self.name = module_name(path)  # dotted, for relative imports
        self.imports: dict[str, str] = {}  # bound name -> what it names, fully qualified
        self.parents: dict[ast.AST, ast.AST] = {}
        self.assigned: dict[str, list[ast.AST]] = {}  # name -> values assigned anywhere
        self.loops: dict[str, list[ast.AST]] = {}  # loop variable -> iterables
        self.functions: dict[str, Function] = {}
        # names() per (node, depth, bindings): names assigned from each other many times over
        # would otherwise be followed once per path, exponentially in the depth.
        self.memo: dict[tuple[int, int, tuple[tuple[str, Scalar], ...]], list[str]] = {}
        # Every node once, in ast.walk's order: the scans below go over these lists rather than
        # walking the tree again (ast.walk was most of a cold inspection's time).
        self.nodes = _walked(tree, self.parents)
        self.calls = [node for node in self.nodes if type(node) is ast.Call]
        for node in self.nodes:
            if type(node) in _BINDING:  # most nodes bind nothing: no call for them
                self._record(node)

    def _record(self, node: ast.AST) -> None:
        """What one node binds: a name's value, a loop's variable, a function, an import."""
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.assigned.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            if isinstance(node.target, ast.Name):
                self.assigned.setdefault(node.target.id, []).append(node.value)
        elif isinstance(node, ast.For | ast.comprehension):
            self._loop(node.target, node.iter)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.functions.setdefault(node.name, node)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            self._import(node)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        """The names an import binds, each to what it names fully qualified."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.partition(".")[0]
                self.imports[name] = alias.name if alias.asname else name
            return
        source = self._absolute(node)
        for alias in node.names:
            self.imports[alias.asname or alias.name] = f"{source}.{alias.name}"

    def _loop(self, target: ast.AST, iterable: ast.AST) -> None:
        """`for name in X`, and `for i, name in enumerate(X)` (audioread's candidates)."""
        call = iterable if isinstance(iterable, ast.Call) and iterable.args else None
        if call and getattr(call.func, "id", None) == "enumerate" and isinstance(target, ast.Tuple):
            target, iterable = target.elts[-1], call.args[0]
        if isinstance(target, ast.Name):
            self.loops.setdefault(target.id, []).append(iterable)

    def _absolute(self, node: ast.ImportFrom) -> str:
        """The module an `from X import` names, relative levels resolved against this one."""
        if not node.level:
            return node.module or ""
        package = self.name.split(".")
        if not self.path.endswith("/__init__.py"):
            package = package[:-1]
        base = package[: len(package) - node.level + 1]
        return ".".join([*base, node.module] if node.module else base)

    def enclosing(self, node: ast.AST) -> Function | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None

    def names(
        self, node: ast.AST, depth: int = 0, env: Mapping[str, Scalar] = NOTHING_BOUND
    ) -> list[str]:
        """Every literal library name `node` can evaluate to, in source order."""
        if depth > 4:
            return []
        key = (id(node), depth, tuple(sorted(env.items())))
        if key not in self.memo:
            self.memo[key] = self._names(node, depth, env)
        return self.memo[key]

    def _names(self, node: ast.AST, depth: int, env: Mapping[str, Scalar]) -> list[str]:
        if (literal := strings(node)) is not None:
            return literal
        if (value := bound(node, env)) is not None:
            return [value]
        found: list[str] = []
        for inner, inner_env in self._followed(node, env):
            found += self.names(inner, depth + 1, inner_env)
        return list(dict.fromkeys(found))

    def _followed(
        self, node: ast.AST, env: Mapping[str, Scalar]
    ) -> list[tuple[ast.AST, Mapping[str, Scalar]]]:
        """Where `node`'s names come from, each with the bindings to read it under: a name's
        assignments and the iterables it loops over, a choice's branches, a helper's returns."""
        if isinstance(node, ast.Name):
            values = [*self.assigned.get(node.id, []), *self.loops.get(node.id, [])]
            return [(value, NOTHING_BOUND) for value in values]
        if (choices := branches(node)) is not None:
            return [(choice, env) for choice in choices]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            function = self.functions.get(node.func.id)
            if function is not None:
                returned, binding = returns(function, node)
                return [(value, binding) for value in returned]
        return []

    def parameter(self, node: ast.AST) -> tuple[Function, int] | None:
        """(helper, position) when `node` is a helper's parameter, or loops over its *args (-1)."""
        function = self.enclosing(node)
        if function is None or not isinstance(node, ast.Name):
            return None
        names = positional(function)
        if node.id in names:
            return function, names.index(node.id)
        vararg = function.args.vararg.arg if function.args.vararg else None
        for iterable in self.loops.get(node.id, []):
            if isinstance(iterable, ast.Name) and iterable.id == vararg:
                return function, -1
            if isinstance(iterable, ast.Name) and iterable.id in names:
                return function, names.index(iterable.id)
        return None

    def site(self, call: ast.Call, names: list[str]) -> LoadSite:
        return LoadSite(self.path, call.lineno, tuple(names), self.guarded(call))

    def guarded(self, node: ast.AST, errors: frozenset[str] = LOAD_ERRORS) -> bool:
        """Whether a failure at `node` is caught and the code goes on without the library (or
        program): the innermost `try` around it swallows one of `errors`, and no loop around
        that `try` (in the same function) makes it one candidate of several."""
        child, parent = node, self.parents.get(node)
        while parent is not None and not isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
            if isinstance(parent, ast.Try | ast.TryStar) and child in parent.body:
                return _swallows(parent, errors) and not self._in_loop(parent)
            child, parent = parent, self.parents.get(parent)
        return False

    def _in_loop(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        while parent is not None and not isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
            if isinstance(parent, ast.For | ast.AsyncFor | ast.While):
                return True
            parent = self.parents.get(parent)
        return False

    def arguments(self, call: ast.Call, helper: Helper) -> list[str]:
        """The library names a call to `helper` passes where the helper loads them."""
        if helper.position < 0:
            args = call.args[helper.skip :]
        else:
            args = call.args[helper.position : helper.position + 1]
        return [name for arg in args for name in self.names(arg)]

    def resolve(self, func: ast.AST) -> str | None:
        """What a called `name` or `alias.name` refers to through this module's imports."""
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id not in self.imports:
            return None
        return ".".join([self.imports[func.id], *parts])


def _swallows(node: ast.Try | ast.TryStar, errors: frozenset[str]) -> bool:
    """A handler catches one of `errors` (a failed load, a missing program) and does not raise."""
    for handler in node.handlers:
        caught = handler.type
        types = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        names = {t.id for t in types if isinstance(t, ast.Name)}
        if caught is None or names & errors:
            return not any(isinstance(n, ast.Raise) for n in ast.walk(handler))
    return False


def parse(path: str, source: bytes) -> Module | None:
    try:
        return Module(ast.parse(source, filename=path), path)
    except (SyntaxError, ValueError):
        return None  # not Python 3 source: the interpreter could not run it either
    except RecursionError:
        return None  # nested too deep to build a tree of (CPython could not compile it either)


def _analyse(module: Module) -> tuple[list[LoadSite], list[Helper]]:
    """The module's own load sites, and its top-level helpers other modules may call."""
    sites: list[LoadSite] = []
    helpers: list[Helper] = []
    for node in module.calls:
        if not node.args:
            continue
        called = _called(node)
        if called not in LOADERS and called not in FINDERS:
            continue
        argument = node.args[0]
        if called in LOADERS and isinstance(argument, ast.Call) and _called(argument) in FINDERS:
            continue  # CDLL(find_library("x")): the inner call is the site
        if names := module.names(argument):
            sites.append(module.site(node, names))
            continue
        if (found := module.parameter(argument)) is None:
            continue
        function, position = found
        skip = len(positional(function)) if position < 0 else 0
        helper = Helper(f"{module.name}.{function.name}", position, skip)
        for call in module.calls:
            if _called(call) != function.name:
                continue
            if names := module.arguments(call, helper):
                sites.append(module.site(call, names))
        if module.parents.get(function) is module.tree:
            helpers.append(helper)
    return sites, helpers


def _imported_sites(module: Module, helpers: Mapping[str, list[Helper]]) -> list[LoadSite]:
    """Calls to helpers that `module` imports from another module of the wheel."""
    sites = []
    for node in module.calls:
        if (qualified := module.resolve(node.func)) is None:
            continue
        for helper in helpers.get(qualified, []):
            if names := module.arguments(node, helper):
                sites.append(module.site(node, names))
    return sites


def ordered(sites: Iterable[LoadSite]) -> list[LoadSite]:
    return sorted(set(sites), key=lambda site: (site.path, site.line, site.names))


def scan_source(path: str, source: bytes) -> list[LoadSite]:
    """Every load of a library by a name the code spells out, with file:line."""
    if not mentions_loader(source) or (module := parse(path, source)) is None:
        return []
    return ordered(_analyse(module)[0])


def scan_sources(paths: Iterable[str], read: Callable[[str], bytes]) -> list[LoadSite]:
    """Every load in one wheel's sources, helpers imported from a sibling module followed.

    Only files with a loader word are parsed. A helper they define may be called from a file
    without one (`from . import load_library`), so once helpers are known, the files naming
    one are parsed too. One level: a helper re-exported through a third module is not followed.
    """
    modules: list[Module] = []
    unparsed: list[str] = []
    sites: list[LoadSite] = []
    helpers: dict[str, list[Helper]] = {}
    for path in filter(worth_reading, paths):
        source = read(path)
        if not mentions_loader(source):
            unparsed.append(path)
        elif (module := parse(path, source)) is not None:
            found, exported = _analyse(module)
            sites += found
            modules.append(module)
            for helper in exported:
                helpers.setdefault(helper.qualified, []).append(helper)
    if not helpers:
        return ordered(sites)
    words = sorted({name.rpartition(".")[2].encode() for name in helpers})
    mentions = re.compile(rb"\b(?:" + b"|".join(map(re.escape, words)) + rb")\b")
    for path in unparsed:
        source = read(path)
        if mentions.search(source) and (module := parse(path, source)) is not None:
            modules.append(module)
    for module in modules:
        sites += _imported_sites(module, helpers)
    return ordered(sites)
