"""Wheels compiled the way a build compiles them: through builder.layers.bytecode.CompileQueue."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from builder.layers import bytecode
from builder.layers.bytecode import Compiled, CompileQueue, Compiler


def compile_all(compiler: Compiler, wheels: Sequence[tuple[str, Path]]) -> list[Compiled]:
    """Each (sha256, wheel) compiled or found in the cache, in the order given."""
    with ThreadPoolExecutor(max_workers=bytecode.COMPILERS) as pool:
        queue = CompileQueue(lambda: compiler, pool)
        queue.add_as_ready((wheel, sha) for sha, wheel in wheels)
        done = queue.results()
    return [done[sha] for sha, _ in wheels]
