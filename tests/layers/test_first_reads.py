"""What importing a distribution reads first, from its own sources: the order layers start with."""

from __future__ import annotations

from pathlib import Path

from support.wheelfactory import make_wheel

from builder.layers import first_reads as reading
from builder.layers.first_reads import first_reads, laid_out, module_name, wheel_first_reads

SOURCES = {
    "pkg/__init__.py": b"from . import core\nfrom .sub import helper\nimport json\n",
    "pkg/core.py": b"try:\n    from pkg import _speed\nexcept ImportError:\n    _speed = None\n",
    "pkg/_speed.cpython-313-x86_64-linux-gnu.so": b"\x7fELF",
    "pkg/sub/__init__.py": b"",
    "pkg/sub/helper.py": b"def lazy():\n    from pkg import later\n",
    "pkg/later.py": b"X = 1\n",
    "pkg/broken.py": b"def (:\n",
    "pkg.libs/libfoo-1234.so.1": b"\x7fELF",
    "pkg-1.0.dist-info/METADATA": b"Name: pkg\n",
    "solo.py": b"import pkg.sub.helper\n",
    "bin/tool": b"#!/usr/bin/env python3\n",
}


def test_module_level_imports_are_followed_breadth_first_within_the_distribution() -> None:
    read = first_reads(SOURCES, lambda path: SOURCES[path])
    assert read == (
        "pkg/__init__.py",
        "solo.py",
        "pkg/core.py",
        "pkg/sub/__init__.py",
        "pkg/sub/helper.py",
        "pkg/_speed.cpython-313-x86_64-linux-gnu.so",
        "pkg.libs/libfoo-1234.so.1",  # an extension is read: the loader maps its libraries
    )
    # a function's import, a file that does not parse, metadata and scripts: not first reads
    assert not {"pkg/later.py", "pkg/broken.py", "bin/tool"} & set(read)


def test_module_names() -> None:
    assert module_name("a/b/__init__.py") == "a.b"
    assert module_name("a/_c.cpython-313-x86_64-linux-gnu.so") == "a._c"
    assert module_name("a-1.0.dist-info/x.py") is None
    assert module_name("a/__pycache__/b.cpython-313.pyc") is None
    assert module_name("a/data.txt") is None


def test_the_layout_puts_directories_then_first_reads_then_the_rest() -> None:
    names = ["a", "a/x.py", "a/y.py", "a/z.py", "b", "b/w.py"]
    assert laid_out(names, {"a", "b"}, ["a/z.py", "b/w.py", "gone.py"]) == [
        "a", "b", "a/z.py", "b/w.py", "a/x.py", "a/y.py",
    ]  # fmt: skip


def test_a_wheels_first_reads_are_the_same_on_every_call(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "pkg", "1.0", "py3-none-any",
                       {k: v for k, v in SOURCES.items() if k.startswith("pkg/")},
                       top_level=["pkg"])  # fmt: skip
    first = wheel_first_reads(wheel)
    assert first[:2] == ("pkg/__init__.py", "pkg/core.py")
    assert first == wheel_first_reads(wheel)


def test_imports_are_read_line_by_line_as_the_module_runs_them() -> None:
    """The reading follows if/try/with at module level, not functions, classes or loops, and
    not text in docstrings; a statement spans its brackets and continuations, and a module of
    syntax the tool's own Python cannot parse (3.12's `type`) is still read."""
    source = b'''"""Doc.

import in_docstring
"""
# a comment with """ opens no string
from . import (
    one,  # a comment (
    two,
)
import three, \\
    four
if True:
    try:
        from .five import x
    except ImportError:
        import six
def f():
    import in_function
    if True:
        import in_function_block
class C:
    import in_class
for _ in ():
    import in_loop
with open:
    import seven
type Alias = int
x = """
import in_string
"""
'''
    found = reading._imports("pkg", "pkg/__init__.py", source)
    assert found == [
        "pkg", "pkg.one", "pkg.two", "three", "four", "pkg.five", "pkg.five.x", "six", "seven",
    ]  # fmt: skip
