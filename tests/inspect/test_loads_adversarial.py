"""The load scanner on hostile Python source: it must finish quickly and never raise.

A wheel's sources are input the builder does not control; a generated or malicious module must
cost at most "no load sites found here", not a traceback or an hour of CPU.
"""

from __future__ import annotations

import time

from builder.inspect.loads import scan_source, scan_sources


def test_deeply_nested_expression_is_skipped_not_a_crash():
    """A long `+` chain nests the tree past the recursion limit, in `ast` or in the scanner."""
    for pieces in (1500, 5000):
        source = "import ctypes\ndef f(x):\n    return x" + ' + "a"' * pieces
        source += "\nctypes.CDLL(f('lib'))\nctypes.CDLL('libz.so.1')\n"
        sites = scan_sources(["m.py"], lambda path, s=source: s.encode())
        assert [site.names for site in sites] in ([], [("libz.so.1",)])


def test_names_assigned_from_each_other_do_not_explode():
    """`a = b` / `b = a` many times over: followed once per name and depth, not per path."""
    source = "import ctypes\n" + "a = b\n" * 60 + "b = a\n" * 60 + "a = 'libq.so.1'\n"
    source += "ctypes.CDLL(a)\n"
    started = time.monotonic()
    sites = scan_source("m.py", source.encode())
    assert time.monotonic() - started < 60  # a walk per path would not end; 60: a busy machine
    assert [site.names for site in sites] == [("libq.so.1",)]


def test_undecodable_or_binary_source_finds_nothing():
    for source in (
        b"import ctypes\nctypes.CDLL('\xff\xfe')\n",
        b"# -*- coding: bogus -*-\nimport ctypes\nctypes.CDLL('x')\n",
        b"import ctypes\x00\nctypes.CDLL('x')\n",
    ):
        assert scan_source("m.py", source) == []
