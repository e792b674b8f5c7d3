"""The one literal evaluator both readers share: what an expression is, its literals known."""

from __future__ import annotations

import ast

from builder.inspect.literals import (
    bind,
    bound,
    branches,
    default,
    evaluate,
    returns,
    scalar,
    strings,
    words,
)


def expression(source: str) -> ast.expr:
    statement = ast.parse(source).body[0]
    assert isinstance(statement, ast.Expr)
    return statement.value


def helper_and_call(source: str) -> tuple[ast.FunctionDef, ast.Call]:
    """The module's first function, and the call its last line makes."""
    tree = ast.parse(source)
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef))
    call = expression(ast.unparse(tree.body[-1]))
    assert isinstance(call, ast.Call)
    return function, call


def test_a_scalar_is_a_string_or_number_never_a_flag() -> None:
    assert [scalar(expression(text)) for text in ('"gs"', "3", "True", "None", "x")] == [
        "gs",
        3,
        None,
        None,
        None,
    ]


def test_strings_are_a_literal_or_the_literal_strings_of_a_list() -> None:
    assert strings(expression('"magic"')) == ["magic"]
    assert strings(expression('("magic", 1, name, "magic1")')) == ["magic", "magic1"]
    assert strings(expression("(1, name)")) is None
    command = expression('["env", name, "dot"]')
    assert isinstance(command, ast.List)
    assert words(command) == ["env", None, "dot"]


def test_a_string_is_built_from_literals_and_bound_parameters_only() -> None:
    env = {"version": 2, "name": "gobject"}
    assert evaluate(expression('f"lib{name}-{version}.0.so"'), env) == "libgobject-2.0.so"
    assert evaluate(expression('"lib" + name + ".so"'), env) == "libgobject.so"
    assert evaluate(expression('f"{unknown}.so"'), env) is None
    assert evaluate(expression('f"{version:>3}"'), env) is None  # a format spec is not followed


def test_a_deep_expression_is_given_up_not_a_crash() -> None:
    deep = " + ".join(['"a"'] * 400)
    assert evaluate(expression(deep), {"x": 1}) is None
    assert evaluate(expression(" + ".join(['"a"'] * 20)), {"x": 1}) == "a" * 20


def test_outside_a_helper_nothing_is_evaluated() -> None:
    """With no parameter bound, a number or a constant expression names nothing."""
    assert bound(expression('"a" + "b"'), {}) is None
    assert bound(expression('"a" + "b"'), {"x": 1}) == "ab"


def test_a_choice_is_its_branches_in_source_order() -> None:
    choice = branches(expression('a or "b" or c'))
    assert [ast.unparse(node) for node in choice or []] == ["a", "'b'", "c"]
    conditional = branches(expression('"x" if flag else y'))
    assert [ast.unparse(node) for node in conditional or []] == ["'x'", "y"]
    assert branches(expression("a + b")) is None


def test_a_helper_returns_its_values_under_the_call_s_bindings() -> None:
    function, call = helper_and_call(
        "def find(name, suffix='.so', *rest, flag=False):\n"
        "    if flag:\n"
        "        return f'lib{name}{suffix}'\n"
        "    return name\n"
        "find('png16', flag=True, extra='x')\n"
    )
    returned, binding = returns(function, call)
    assert [ast.unparse(value) for value in returned] == ["f'lib{name}{suffix}'", "name"]
    assert binding == {"name": "png16", "suffix": ".so", "extra": "x"}  # flags are no names
    assert [evaluate(value, binding) for value in returned] == ["libpng16.so", "png16"]


def test_a_call_binds_positions_over_defaults_and_keywords_by_name() -> None:
    source = "def load(a, b='one', c='two'):\n    pass\n"
    function, call = helper_and_call(source + "load('x', 'given')\n")
    assert bind(function, call) == {"a": "x", "b": "given", "c": "two"}
    function, call = helper_and_call(source + "load(1, c='named')\n")
    assert bind(function, call) == {"a": 1, "b": "one", "c": "named"}
    assert default(function, "b") is not None
    assert default(function, "a") is None
    assert default(expression("x"), "b") is None  # no function: no defaults
