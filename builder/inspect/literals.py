"""What an expression of Python source evaluates to when only its literals are known.

Library loads (inspect.loads) and program runs (inspect.programs through
inspect.program_reader) both follow an argument back to the names it spells out. What they
share is how a value is read without running the code, and it lives here, once: a literal
string or list of them, a string built from literals and a helper's bound parameters (an
f-string, `+`), the branches of a choice (`a or b`, `a if c else b`), and what a helper
returns when its parameters take a call's literal arguments (or their defaults). Where a
*name* leads (which assignments, which module) is each reader's own, as they differ on
purpose: a library site takes every binding of a name as one set of alternatives, a program
site keeps bindings apart as separate needs.

Pure: syntax trees in, values out.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import cast

Scalar = str | int
Function = ast.FunctionDef | ast.AsyncFunctionDef
MAX_EXPRESSION_DEPTH = 100  # a name is never built from more pieces than this


def scalar(node: ast.AST | None) -> Scalar | None:
    """A literal string or number, else None: never a bool (`True`/`False` are ints to
    `isinstance`, and a flag passed to a helper is no name) nor None."""
    if isinstance(node, ast.Constant) and type(node.value) in (str, int):
        return cast(Scalar, node.value)
    return None


def text(node: ast.AST | None) -> str | None:
    """A literal string, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def strings(node: ast.AST | None) -> list[str] | None:
    """A literal string or a list/tuple holding some, else None."""
    if (value := text(node)) is not None:
        return [value]
    if isinstance(node, ast.List | ast.Tuple):
        found = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        values = [value for value in found if isinstance(value, str)]
        return values if values else None
    return None


def words(node: ast.List | ast.Tuple) -> list[str | None]:
    """A list's elements that are literal strings, None for any other element."""
    return [text(element) for element in node.elts]


def evaluate(node: ast.AST, env: Mapping[str, Scalar], depth: int = 0) -> str | None:
    """A string built from literals and bound parameters (f-string, +), else None; bounded in
    depth (a generated `x + "a" + "a" + ...` must not exhaust the Python stack)."""
    if depth > MAX_EXPRESSION_DEPTH:
        return None
    depth += 1
    if (value := scalar(node)) is not None:
        return str(value)
    if isinstance(node, ast.Name) and node.id in env:
        return str(env[node.id])
    if isinstance(node, ast.FormattedValue) and node.format_spec is None:
        return evaluate(node.value, env, depth)
    if isinstance(node, ast.JoinedStr):
        parts = [evaluate(value, env, depth) for value in node.values]
        return None if None in parts else "".join(part or "" for part in parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = evaluate(node.left, env, depth), evaluate(node.right, env, depth)
        return None if left is None or right is None else left + right
    return None


def bound(node: ast.AST, env: Mapping[str, Scalar]) -> str | None:
    """What `node` evaluates to inside a helper whose parameters `env` binds; None outside one
    (no parameters bound: a number or a constant expression there names nothing)."""
    return evaluate(node, env) if env else None


def branches(node: ast.AST) -> list[ast.expr] | None:
    """The values a choice picks among (`a or b`, `a if c else b`), in source order; None when
    `node` is no choice."""
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    return None


def positional(function: Function) -> list[str]:
    """The names of a function's positional parameters, in order."""
    arguments = function.args
    return [a.arg for a in (*arguments.posonlyargs, *arguments.args)]


def default(function: ast.AST, name: str) -> ast.AST | None:
    """The default value of `function`'s parameter `name`, if it has one."""
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    arguments = function.args
    parameters = [*arguments.posonlyargs, *arguments.args]
    with_default = parameters[len(parameters) - len(arguments.defaults) :]
    pairs = list(zip(with_default, arguments.defaults, strict=True))
    pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d]
    return next((value for argument, value in pairs if argument.arg == name), None)


def bind(function: Function, call: ast.Call) -> dict[str, Scalar]:
    """The helper's parameters that the call (or a default) gives a literal value."""
    names = positional(function)
    defaults = function.args.defaults
    given: dict[str, ast.AST] = {}
    if defaults:
        given |= dict(zip(names[-len(defaults) :], defaults, strict=True))
    given |= dict(zip(names, call.args, strict=False))  # *args beyond are not bound
    given |= {k.arg: k.value for k in call.keywords if k.arg is not None}
    return {name: value for name, node in given.items() if (value := scalar(node)) is not None}


def returns(function: Function, call: ast.Call) -> tuple[list[ast.expr], dict[str, Scalar]]:
    """What a helper returns, in source order, and its parameters as `call` binds them: each
    returned value evaluates under those bindings."""
    found = [n for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None]
    ordered = sorted(found, key=lambda n: (n.lineno, n.col_offset))
    return [n.value for n in ordered if n.value is not None], bind(function, call)
