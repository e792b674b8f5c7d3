"""Programs Python code runs, read from its syntax tree.

`subprocess` (run, call, check_call, check_output, Popen, getoutput), `os.system`, `os.popen`,
`os.exec*`, `os.spawn*`, `os.posix_spawn*`, `asyncio.create_subprocess_exec/_shell` and the
lookups `shutil.which` and `distutils.spawn.find_executable` name the program in a string or
an argument list: an ELF scan cannot see it, and importing the wrapper succeeds without it.

The program is followed through the indirections wrappers use: a module constant
(`tesseract_cmd = 'tesseract'`), an attribute (`cls.converter`), `pathlib.Path('dot')`, a
list built then extended (`cmd_args += (tesseract_cmd, ...)`), a small helper returning the
name or the list (`_get_command_path("pdfinfo")`, graphviz's `dot_command.command()`), a
constant or function of a sibling module, candidates tried in turn (`avconv` or `ffmpeg`, a
loop over names), and a helper whose parameter is what gets run (`execute.run_check(cmd)`).
The name machinery is analysis.loads' (the same module reading, bindings, helpers, guards);
what differs is that an argument list names one program, its first element.

A site's names are alternatives (any one satisfies it) when the code chooses among them: a
conditional, an `or`, a helper's several returns, a loop over candidates. Names reaching a
site through separate assignments are separate needs. A run inside a `try` whose handler
carries on, and a `which` lookup (a probe the code answers itself), are optional.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from builder.analysis.loads import (
    LOAD_ERRORS,
    LoadSite,
    Module,
    Scalar,
    bind,
    evaluate,
    module_name,
    ordered,
    parse,
    worth_reading,
)
from builder.analysis.program_names import first_word, launched, mentions_runner, program_name

NAME, ARGV = "name", "argv"  # the argument is one program name / a command (list or string)
# Fully qualified callable -> (position of the program argument, its keyword, what it holds).
RUNNERS: Mapping[str, tuple[int, str, str]] = MappingProxyType(
    {
        **{f"subprocess.{f}": (0, "args", ARGV) for f in ("run", "call", "check_call", "Popen")},
        "subprocess.check_output": (0, "args", ARGV),
        "subprocess.getoutput": (0, "cmd", ARGV),
        "subprocess.getstatusoutput": (0, "cmd", ARGV),
        "os.system": (0, "command", ARGV),
        "os.popen": (0, "cmd", ARGV),
        **{f"os.exec{s}": (0, "file", NAME) for s in ("l", "le", "lp", "lpe", "v", "ve", "vp")},
        "os.execvpe": (0, "file", NAME),
        **{f"os.spawn{s}": (1, "file", NAME) for s in ("l", "le", "lp", "lpe", "v", "ve", "vp")},
        "os.spawnvpe": (1, "file", NAME),
        "os.posix_spawn": (0, "path", NAME),
        "os.posix_spawnp": (0, "path", NAME),
        "asyncio.create_subprocess_exec": (0, "program", NAME),
        "asyncio.create_subprocess_shell": (0, "cmd", ARGV),
        "asyncio.subprocess.create_subprocess_exec": (0, "program", NAME),
        "asyncio.subprocess.create_subprocess_shell": (0, "cmd", ARGV),
        "shutil.which": (0, "cmd", NAME),
        "distutils.spawn.find_executable": (0, "executable", NAME),
    }
)
PROBES = frozenset({"shutil.which", "distutils.spawn.find_executable"})
# A handler for one of these that does not raise carries on without the program.
PROGRAM_ERRORS = LOAD_ERRORS | {"FileNotFoundError", "PermissionError"}
# Calls that hand their argument's value through: Path('dot'), str(x), os.fspath(x), list(x).
PASS_THROUGH = frozenset({"Path", "PurePath", "PosixPath", "str", "fspath", "list", "tuple"})
MAX_DEPTH = 8  # bindings followed from a site; a program name is never further away

Groups = list[tuple[str, ...]]  # needs, each a tuple of alternative names


def _merged(groups: Groups) -> Groups:
    """Groups that are one choice of the code (a conditional, an `or`, returns): alternatives."""
    names = tuple(dict.fromkeys(name for group in groups for name in group))
    return [names] if names else []


@dataclass(frozen=True)
class _Runner:
    """A function of the wheel whose argument at `position` is run: its callers name it."""

    qualified: str
    position: int
    kind: str  # NAME or ARGV


class _Bindings:
    """A module's assignments by scope, so that `command` in one function is not read from
    another's; attribute assignments (`cls.converter = x`) and augmentations (`cmd += (...)`)."""

    def __init__(self, module: Module) -> None:
        self.scoped: dict[str, list[tuple[ast.AST | None, ast.AST]]] = {}
        self.augmented: dict[str, list[tuple[ast.AST | None, ast.AST]]] = {}
        self.attributes: dict[str, list[ast.AST]] = {}
        for node in module.nodes:
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


