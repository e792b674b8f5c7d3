"""How a name in a wheel's code leads to the programs it can name: inspect.programs' reader.

A site's argument is followed through a module constant, an attribute (set from a parameter
whose default names the program: `def __init__(self, executable="ffmpeg")`),
`pathlib.Path('dot')`, a list built then extended, a small helper's returns (its parameters
bound to the call's literals), a method of the same class returning the command
(`self.make_args(args)`) or a property read as an attribute (`self.arguments`), a constant or
function of a sibling module, and candidates tried in turn. The result is groups: each group one
need, its names alternatives (a conditional, an `or`, a helper's several returns, a loop over
candidates are one choice of the code).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from enum import Enum

from builder.inspect.literals import (
    Function,
    Scalar,
    bound,
    branches,
    default,
    returns,
    text,
    words,
)
from builder.inspect.loads import NOTHING_BOUND, Module, module_name, parse, worth_reading
from builder.inspect.program_names import first_word, launched


class Kind(Enum):
    """What an expression that reaches a run holds."""

    NAME = "name"  # one program name
    ARGV = "argv"  # a command: a list whose first element, or a string whose first word, runs
    CANDIDATES = "candidates"  # names a helper tries in turn (`for command in commands`)


NAME, ARGV, CANDIDATES = Kind.NAME, Kind.ARGV, Kind.CANDIDATES
PROBES = frozenset({"shutil.which", "distutils.spawn.find_executable"})
# Calls that hand their argument's value through: Path('dot'), str(x), os.fspath(x), list(x).
PASS_THROUGH = frozenset({"Path", "PurePath", "PosixPath", "str", "fspath", "list", "tuple"})
MAX_DEPTH = 8  # bindings followed from a site; a program name is never further away

Groups = list[tuple[str, ...]]  # needs, each a tuple of alternative names


def _merged(groups: Groups) -> Groups:
    """Groups that are one choice of the code (a conditional, an `or`, returns): alternatives."""
    names = tuple(dict.fromkeys(name for group in groups for name in group))
    return [names] if names else []


class _Bindings:
    """A module's assignments by scope, so that `command` in one function is not read from
    another's; attribute assignments (`cls.converter = x`) and augmentations (`cmd += (...)`)."""

    def __init__(self, module: Module) -> None:
        self.scoped: dict[str, list[tuple[ast.AST | None, ast.AST]]] = {}
        self.augmented: dict[str, list[tuple[ast.AST | None, ast.AST]]] = {}
        self.attributes: dict[str, list[ast.AST]] = {}
        for node in module.nodes:
            kind = type(node)  # a type test first: most nodes are neither (torch: millions)
            if kind is not ast.Assign and kind is not ast.AnnAssign and kind is not ast.AugAssign:
                continue
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        scope = module.enclosing(node)
                        self.scoped.setdefault(target.id, []).append((scope, node.value))
                    elif isinstance(target, ast.Attribute):
                        self.attributes.setdefault(target.attr, []).append(node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                scope = module.enclosing(node)
                self.augmented.setdefault(node.target.id, []).append((scope, node.value))

    def values(
        self,
        table: Mapping[str, list[tuple[ast.AST | None, ast.AST]]],
        name: str,
        scope: ast.AST | None,
    ) -> list[ast.AST]:
        """What `name` is bound to where it is used: its own function's bindings, else the
        module's, else every binding."""
        found = table.get(name, [])
        for wanted in (scope, None):
            values = [value for where, value in found if where is wanted]
            if values:
                return values
        return [value for _, value in found]


def on_self(call: ast.Call) -> str | None:
    """`self.name(...)` / `cls.name(...)`: the method's name."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.attr if func.value.id in ("self", "cls") else None
    return None


def own_method(module: Module, call: ast.Call) -> Function | None:
    """The method `self.name(...)` calls when the class it is called in defines it (python-
    gnupg's `cmd = self.make_args(args)`, whose list starts with `self.gpgbinary`)."""
    name = on_self(call)
    function = module.enclosing(call) if name is not None else None
    owner = module.parents.get(function) if function is not None else None
    if not isinstance(owner, ast.ClassDef):
        return None
    methods = (n for n in owner.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return next((n for n in methods if n.name == name), None)


# Decorators that make a method read as an attribute: `self.arguments` is what it returns.
PROPERTIES = frozenset({"property", "cached_property"})


def own_property(module: Module, node: ast.Attribute) -> Function | None:
    """The property `self.name` reads when the class it is read in defines one (python-ffmpeg's
    `arguments`, returning `[self._executable, *options]`); a plain method read so is a bound
    method, no value."""
    if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
        return None
    function = module.enclosing(node)
    owner = module.parents.get(function) if function is not None else None
    if not isinstance(owner, ast.ClassDef):
        return None
    for method in owner.body:
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) and method.name == node.attr:
            decorators = [
                d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")
                for d in method.decorator_list
            ]
            return method if PROPERTIES.intersection(decorators) else None
    return None


def _empty(node: ast.AST) -> bool:
    return isinstance(node, ast.List | ast.Tuple) and not node.elts


class Reader:
    """The wheel's modules, parsed on demand, and how a name leads to a program in them."""

    def __init__(self, paths: Iterable[str], read: Callable[[str], bytes]) -> None:
        self.paths = {module_name(path): path for path in paths if worth_reading(path)}
        self.read = read
        self.modules: dict[str, tuple[Module, _Bindings] | None] = {}
        self.memo: dict[tuple[int, Kind, tuple[tuple[str, Scalar], ...]], Groups] = {}

    def module(self, name: str) -> tuple[Module, _Bindings] | None:
        if name not in self.modules:
            path = self.paths.get(name)
            module = parse(path, self.read(path)) if path is not None else None
            self.modules[name] = (module, _Bindings(module)) if module is not None else None
        return self.modules[name]

    def definition(self, qualified: str) -> tuple[Module, str] | None:
        """`pkg.mod.NAME` -> (the wheel's module pkg.mod, NAME), when the wheel has it."""
        parent, _, name = qualified.rpartition(".")
        found = self.module(parent) if parent else None
        return (found[0], name) if found is not None else None

    def reexported(self, qualified: str) -> str | None:
        """`pkg.sub.run` that `pkg/sub/__init__.py` imports from where it is defined
        (`from pkg.sub._run import run`): that definition's name."""
        parent, _, name = qualified.rpartition(".")
        found = self.module(parent) if parent else None
        return found[0].imports.get(name) if found is not None else None

    def groups(
        self,
        module: Module,
        node: ast.AST,
        kind: Kind,
        depth: int = 0,
        env: Mapping[str, Scalar] = NOTHING_BOUND,
    ) -> Groups:
        """The programs `node` can name: as one program name (NAME) or as a command (ARGV)."""
        if depth > MAX_DEPTH:
            return []
        key = (id(node), kind, tuple(sorted(env.items())))
        if key not in self.memo:
            self.memo[key] = []  # a binding that refers back to itself names nothing more
            found = self._groups(module, node, kind, depth + 1, env)
            self.memo[key] = [g for g in dict.fromkeys(found) if g]
        return self.memo[key]

    def _groups(
        self, module: Module, node: ast.AST, kind: Kind, depth: int, env: Mapping[str, Scalar]
    ) -> Groups:
        bindings = self.module(module.name)
        assert bindings is not None, "a module is read before its nodes are"
        table = bindings[1]
        if (literal := text(node)) is not None:
            return [(literal if kind != ARGV else first_word(literal),)]
        if kind == ARGV and (command := self._command(module, node, depth, env)) is not None:
            return command
        if (value := bound(node, env)) is not None:
            return [(value if kind != ARGV else first_word(value),)]
        if kind == CANDIDATES and isinstance(node, ast.List | ast.Tuple | ast.Set):
            # Names a helper loops over (called with `("ffmpeg", "avconv")`): one choice.
            return _merged([g for e in node.elts for g in self.groups(module, e, NAME, depth, env)])
        if (choices := branches(node)) is not None:  # `a or b`, `a if c else b`: one choice
            return _merged([g for c in choices for g in self.groups(module, c, kind, depth, env)])
        if isinstance(node, ast.Name):
            return self._name(module, table, node, kind, depth)
        if isinstance(node, ast.Attribute):
            return self._attribute(module, table, node, kind, depth)
        if isinstance(node, ast.Call):
            return self._call(module, node, kind, depth)
        return []

    def _command(
        self, module: Module, node: ast.AST, depth: int, env: Mapping[str, Scalar]
    ) -> Groups | None:
        """The program a command's own syntax starts with (a list's first element, an
        f-string's first part, the left of `+`); None when `node` is no such syntax."""
        if isinstance(node, ast.List | ast.Tuple):
            if not node.elts:
                return []
            start = launched(words(node))  # ["env", "dot", "-V"]: dot
            if start >= len(node.elts):
                return []
            head = node.elts[start]
            if isinstance(head, ast.Starred):
                return self.groups(module, head.value, ARGV, depth, env)
            return self.groups(module, head, NAME, depth, env)
        if isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant):
                return self.groups(module, head, ARGV, depth, env)
            if isinstance(head, ast.FormattedValue):
                return self.groups(module, head.value, NAME, depth, env)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            side = node.right if _empty(node.left) else node.left
            return self.groups(module, side, ARGV, depth, env)
        return None

    def _name(
        self, module: Module, table: _Bindings, node: ast.Name, kind: Kind, depth: int
    ) -> Groups:
        scope = module.enclosing(node)
        values = table.values(table.scoped, node.id, scope)
        if scope is not None and (value := default(scope, node.id)) is not None:
            values = [*values, value]  # def run(stream, cmd="ffmpeg"): the usual program
        found = [g for value in values for g in self.groups(module, value, kind, depth)]
        if kind == ARGV and values and all(map(_empty, values)):  # cmd = []; cmd += (...)
            for value in table.values(table.augmented, node.id, scope):
                found += self.groups(module, value, ARGV, depth)
        for iterable in module.loops.get(node.id, []):  # for name in ("avconv", "ffmpeg")
            if isinstance(iterable, ast.List | ast.Tuple | ast.Set):
                inner = [g for e in iterable.elts for g in self.groups(module, e, kind, depth)]
                found += _merged(inner)
        return found or self._imported(module, node, kind, depth)

    def _attribute(
        self, module: Module, table: _Bindings, node: ast.Attribute, kind: Kind, depth: int
    ) -> Groups:
        """`self.x`/`cls.x`: what this module assigns to that attribute (or the class body to
        the name); `module.X`: a sibling module's constant."""
        values = list(table.attributes.get(node.attr, []))
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            values += table.values(table.scoped, node.attr, None)
        found = [g for value in values for g in self.groups(module, value, kind, depth)]
        if not found and (getter := own_property(module, node)) is not None:
            itself = ast.Call(node, [ast.Name("self", ast.Load())], [])
            found = self._returns(module, getter, itself, kind, depth)
        return found or self._imported(module, node, kind, depth)

    def _imported(self, module: Module, node: ast.AST, kind: Kind, depth: int) -> Groups:
        """A constant of a sibling module (`dot_command.DOT_BINARY`, `from .x import CMD`)."""
        qualified = module.resolve(node)
        found = self.definition(qualified) if qualified else None
        if found is None:
            return []
        other, name = found
        return self.groups(other, ast.Name(id=name, ctx=ast.Load()), kind, depth)

    def _call(self, module: Module, node: ast.Call, kind: Kind, depth: int) -> Groups:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        qualified = module.resolve(func)
        if qualified in PROBES and node.args:  # path = shutil.which("foo"): what it finds
            return self.groups(module, node.args[0], NAME, depth)
        if called in PASS_THROUGH and node.args:
            return self.groups(module, node.args[0], kind, depth)
        if called == "split" and kind == ARGV and node.args:  # shlex.split("cmd -x")
            return self.groups(module, node.args[0], ARGV, depth)
        if called == "join" and isinstance(func, ast.Attribute) and node.args:
            if isinstance(func.value, ast.Constant):  # " ".join(cmd): the command line
                return self.groups(module, node.args[0], ARGV, depth)
            return self.groups(module, node.args[-1], kind, depth)  # os.path.join(dir, name)
        if isinstance(func, ast.Name) and func.id in module.functions:
            return self._returns(module, module.functions[func.id], node, kind, depth)
        if (method := own_method(module, node)) is not None:  # cmd = self.make_args(args)
            shifted = ast.Call(func, [ast.Name("self", ast.Load()), *node.args], node.keywords)
            return self._returns(module, method, shifted, kind, depth)
        found = self.definition(qualified) if qualified else None
        if found is not None and found[1] in found[0].functions:
            other, name = found
            return self._returns(other, other.functions[name], node, kind, depth)
        return []

    def _returns(
        self,
        module: Module,
        function: Function,
        call: ast.Call,
        kind: Kind,
        depth: int,
    ) -> Groups:
        """What a helper returns, its parameters bound to the call's literals: one choice."""
        values, binding = returns(function, call)
        found = [g for value in values for g in self.groups(module, value, kind, depth, binding)]
        return _merged(found) if kind != ARGV else found
