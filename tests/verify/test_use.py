"""The curated use checks: every entry complete and well formed, chosen by installed release."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from packaging.specifiers import SpecifierSet

from builder.verify.deep.use import (
    UseCheck,
    UseRequest,
    chosen,
    curated,
    line_names,
    use_check,
    use_checks,
)


def test_every_curated_check_has_a_reason_and_code_that_parses_or_says_why_not() -> None:
    checks = curated()
    assert len(checks) >= 15
    for check in checks:
        assert check.reason, check
        if check.why_not_hardened:
            assert not check.code, check
        else:
            ast.parse(check.code)  # a SyntaxError names the entry's code
    distributions = {check.distribution for check in checks}
    assert {"matplotlib", "librosa", "soundfile", "python-docx", "nltk"} <= distributions
    assert any(check.why_not_hardened for check in checks)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"code": "pass"}, "needs a reason"),
        ({"reason": "r"}, "needs a reason, and code"),
        ({"reason": "r", "hardened": False}, "needs a reason, and code"),
        ({"reason": "r", "code": "pass", "hardened": False, "why": "w"}, "needs a reason"),
        ({"reason": "r", "code": "pass", "versions": "=>1"}, "bad versions '=>1'"),
    ],
)
def test_an_incomplete_entry_is_refused_naming_it(entry: dict, message: str) -> None:
    with pytest.raises(ValueError, match=r"use-checks.toml \[Some_Lib\]: ") as raised:
        use_check("Some_Lib", entry)
    assert message in str(raised.value)


def test_an_entry_is_named_by_its_normalized_distribution() -> None:
    found = use_check("Some_Lib", {"reason": "r", "hardened": False, "why": "no network"})
    assert found == UseCheck("some-lib", SpecifierSet(""), "r", "", "no network")


def test_a_check_runs_only_for_an_installed_release_it_fits() -> None:
    old = UseCheck("lib", SpecifierSet("<2"), "r", "pass")
    new = UseCheck("lib", SpecifierSet(">=2"), "r", "pass")
    other = UseCheck("other", SpecifierSet(""), "r", "pass")
    versions = {"lib": "2.1", "other": None}
    assert chosen([old, new, other], versions) == [(new, "2.1")]
    assert chosen([old], {"lib": "not a version"}) == []


def test_several_checks_of_one_distribution_are_numbered() -> None:
    a, b = UseCheck("lib", SpecifierSet(""), "r", "pass"), UseCheck("x", SpecifierSet(""), "r", "1")
    assert line_names([a, b, a]) == ["use lib #1", "use x", "use lib #2"]


class HostPython:
    """A stand-in sandbox that runs `python3 -c` on this machine's interpreter: its installed
    distributions (packaging, click) are the 'image's'."""

    def python(self, code: str, *args: str, **_: object) -> dict[str, object]:
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        return {"exit_code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def test_a_check_needing_an_absent_distribution_or_left_out_or_skipped_is_not_run() -> None:
    checks = [
        UseCheck("packaging", SpecifierSet(""), "parses", "import packaging.version"),
        UseCheck("packaging", SpecifierSet(""), "needs", "raise SystemExit(3)", needs=("no-such",)),
        UseCheck("click", SpecifierSet(""), "echoes", "raise SystemExit(4)"),
    ]
    request = UseRequest(["packaging", "click"], checks, skip=("use click",))
    found = use_checks(HostPython(), request)  # type: ignore[arg-type]
    assert [(check.name, check.passed, check.info) for check in found] == [
        ("use packaging", True, False)
    ]
    left_out = UseRequest(["packaging"], checks[:1], left_out={"Packaging": "gcc"})
    (line,) = use_checks(HostPython(), left_out)  # type: ignore[arg-type]
    assert line.info and line.detail.endswith("not run: it needs gcc, left out (--without-program)")