def _default(function: ast.AST, name: str) -> ast.AST | None:
    """The default value of `function`'s parameter `name`, if it has one."""
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    with_default = positional[len(positional) - len(arguments.defaults) :]
    pairs = list(zip(with_default, arguments.defaults, strict=True))
    pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d]
    return next((default for argument, default in pairs if argument.arg == name), None)


def _empty(node: ast.AST) -> bool:
    return isinstance(node, ast.List | ast.Tuple) and not node.elts


class _Reader:
    """The wheel's modules, parsed on demand, and how a name leads to a program in them."""

    def __init__(self, paths: Iterable[str], read: Callable[[str], bytes]) -> None:
        self.paths = {module_name(path): path for path in paths if worth_reading(path)}
        self.read = read
        self.modules: dict[str, tuple[Module, _Bindings] | None] = {}
        self.memo: dict[tuple[int, str, tuple[tuple[str, Scalar], ...]], Groups] = {}

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
        kind: str,
        depth: int = 0,
        env: Mapping[str, Scalar] = MappingProxyType({}),
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
        self, module: Module, node: ast.AST, kind: str, depth: int, env: Mapping[str, Scalar]
    ) -> Groups:
        bindings = self.module(module.name)
        assert bindings is not None, "a module is read before its nodes are"
        table = bindings[1]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.value if kind == NAME else first_word(node.value),)]
        if kind == ARGV and isinstance(node, ast.List | ast.Tuple):
            if not node.elts:
                return []
            literal = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            words = [value if isinstance(value, str) else None for value in literal]
            start = launched(words)  # ["env", "dot", "-V"]: dot
            if start >= len(node.elts):
                return []
            head = node.elts[start]
            if isinstance(head, ast.Starred):
                return self.groups(module, head.value, ARGV, depth, env)
            return self.groups(module, head, NAME, depth, env)
        if kind == ARGV and isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant):
                return self.groups(module, head, ARGV, depth, env)
            if isinstance(head, ast.FormattedValue):
                return self.groups(module, head.value, NAME, depth, env)
        if kind == ARGV and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            side = node.right if _empty(node.left) else node.left
            return self.groups(module, side, ARGV, depth, env)
        if env and (text := evaluate(node, env)) is not None:
            return [(text if kind == NAME else first_word(text),)]
        if isinstance(node, ast.IfExp):
            body = self.groups(module, node.body, kind, depth, env)
            return _merged(body + self.groups(module, node.orelse, kind, depth, env))
        if isinstance(node, ast.BoolOp):
            return _merged(
                [g for v in node.values for g in self.groups(module, v, kind, depth, env)]
            )
        if isinstance(node, ast.Name):
            return self._name(module, table, node, kind, depth)
        if isinstance(node, ast.Attribute):
            return self._attribute(module, table, node, kind, depth)
        if isinstance(node, ast.Call):
            return self._call(module, node, kind, depth)
        return []

    def _name(
        self, module: Module, table: _Bindings, node: ast.Name, kind: str, depth: int
    ) -> Groups:
        scope = module.enclosing(node)
        values = table.values(table.scoped, node.id, scope)
        if scope is not None and (default := _default(scope, node.id)) is not None:
            values = [*values, default]  # def run(stream, cmd="ffmpeg"): the usual program
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
        self, module: Module, table: _Bindings, node: ast.Attribute, kind: str, depth: int
    ) -> Groups:
        """`self.x`/`cls.x`: what this module assigns to that attribute (or the class body to
        the name); `module.X`: a sibling module's constant."""
        values = list(table.attributes.get(node.attr, []))
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            values += table.values(table.scoped, node.attr, None)
        found = [g for value in values for g in self.groups(module, value, kind, depth)]
        return found or self._imported(module, node, kind, depth)

    def _imported(self, module: Module, node: ast.AST, kind: str, depth: int) -> Groups:
        """A constant of a sibling module (`dot_command.DOT_BINARY`, `from .x import CMD`)."""
        qualified = module.resolve(node)
        found = self.definition(qualified) if qualified else None
        if found is None:
            return []
        other, name = found
        return self.groups(other, ast.Name(id=name, ctx=ast.Load()), kind, depth)

    def _call(self, module: Module, node: ast.Call, kind: str, depth: int) -> Groups:
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
        found = self.definition(qualified) if qualified else None
        if found is not None and found[1] in found[0].functions:
            other, name = found
            return self._returns(other, other.functions[name], node, kind, depth)
        return []

    def _returns(
        self,
        module: Module,
        function: ast.FunctionDef | ast.AsyncFunctionDef,
        call: ast.Call,
        kind: str,
        depth: int,
    ) -> Groups:
        """What a helper returns, its parameters bound to the call's literals: one choice."""
        bound = bind(function, call)
        returns = [n for n in ast.walk(function) if isinstance(n, ast.Return) and n.value]
        found: Groups = []
        for inner in sorted(returns, key=lambda n: (n.lineno, n.col_offset)):
            if inner.value is not None:
                found += self.groups(module, inner.value, kind, depth, bound)
        return _merged(found) if kind == NAME else found


