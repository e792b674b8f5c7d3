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
from typing import NotRequired, TypedDict, cast

from builder.contract import DEPS_EXTRA
from builder.verify.client import Sandbox, python_json, run_check
from builder.verify.report import (
    Check,
    Checked,
    ContractViolation,
    expect,
    last_line,
    short,
    warned,
)

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


MAX_READS = 200_000  # files an import may say it read: a hundred times a large set's
IMPORTS_SCRIPT = """
import importlib, importlib.util, json, os, sys, time, traceback
report = os.fdopen(os.dup(1), "w")  # the results' own stream: what modules print goes to stderr
os.dup2(2, 1)
names, root = json.loads(sys.argv[1]), sys.argv[2] + "/"
sys.dont_write_bytecode = True  # a module without a valid .pyc stays one, wherever it lives
owners = None

def heard(sink, stream):
    # the first line an import wrote to one of its streams (fd 1 or 2), and the distributions
    # that own the module (read only when something was written)
    global owners
    os.lseek(sink, 0, os.SEEK_SET)
    text = os.read(sink, 65536).decode(errors="replace")
    os.close(sink)
    first = next((part.strip() for part in text.splitlines() if part.strip()), "")
    if not first:
        return None
    if owners is None:
        from importlib.metadata import packages_distributions
        owners = packages_distributions()
    found = owners.get(name.split(".")[0], [])
    return {"stream": stream, "line": first[:300], "distributions": found}

began = time.monotonic()
for name in names:
    started = time.monotonic()
    sinks = {stream: os.memfd_create("bsi-" + stream) for stream in ("stderr", "stdout")}
    kept = os.dup(2)
    os.dup2(sinks["stdout"], 1)
    os.dup2(sinks["stderr"], 2)
    try:
        module = importlib.import_module(name)
        line = {"ok": True, "file": getattr(module, "__file__", None) or ""}
    except BaseException as error:  # SystemExit too: the module's failure, not the batch's
        line = {"ok": False, "error": traceback.format_exception_only(error)[-1].strip()}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os.dup2(kept, 1)
    os.dup2(kept, 2)
    os.close(kept)
    noise = [found for stream, sink in sinks.items() if (found := heard(sink, stream))]
    if noise:
        line["noise"] = noise[0]
    line.update(module=name, seconds=round(time.monotonic() - started, 2))
    report.write(json.dumps(line) + "\\n")
    report.flush()
seconds = round(time.monotonic() - began, 2)

def files_read():
    # each imported module's file as the loader read it (its .pyc, else its source), and
    # every file mapped (the interpreter, extension modules, the libraries they load)
    found = set()
    for module in list(sys.modules.values()):
        names = getattr(module, "__dict__", None)  # not getattr: a lazy module would load
        spec = names.get("__spec__") if isinstance(names, dict) else None
        if getattr(spec, "has_location", False):
            cached = getattr(spec, "cached", None)
            found.add(cached if cached and os.path.isfile(cached) else spec.origin)
    with open("/proc/self/maps", errors="surrogateescape") as maps:
        for fields in (line.split(None, 5) for line in maps):
            if len(fields) == 6 and fields[5].startswith("/"):
                found.add(fields[5].rstrip("\\n"))
    found = {os.path.realpath(path) for path in found if isinstance(path, str) and path}
    workspace = os.path.join(os.getcwd(), "")  # the commands' cwd: no part of the image
    outside = ("/proc/", "/sys/", "/dev/", "/tmp/") + ((workspace,) if workspace != "/" else ())
    return sorted(path for path in found if os.path.isfile(path) and not path.startswith(outside))

def from_bytecode(spec):
    # what the import system checked before it used the .pyc: the magic number, then the
    # source's hash (hash-based) or its mtime and size (timestamp)
    try:
        with open(spec.cached, "rb") as pyc:
            header = pyc.read(16)
        if header[:4] != importlib.util.MAGIC_NUMBER:
            return False
        if int.from_bytes(header[4:8], "little") & 1:
            with open(spec.origin, "rb") as source:
                return importlib.util.source_hash(source.read()) == header[8:16]
        found = os.stat(spec.origin)
        return header[8:16] == (
            (int(found.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
            + (found.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        )
    except (OSError, TypeError):
        return False

extras = [m.__spec__ for m in list(sys.modules.values())
          if getattr(getattr(m, "__spec__", None), "origin", None)
          and m.__spec__.origin.startswith(root) and m.__spec__.origin.endswith(".py")]
missing = sorted(spec.origin[len(root):] for spec in extras if not from_bytecode(spec))
summary = {"seconds": seconds, "root": root[:-1], "modules": len(extras), "missing": missing}
report.write(json.dumps({"set": summary}) + "\\n")
report.flush()
try:  # an estimate for report.json: whatever fails here leaves the checks as they are
    reads = files_read()
except Exception:
    reads = []
report.write(json.dumps({"reads": reads}, default=str))
report.close()
os._exit(0)  # every result is out: tearing down what was imported only costs (~1 s emulated)
"""


