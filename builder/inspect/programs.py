"""Programs Python code runs, read from its syntax tree.

`subprocess` (run, call, check_call, check_output, Popen, getoutput), `os.system`, `os.popen`,
`os.exec*`, `os.spawn*`, `os.posix_spawn*`, `asyncio.create_subprocess_exec/_shell` and the
lookups `shutil.which` and `distutils.spawn.find_executable` name the program in a string or
an argument list: an ELF scan cannot see it, and importing the wrapper succeeds without it.

The program is followed through the indirections wrappers use: a module constant
(`tesseract_cmd = 'tesseract'`), an attribute (`cls.converter`), `pathlib.Path('dot')`, a list
built then extended (`cmd_args += (tesseract_cmd, ...)`), a small helper returning the name or
the list (`_get_command_path("pdfinfo")`, graphviz's `dot_command.command()`), a constant or
function of a sibling module, candidates tried in turn (`avconv` or `ffmpeg`, a loop over
names), a helper whose parameter is what gets run (`execute.run_check(cmd)`), and a method
whose parameter is run, called on `self` in classes deriving from its own (textract's
`ShellParser.run`). A runner may be called through a module-level alias (ffmpy's `popen =
subprocess.Popen`); a helper's parameter may be only the program at the command's head (pydot's
`call_graphviz(program=prog, ...)`, callers read by position or keyword) or the candidates it
loops over (audioread's `popen_multiple(COMMANDS, ...)`), and a value the helper rules out
around the run (`if viewer == "BytesIO": ... else: run([viewer])`) is none. A helper may hand
its own `*args` on to the runner (python-ffmpeg's `create_subprocess(*args, **kwargs)`), and a
list spread where a program name is expected (`create_subprocess_exec(*cmd)`) starts with the
program. Following a name is
inspect.program_reader's; the module reading (bindings, helpers, guards) is inspect.loads';
what a value is, its literals known, is inspect.literals' (shared with library loads);
what differs from a library load is that an argument list names one program, its first element.

A site's names are alternatives (any one satisfies it) when the code chooses among them: a
conditional, an `or`, a helper's several returns, a loop over candidates. Names reaching a
site through separate assignments are separate needs. A run inside a `try` whose handler
carries on, and a `which` lookup (a probe the code answers itself), are optional.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from builder.inspect.literals import positional, words
from builder.inspect.loads import (
    LOAD_ERRORS,
    LoadSite,
    Module,
    module_name,
    ordered,
    worth_reading,
)
from builder.inspect.program_names import launched, mentions_runner, program_name
from builder.inspect.program_reader import (
    ARGV,
    CANDIDATES,
    NAME,
    PROBES,
    Groups,
    Kind,
    Reader,
    on_self,
)

# Fully qualified callable -> (position of the program argument, its keyword, what it holds).
RUNNERS: Mapping[str, tuple[int, str, Kind]] = MappingProxyType(
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
# A handler for one of these that does not raise carries on without the program.
PROGRAM_ERRORS = LOAD_ERRORS | {"FileNotFoundError", "PermissionError"}
MAX_HEAD_DEPTH = 6  # assignments followed back from a run to the parameter it starts with


@dataclass(frozen=True)
class _Runner:
    """A function of the wheel whose argument at `position` (or `keyword`) is run: its callers
    name it.

    A method's callers are `self.run(...)` calls in its class and in the classes deriving from
    it (textract's parsers each `self.run(['antiword', filename])` through
    `ShellParser.run`); `position` then counts the call's arguments, `self` not among them.
    """

    qualified: str  # pkg.mod.function, or pkg.mod.Class.method
    position: int
    kind: Kind  # what the caller's argument holds
    method: bool = False
    keyword: str = ""  # the parameter's name: `call(program="tool")`
    probe: bool = False  # the helper looks the name up (`shutil.which`) rather than runs it
    handled: frozenset[str] = frozenset()  # values the helper answers itself (`== "BytesIO"`)


def _method_of(module: Module, function: ast.AST) -> ast.ClassDef | None:
    """The class `function` is a method of (its first parameter `self` or `cls`), if any."""
    owner = module.parents.get(function)
    if not isinstance(owner, ast.ClassDef) or not isinstance(function, ast.FunctionDef):
        return None
    first = positional(function)[:1]
    return owner if first in (["self"], ["cls"]) else None


def _bases(module: Module, call: ast.Call) -> list[str]:
    """The qualified names of the class a call is made in, and of the classes it derives from
    (one level: imported, or of the same module)."""
    function = module.enclosing(call)
    owner = module.parents.get(function) if function is not None else None
    if not isinstance(owner, ast.ClassDef):
        return []
    named = [owner.name, *(b.id for b in owner.bases if isinstance(b, ast.Name))]
    found = [f"{module.name}.{name}" for name in named]
    return found + [q for b in owner.bases if (q := module.resolve(b)) is not None]


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


def _argument(
    call: ast.Call, position: int, keyword: str, kind: Kind
) -> tuple[ast.AST | None, Kind]:
    """The call's argument at `position` (or `keyword`), and what it holds. A list spread where
    one program name is expected holds the command (`create_subprocess_exec(*cmd)`: the
    program is its first element); one spread where the command is expected, or past a spread,
    is not known."""
    if position >= 0 and len(call.args) > position:
        if any(isinstance(earlier, ast.Starred) for earlier in call.args[:position]):
            return None, kind
        found = call.args[position]
        if isinstance(found, ast.Starred):
            return (found.value, ARGV) if kind == NAME else (None, kind)
        return found, kind
    return next((k.value for k in call.keywords if keyword and k.arg == keyword), None), kind


def _vararg_runner(
    module: Module, call: ast.Call, position: int, kind: Kind, probe: bool
) -> _Runner | None:
    """A helper handing its own `*args` on to a runner (python-ffmpeg's `def
    create_subprocess(*args, **kwargs): return subprocess.Popen(*args, **kwargs)`): what its
    callers pass where the `*args` start is what the runner gets at `position`."""
    if position < 0 or len(call.args) <= position:
        return None
    spread = call.args[position]
    function = module.enclosing(call)
    if (
        function is None
        or function.args.vararg is None
        or not isinstance(spread, ast.Starred)
        or not isinstance(spread.value, ast.Name)
        or spread.value.id != function.args.vararg.arg
        or any(isinstance(earlier, ast.Starred) for earlier in call.args[:position])
    ):
        return None
    index = len(positional(function)) + position
    if (owner := _method_of(module, function)) is not None:
        return _Runner(
            f"{module.name}.{owner.name}.{function.name}", index - 1, kind, True, probe=probe
        )
    return _Runner(f"{module.name}.{function.name}", index, kind, probe=probe)


def _runner_called(module: Module, call: ast.Call) -> str | None:
    """The runner `call` calls: by its qualified name, or through a module-level alias of one
    (ffmpy's `popen = subprocess.Popen` ... `popen(self._cmd)`)."""
    qualified = module.resolve(call.func)
    if qualified in RUNNERS or not isinstance(call.func, ast.Name):
        return qualified
    for value in module.assigned.get(call.func.id, []):
        if module.enclosing(value) is None and (aliased := module.resolve(value)) in RUNNERS:
            return aliased
    return qualified


def _head(module: Module, node: ast.AST, kind: Kind, depth: int = 0) -> tuple[ast.AST, Kind]:
    """What names the program in a run's argument, through the function's own assignments:
    `cmd = [program] + args` ... `Popen(cmd)` -> (`program`, NAME), so that a helper whose
    parameter is the program (not the whole command) is found."""
    if depth > MAX_HEAD_DEPTH:
        return node, kind
    if kind == ARGV and isinstance(node, ast.List | ast.Tuple) and node.elts:
        start = launched(words(node))
        head = node.elts[min(start, len(node.elts) - 1)]
        if isinstance(head, ast.Starred):
            return _head(module, head.value, ARGV, depth + 1)
        return _head(module, head, NAME, depth + 1)
    if kind == ARGV and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _head(module, node.left, ARGV, depth + 1)
    if kind == ARGV and isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.FormattedValue):
            return _head(module, first.value, NAME, depth + 1)
    if isinstance(node, ast.Name) and module.parameter(node) is None:
        scope = module.enclosing(node)
        local = [v for v in module.assigned.get(node.id, []) if module.enclosing(v) is scope]
        if len(local) == 1 and scope is not None:
            return _head(module, local[0], kind, depth + 1)
    return node, kind


def _handled(module: Module, function: ast.AST, parameter: str, run: ast.AST) -> frozenset[str]:
    """Literals the helper's branches around the run rule out (the run in the `else` of
    `if viewer == "BytesIO"`, or in the body of `!=`): values it answers itself, never run
    (sympy's `preview(viewer="BytesIO")` writes a buffer)."""
    found = set()
    child, node = run, module.parents.get(run)
    while node is not None and child is not function:
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(node, ast.If) and isinstance(test, ast.Compare):
            value = getattr(test.comparators[0], "value", None)
            named = isinstance(test.left, ast.Name) and test.left.id == parameter
            branch = node.orelse if isinstance(test.ops[0], ast.Eq) else node.body
            if named and isinstance(test.ops[0], ast.Eq | ast.NotEq) and child in branch:
                found.update([value] if isinstance(value, str) else [])
        child, node = node, module.parents.get(node)
    return frozenset(found)


def _parameter_runner(module: Module, argument: ast.AST, kind: Kind, probe: bool) -> _Runner | None:
    """The runner a helper is when what it runs comes from its parameter (the command, the
    program at its head, or candidates it loops over), named as its callers name it."""
    head, kind = _head(module, argument, kind)
    if (found := module.parameter(head)) is None or found[1] < 0:
        return None
    function, index = found
    parameter = positional(function)[index]
    if isinstance(head, ast.Name) and head.id != parameter:
        kind = CANDIDATES  # `for command in commands`: the parameter holds names tried in turn
    handled = _handled(module, function, parameter, argument)
    if (owner := _method_of(module, function)) is not None:
        qualified = f"{module.name}.{owner.name}.{function.name}"
        return _Runner(qualified, index - 1, kind, True, parameter, probe, handled)
    qualified = f"{module.name}.{function.name}"
    return _Runner(qualified, index, kind, False, parameter, probe, handled)


def _local_callers(reader: Reader, module: Module, runner: _Runner) -> list[LoadSite]:
    """The sites of a runner's callers in its own module: `self.run(...)` in its class and the
    classes deriving from it, or calls of the function by its name."""
    sites: list[LoadSite] = []
    name = runner.qualified.rpartition(".")[2]
    for call in module.calls:
        if runner.method:
            if on_self(call) == name and runner.qualified in {
                f"{base}.{name}" for base in _bases(module, call)
            }:
                sites += _caller_sites(reader, module, call, runner)
        elif isinstance(call.func, ast.Name | ast.Attribute):
            named = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
            if named == name:
                sites += _caller_sites(reader, module, call, runner)
    return sites


def _analyse(reader: Reader, module: Module) -> tuple[list[LoadSite], list[_Runner]]:
    """The module's own sites, and its top-level helpers whose parameter gets run."""
    sites: list[LoadSite] = []
    runners: list[_Runner] = []
    for node in module.calls:
        qualified = _runner_called(module, node)
        if qualified is None or qualified not in RUNNERS:
            continue
        position, keyword, kind = RUNNERS[qualified]
        probe = qualified in PROBES
        runner = _vararg_runner(module, node, position, kind, probe)
        argument, kind = _argument(node, position, keyword, kind)
        if runner is None and argument is not None:
            if groups := reader.groups(module, argument, kind):
                sites += _sites(module, node, groups, probe)
                continue
            runner = _parameter_runner(module, argument, kind, probe)
        if runner is None:
            continue
        sites += _local_callers(reader, module, runner)
        function = module.enclosing(node)
        defined = (_method_of(module, function) or function) if function is not None else None
        if defined is not None and module.parents.get(defined) is module.tree:
            runners.append(runner)  # a top-level helper or class: other modules may call it
    return sites, runners


def _caller_sites(
    reader: Reader, module: Module, call: ast.Call, runner: _Runner
) -> list[LoadSite]:
    argument, kind = _argument(call, runner.position, runner.keyword, runner.kind)
    if argument is None:
        return []
    groups = reader.groups(module, argument, kind)
    kept = [tuple(name for name in group if name not in runner.handled) for group in groups]
    return _sites(module, call, kept, probe=runner.probe)


@dataclass(frozen=True)
class _Naming:
    """How a file names a runner it may call: the function's name, and the names it may
    import it under (the module defining it; its package's, when the package re-exports)."""

    function: bytes
    importers: tuple[bytes, ...]


def _namings(runners: Mapping[str, _Runner], reader: Reader) -> list[_Naming]:
    """Each runner's `_Naming`. Its package's name is one to import it under only when the
    package's `__init__` binds the function (a re-export): otherwise that name alone (torch's
    `utils`, which hundreds of its files name) says nothing, and those files are not parsed
    for nothing. A method's "package" is the module defining its class: always such a name."""
    found = []
    for qualified in runners:
        module, _, function = qualified.rpartition(".")
        package, _, tail = module.rpartition(".")
        importers = [tail]
        if package not in reader.paths or _binds(reader.module(package), function):
            importers.append(package.rpartition(".")[2])
        found.append(_Naming(function.encode(), tuple(name.encode() for name in importers)))
    return found


def _binds(package: tuple[Module, object] | None, name: str) -> bool:
    """Whether a package's `__init__` (parsed; None: it does not parse) binds `name`, by an
    import or an assignment; a star import may bind anything."""
    if package is None:
        return True
    module = package[0]
    stars = any(value.endswith(".*") for value in module.imports.values())
    return stars or name in module.imports or name in module.assigned or name in module.functions


def _mentions_runner_of(source: bytes, namings: Sequence[_Naming]) -> bool:
    """Whether a file may call one of the wheel's runners: it names the function and a name
    to import it under (`from .backend import execute` ... `execute.run_check(cmd)`)."""
    for naming in namings:
        named = any(importer in source for importer in naming.importers)
        if naming.function in source and named:
            return True
    return False


def scan_sources(paths: Iterable[str], read: Callable[[str], bytes]) -> list[LoadSite]:
    """Every program one wheel's sources run or look up by a name they spell out.

    Files naming a runner are parsed; helpers they define that run their parameter may be
    called from another module (`from . import execute`), so the files naming one are parsed
    too. One level, as for library loads.
    """
    paths = [path for path in paths if worth_reading(path)]
    reader = Reader(paths, read)
    sites, runners, unparsed = _own_sites(reader, paths, read)
    if not runners:
        return ordered(sites)
    namings = _namings(runners, reader)
    for path in paths:
        if path in unparsed and not _mentions_runner_of(read(path), namings):
            continue
        if (loaded := reader.module(module_name(path))) is not None:
            sites += _runner_callers(reader, loaded[0], runners)
    return ordered(sites)


def _own_sites(
    reader: Reader, paths: list[str], read: Callable[[str], bytes]
) -> tuple[list[LoadSite], dict[str, _Runner], set[str]]:
    """The sites of the files naming a runner, the helpers they define that run their
    parameter (by qualified name), and the files left unparsed (naming no runner)."""
    sites: list[LoadSite] = []
    runners: dict[str, _Runner] = {}
    unparsed: set[str] = set()
    for path in paths:
        if not mentions_runner(read(path)):
            unparsed.add(path)
            continue
        loaded = reader.module(module_name(path))
        if loaded is None:
            continue
        found, exported = _analyse(reader, loaded[0])
        sites += found
        runners |= {runner.qualified: runner for runner in exported}
    return sites, runners, unparsed


def _runner_callers(
    reader: Reader, module: Module, runners: Mapping[str, _Runner]
) -> list[LoadSite]:
    """The sites of `module`'s calls to the wheel's runners: a method inherited from a
    runner's class, or a function imported (or re-exported) from the module defining it."""
    # A call can reach a runner only under the runner's own name: only such calls are worth
    # looking up as re-exports (each lookup parses the package that would re-export it).
    called_as = {qualified.rpartition(".")[2] for qualified in runners}
    sites: list[LoadSite] = []
    for node in module.calls:
        if (method := on_self(node)) is not None:  # a method inherited from a runner's class
            inherited = [runners.get(f"{base}.{method}") for base in _bases(module, node)]
            runner = next((r for r in inherited if r and r.method), None)
        elif (qualified := module.resolve(node.func)) is None:
            continue
        else:
            runner = runners.get(qualified)
            if runner is None and qualified.rpartition(".")[2] in called_as:
                runner = runners.get(reader.reexported(qualified) or "")
        if runner is not None:
            sites += _caller_sites(reader, module, node, runner)
    return sites


def scan_source(path: str, source: bytes) -> list[LoadSite]:
    """The programs one file runs (its own helpers followed), with file:line."""
    return scan_sources([path], lambda _: source)