def _site(module: Module, call: ast.Call, names: tuple[str, ...], probe: bool) -> LoadSite:
    optional = probe or module.guarded(call, PROGRAM_ERRORS)
    return LoadSite(module.path, call.lineno, names, optional)


def _sites(module: Module, call: ast.Call, groups: Groups, probe: bool) -> list[LoadSite]:
    sites = []
    for group in groups:
        names = tuple(dict.fromkeys(n for name in group if (n := program_name(name))))
        if names:
            sites.append(_site(module, call, names, probe))
    return sites


def _argument(call: ast.Call, position: int, keyword: str) -> ast.AST | None:
    if len(call.args) > position and not isinstance(call.args[position], ast.Starred):
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _analyse(reader: _Reader, module: Module) -> tuple[list[LoadSite], list[_Runner]]:
    """The module's own sites, and its top-level helpers whose parameter gets run."""
    sites: list[LoadSite] = []
    runners: list[_Runner] = []
    for node in module.calls:
        qualified = module.resolve(node.func)
        if qualified is None or qualified not in RUNNERS:
            continue
        position, keyword, kind = RUNNERS[qualified]
        argument = _argument(node, position, keyword)
        if argument is None:
            continue
        if groups := reader.groups(module, argument, kind):
            sites += _sites(module, node, groups, qualified in PROBES)
            continue
        if (found := module.parameter(argument)) is None or found[1] < 0:
            continue
        function, index = found
        runner = _Runner(f"{module.name}.{function.name}", index, kind)
        for call in module.calls:
            if isinstance(call.func, ast.Name | ast.Attribute):
                named = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
                if named == function.name:
                    sites += _caller_sites(reader, module, call, runner)
        if module.parents.get(function) is module.tree:
            runners.append(runner)
    return sites, runners


def _caller_sites(
    reader: _Reader, module: Module, call: ast.Call, runner: _Runner
) -> list[LoadSite]:
    if len(call.args) <= runner.position:
        return []
    groups = reader.groups(module, call.args[runner.position], runner.kind)
    return _sites(module, call, groups, probe=False)


def _mentions_runner_of(source: bytes, runners: Mapping[str, _Runner]) -> bool:
    """Whether a file may call one of the wheel's runners: it names the function and the
    module defining it (`from .backend import execute` ... `execute.run_check(cmd)`)."""
    for qualified in runners:
        module, _, function = qualified.rpartition(".")
        package, _, tail = module.rpartition(".")
        named = tail.encode() in source or package.rpartition(".")[2].encode() in source
        if function.encode() in source and named:  # the module, or its package re-exporting
            return True
    return False


def scan_sources(paths: Iterable[str], read: Callable[[str], bytes]) -> list[LoadSite]:
    """Every program one wheel's sources run or look up by a name they spell out.

    Files naming a runner are parsed; helpers they define that run their parameter may be
    called from another module (`from . import execute`), so the files naming one are parsed
    too. One level, as for library loads.
    """
    paths = [path for path in paths if worth_reading(path)]
    reader = _Reader(paths, read)
    sites: list[LoadSite] = []
    runners: dict[str, _Runner] = {}
    unparsed: set[str] = set()
    for path in paths:
        source = read(path)
        if not mentions_runner(source):
            unparsed.add(path)
            continue
        loaded = reader.module(module_name(path))
        if loaded is None:
            continue
        found, exported = _analyse(reader, loaded[0])
        sites += found
        runners |= {runner.qualified: runner for runner in exported}
    if not runners:
        return ordered(sites)
    # A call can reach a runner only under the runner's own name: only such calls are worth
    # looking up as re-exports (each lookup parses the package that would re-export it).
    called_as = {qualified.rpartition(".")[2] for qualified in runners}
    for path in paths:
        if path in unparsed and not _mentions_runner_of(read(path), runners):
            continue
        loaded = reader.module(module_name(path))
        if loaded is None:
            continue
        module = loaded[0]
        for node in module.calls:
            if (qualified := module.resolve(node.func)) is None:
                continue
            runner = runners.get(qualified)
            if runner is None and qualified.rpartition(".")[2] in called_as:
                runner = runners.get(reader.reexported(qualified) or "")
            if runner is not None:
                sites += _caller_sites(reader, module, node, runner)
    return ordered(sites)


def scan_source(path: str, source: bytes) -> list[LoadSite]:
    """The programs one file runs (its own helpers followed), with file:line."""
    return scan_sources([path], lambda _: source)
