"""Programs the image's distributions run: each found on PATH and run by the sandbox user.

Importing a wrapper (pdf2image, pytesseract) succeeds without its program; only running the
program shows that it is there, on the commands' PATH, executable by uid 65532 under the
read-only root, with every library it links. One interpreter looks each program up and runs
it with the first of a few version options that exits 0 (programs disagree on which); a run
that exits otherwise still proves the program starts, unless the loader could not start it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from builder.verify.client import Sandbox, python_json
from builder.verify.report import Check, ContractViolation, short

RUN_SECONDS = "30"  # one program's version run, emulated included (a word of the script)

PROGRAMS_SCRIPT = """
import json, shutil, subprocess, sys
found = {}
for name in json.loads(sys.argv[1]):
    path = shutil.which(name)
    if path is None:
        found[name] = None
        continue
    tries = []
    for option in ("--version", "-version", "-v", "-V"):
        try:
            done = subprocess.run([path, option], capture_output=True, timeout=SECONDS,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as error:
            tries.append({"option": option, "error": str(error)})
            break
        text = (done.stdout or done.stderr).decode("utf-8", "replace").strip()
        tries.append({"option": option, "code": done.returncode,
                      "line": (text.splitlines() or [""])[0],
                      "stderr": done.stderr.decode("utf-8", "replace")[-300:]})
        if done.returncode == 0:
            break
    found[name] = {"path": path, "tries": tries}
print(json.dumps(found))
""".replace("SECONDS", RUN_SECONDS)
LOADER_FAILURE = "error while loading shared libraries"


@dataclass(frozen=True)
class ProgramExpectation:
    """A program a distribution of the image runs, the package that ships it, and whether the
    operator left that package out (then it is reported, not required)."""

    distribution: str  # "pdf2image==1.17.0", or the name as a requirements file gives it
    program: str
    package: str | None  # None: no Debian 13 package ships it (installed some other way)
    left_out: bool = False


def program_checks(sandbox: Sandbox, expected: Sequence[ProgramExpectation]) -> list[Check]:
    """One check per program: `program NAME`, naming who needs it and the package."""
    wanted = sorted({e.program for e in expected if not e.left_out})
    try:
        found = python_json(sandbox, PROGRAMS_SCRIPT, json.dumps(wanted)) if wanted else {}
    except ContractViolation as error:
        return [Check("programs", False, f"cannot look programs up: {error}")]
    checks = []
    for program in sorted({e.program for e in expected}):
        needing = [e for e in expected if e.program == program]
        users = ", ".join(sorted({e.distribution for e in needing}))
        package = needing[0].package
        if all(e.left_out for e in needing):
            shipped = package or "no Debian 13 package"
            detail = f"left out (without-programs): {users} cannot run {program} ({shipped})"
            checks.append(Check(f"program {program}", True, detail))
            continue
        checks.append(_check(program, found.get(program), users, package))
    return checks


def _check(program: str, seen: dict | None, users: str, package: str | None) -> Check:
    name = f"program {program}"
    if seen is None:
        remedy = f": install {package}" if package else " (and no Debian 13 package ships it)"
        return Check(
            name, False, f"{users} runs {program}, which is not on the commands' PATH{remedy}"
        )
    tries = seen.get("tries") or []
    last = tries[-1] if tries else {}
    if "error" in last or LOADER_FAILURE in last.get("stderr", "") or last.get("code", 0) < 0:
        why = last.get("error") or last.get("stderr") or f"killed by signal {-last['code']}"
        return Check(
            name,
            False,
            f"{users} runs {program} ({package or 'no Debian 13 package'}), which cannot start:"
            f" {short(why)}",
        )
    ran = f"{seen['path']} {last.get('option', '')} -> exit {last.get('code')}"
    return Check(name, True, f"for {users}: {ran}: {short(last.get('line', ''), 80)}")