class Noise(TypedDict):
    """What an import wrote (IMPORTS_SCRIPT's `noise`): the stream, its first line, and the
    distributions owning the module (`importlib.metadata.packages_distributions`)."""

    stream: str  # stderr, else stdout
    line: str
    distributions: list[str]


class ImportLine(TypedDict):
    """One module's line from IMPORTS_SCRIPT: `file` when it imported, `error` when not, and
    `noise` when it wrote to stderr or stdout."""

    module: str
    ok: bool
    seconds: float
    file: NotRequired[str]
    error: NotRequired[str]
    noise: NotRequired[Noise]


class ImportSummary(TypedDict):
    """IMPORTS_SCRIPT's summary: the set's import time, its modules under `root`, and what it
    read (from the line after it)."""

    seconds: float
    root: str
    modules: int
    missing: list[str]  # paths under root with no valid .pyc
    reads: NotRequired[list[str]]  # the files importing the set read: IMPORTS_SCRIPT's last line


def imported(
    sandbox: Sandbox, modules: Sequence[str], root: str = DEPS_EXTRA
) -> tuple[dict[str, ImportLine], ImportSummary | None]:
    """Each module's result line from one interpreter importing them in turn, and the set's
    summary (its import time; the modules loaded from under `root`, those without valid
    bytecode). A module missing from the answer is one that interpreter did not get through
    (it died, or timed out); then there is no summary either."""
    result = sandbox.python(IMPORTS_SCRIPT, json.dumps(list(modules)), root)
    lines: dict[str, ImportLine] = {}
    summary = None
    for text in result["stdout"].splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            break  # a line cut short by the interpreter's death
        if isinstance(line, dict) and line.get("module") in modules:
            lines[line["module"]] = cast(ImportLine, line)  # IMPORTS_SCRIPT wrote it
        elif isinstance(line, dict) and isinstance(line.get("set"), dict):
            summary = line["set"]
        elif isinstance(line, dict) and isinstance(line.get("reads"), list) and summary:
            summary["reads"] = first_import_reads(line["reads"])
    return lines, summary


def first_import_reads(found: list[object]) -> list[str]:
    """The image's word for the files its import read, as the paths it may be: strings, each
    once, at most MAX_READS of them (a push maps each onto the layers' spans)."""
    paths = {path for path in found if isinstance(path, str) and path.startswith("/")}
    return sorted(paths)[:MAX_READS]


