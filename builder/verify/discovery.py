"""Which modules an image must import: distributions -> their top-level modules, and the
import and snippet checks that prove them.

The mapping is read inside the image (its own installed metadata), so what is checked is what
the image has, not what the host thinks the wheels contain. The imports run in one interpreter
(heavy libraries share numpy, scipy...: one start, one load of each); a module whose import
fails there is imported again alone, and if that interpreter dies (abort, segfault, timeout)
every module it did not report on is imported in its own, so a crash names its culprit.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from builder.verify.client import Sandbox, python_json
from builder.verify.report import Check, ContractViolation, expect, last_line, run_check, short

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


IMPORTS_SCRIPT = """
import importlib, json, os, sys, time, traceback
report = os.fdopen(os.dup(1), "w")  # the results' own stream: what modules print goes to stderr
os.dup2(2, 1)
for name in json.loads(sys.argv[1]):
    started = time.monotonic()
    try:
        module = importlib.import_module(name)
        line = {"ok": True, "file": getattr(module, "__file__", None) or ""}
    except BaseException as error:  # SystemExit too: the module's failure, not the batch's
        line = {"ok": False, "error": traceback.format_exception_only(error)[-1].strip()}
    line.update(module=name, seconds=round(time.monotonic() - started, 2))
    report.write(json.dumps(line) + "\\n")
    report.flush()
report.close()
os._exit(0)  # every result is out: tearing down what was imported only costs (~1 s emulated)
"""


def imported(sandbox: Sandbox, modules: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each module's result line from one interpreter importing them in turn; a module missing
    from the answer is one that interpreter did not get through (it died, or timed out)."""
    result = sandbox.python(IMPORTS_SCRIPT, json.dumps(list(modules)))
    lines: dict[str, dict[str, Any]] = {}
    for text in result["stdout"].splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            break  # a line cut short by the interpreter's death
        if isinstance(line, dict) and line.get("module") in modules:
            lines[line["module"]] = line
    return lines


def import_checks(sandbox: Sandbox, modules: Sequence[str]) -> list[Check]:
    """One `import M` check per module, in order, most of them from one shared interpreter."""
    try:
        lines = imported(sandbox, modules) if modules else {}
    except (ContractViolation, OSError, http.client.HTTPException):
        lines = {}  # each module alone says what is wrong
    done = []
    for module in modules:
        line = lines.get(module)
        if line and line.get("ok") is True:
            where = short(str(line.get("file") or ""), 80) or "built-in"
            done.append(
                Check(
                    f"import {module}", True, f"import {module} ({where}; {line.get('seconds')}s)"
                )
            )
        else:  # failed or never reached: this module alone, in a fresh interpreter, decides
            done.append(run_check(f"import {module}", partial(check_import, sandbox, module)))
    return done


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
