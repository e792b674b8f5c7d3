"""Which modules an image must import: distributions -> their top-level modules, and the
import and snippet checks that prove them.

The mapping is read inside the image (its own installed metadata), so what is checked is what
the image has, not what the host thinks the wheels contain.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from builder.verify.client import Sandbox, python_json
from builder.verify.report import Check, expect, last_line, short

SKIP_TOP_LEVEL = frozenset({"test", "tests", "testing", "docs", "doc", "examples", "benchmarks"})

TOP_LEVEL_SCRIPT = """
import json, sys
from importlib import metadata

def top_level(dist):
    text = dist.read_text("top_level.txt")
    if text:
        return [line.strip() for line in text.splitlines() if line.strip()]
    names = []
    for file in dist.files or []:
        parts = file.parts
        if not parts or parts[0] == "..":
            continue
        head = parts[0]
        if len(parts) == 1:
            name, dot, suffix = head.partition(".")
            if suffix == "py" or (dot and (suffix.endswith(".so") or suffix.endswith(".pyd"))):
                names.append(name)
        elif parts[-1].endswith(".py") or ".so" in parts[-1]:
            names.append(head)
    return names

result = {}
for name in json.loads(sys.argv[1]):
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        result[name] = None
        continue
    result[name] = sorted(set(top_level(dist)))
print(json.dumps(result))
"""


def importable(names: Iterable[str]) -> list[str]:
    return [
        name
        for name in names
        if name.isidentifier() and not name.startswith("__") and name not in SKIP_TOP_LEVEL
    ]


def modules_of(sandbox: Sandbox, distributions: Sequence[str]) -> tuple[list[str], list[Check]]:
    """Top-level modules of the distributions as installed in the image; a check per missing."""
    found = python_json(sandbox, TOP_LEVEL_SCRIPT, json.dumps(list(distributions)))
    modules: list[str] = []
    problems: list[Check] = []
    for name in distributions:
        tops = found.get(name)
        if tops is None:
            problems.append(
                Check(
                    f"installed {name}", False, "distribution not found on the commands' sys.path"
                )
            )
        elif not importable(tops):
            problems.append(Check(f"installed {name}", True, "installed; no top-level module"))
        else:
            modules += importable(tops)
    return list(dict.fromkeys(modules)), problems


def check_import(sandbox: Sandbox, module: str) -> str:
    code = (
        f"import importlib; m = importlib.import_module({module!r});"
        " print(getattr(m, '__file__', None) or '')"
    )
    result = sandbox.python(code)
    expect(
        result["exit_code"] == 0,
        f"import {module} failed (exit {result['exit_code']}): {last_line(result['stderr'])}",
    )
    return f"import {module} ({short(result['stdout'].strip(), 80) or 'built-in'})"


def check_snippet(sandbox: Sandbox, snippet: str) -> str:
    result = sandbox.python(snippet)
    expect(
        result["exit_code"] == 0,
        f"exit {result['exit_code']}: {last_line(result['stderr'])}",
    )
    return f"python3 -c {short(snippet, 60)!r} -> exit 0"