def import_checks(
    sandbox: Sandbox, modules: Sequence[str], bytecode: bool | None = None
) -> Checked:
    """One `import M` check per module, in order, most of them from one shared interpreter,
    then the `bytecode` check of that interpreter's imports.

    `bytecode`: every module imported from the extras must have been loaded from a valid
    `.pyc` (True), or is only reported (False); None leaves the check out.
    """
    summary = None
    try:
        lines, summary = imported(sandbox, modules) if modules else ({}, None)
    except (ContractViolation, OSError, http.client.HTTPException):
        lines = {}  # each module alone says what is wrong
    done = []
    for module in modules:
        line = lines.get(module)
        if line and line.get("ok") is True:
            where = short(str(line.get("file") or ""), 80) or "built-in"
            detail = f"import {module} ({where}; {line.get('seconds')}s)"
            done.append(noisy(Check(f"import {module}", True, detail), line.get("noise")))
        else:  # failed or never reached: this module alone, in a fresh interpreter, decides
            done.append(import_alone(sandbox, module))
    if bytecode is not None and modules:
        done.append(bytecode_check(summary, required=bytecode))
    return Checked(done, tuple(summary.get("reads") or ()) if summary else ())


def bytecode_check(summary: ImportSummary | None, required: bool) -> Check:
    """Whether the extras' modules came from bytecode, and how long the set took to import.

    A module compiled from source at every start costs every sandbox command its compile
    time: uid 65532 cannot write `__pycache__` in a read-only layer.
    """
    if summary is None:
        return Check("bytecode", not required, "the import interpreter gave no summary")
    missing = [str(path) for path in summary.get("missing") or []]
    count, root = int(summary.get("modules") or 0), summary.get("root")
    timing = f"the set imported in {summary.get('seconds')} s"
    if not missing:
        return Check("bytecode", True, f"{count} modules from {root} loaded from .pyc; {timing}")
    detail = (
        f"{len(missing)} of {count} modules from {root} compiled from source at every"
        f" start (no valid .pyc), e.g. {short(missing[0], 80)}; {timing}"
    )
    return Check("bytecode", not required, detail)


def noisy(check: Check, noise: Noise | None) -> Check:
    """`check` as a warning naming what its import wrote and the distribution it came from:
    an agent reads a warning at import as an error, and stdout is what the platform reads."""
    if noise is None:
        return check
    owners = ", ".join(noise.get("distributions") or []) or "no distribution found"
    wrote = "wrote to stderr" if noise.get("stream") == "stderr" else "printed on stdout"
    return warned(check, f"{owners}: {wrote} at import: {short(noise.get('line', ''), 200)}")


# Alone in a fresh interpreter: the module's file and the distributions owning it, as the last
# line of stdout (whatever the module printed comes before it). Anything on stderr is its noise.
ALONE_SCRIPT = """
import importlib, json, sys
from importlib.metadata import packages_distributions
name = sys.argv[1]
module = importlib.import_module(name)
print()
print(json.dumps({"file": getattr(module, "__file__", None) or "",
                  "distributions": packages_distributions().get(name.split(".")[0], [])}))
"""


def import_alone(sandbox: Sandbox, module: str) -> Check:
    """`import module` in a fresh interpreter: its failure, or a warning if it was noisy."""
    heard: list[Noise] = []
    check = run_check(f"import {module}", partial(check_import, sandbox, module, heard))
    return noisy(check, heard[0]) if heard else check


def check_import(sandbox: Sandbox, module: str, heard: list[Noise] | None = None) -> str:
    """`import module` alone; the first line it wrote to stderr, if any, is added to `heard`."""
    result = sandbox.python(ALONE_SCRIPT, module)
    expect(
        result["exit_code"] == 0,
        f"import {module} failed (exit {result['exit_code']}): {last_line(result['stderr'])}",
    )
    found = json.loads((result["stdout"].strip().splitlines() or ["{}"])[-1])
    first = next((line.strip() for line in result["stderr"].splitlines() if line.strip()), "")
    if first and heard is not None:
        owners = [str(name) for name in found.get("distributions") or []]
        heard.append(Noise(stream="stderr", line=first[:300], distributions=owners))
    return f"import {module} ({short(str(found.get('file') or ''), 80) or 'built-in'})"


def check_snippet(sandbox: Sandbox, snippet: str) -> str:
    result = sandbox.python(snippet)
    expect(
        result["exit_code"] == 0,
        f"exit {result['exit_code']}: {last_line(result['stderr'])}",
    )
    return f"python3 -c {short(snippet, 60)!r} -> exit 0"
