"""The verifier's own contract check suite against the server process, in milliseconds.

The very checks `verify` runs against a built image run here against `builder/runtime/server/`
started as a subprocess in its own pid and network namespaces, as in a container: the
timeout-cleanup check sees only the server's processes, and the checks' requests come from
outside while the commands' own connections are on the server's loopback (the starve check
tells the two apart). The image-only checks (uid, /app/deps, PYTHONPATH) are left out by
`contract_checks(process_mode=True)`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support.sandboxserver import (
    sandbox_of,
    start_namespaced,
    start_server,
    stop_server,
)

from builder.verify import client
from builder.verify.checks import CONTRACT, IMAGE_ONLY, contract_checks, hostile_forms
from builder.verify.client import Machine, Sandbox, multipart_filename, run_check
from builder.verify.discovery import import_alone, import_checks
from builder.verify.hardened import hardening, race
from builder.verify.programs import ProgramExpectation, program_checks
from builder.verify.report import Status, VerifyReport
from builder.verify.run import served_checks
from builder.verify.sdk import sdk_installed


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    process = start_namespaced(tmp_path_factory.mktemp("verify") / "workspace")
    try:
        yield sandbox_of(process)
    finally:
        process.stop()


def test_process_mode_leaves_out_exactly_the_image_checks() -> None:
    names = [name for name, _ in contract_checks(process_mode=True)]
    assert names == [name for name, _ in CONTRACT if name not in IMAGE_ONLY]
    assert {"uid", "pythonpath", "app-deps-readonly"} <= IMAGE_ONLY
    assert [name for name, _ in contract_checks()] == [name for name, _ in CONTRACT]


@pytest.mark.parametrize("name", [name for name, _ in contract_checks(process_mode=True)])
def test_contract_check_passes_against_the_server_process(server: Sandbox, name: str) -> None:
    check = dict(CONTRACT)[name]
    result = run_check(name, partial(check, server))
    assert result.passed, result.detail


def test_the_suite_fails_a_server_that_is_not_there(tmp_path: Path) -> None:
    process = start_server(tmp_path / "workspace")
    sandbox = Sandbox(process.port, workspace=str(process.workspace))
    stop_server(process)
    result = run_check("execute", partial(dict(CONTRACT)["execute"], sandbox))
    assert not result.passed
    assert result.detail.startswith("server did not answer: ConnectionRefusedError")


def test_hostile_paths_reach_each_route_encoded_dot_encoded_and_raw() -> None:
    assert hostile_forms("../etc/passwd") == [
        "..%2Fetc%2Fpasswd",
        "%2E%2E%2Fetc%2Fpasswd",
        "../etc/passwd",
    ]
    assert hostile_forms("passwd\x00.txt") == ["passwd%00.txt", "passwd%00%2Etxt"]


def test_multipart_filenames_are_percent_escaped_not_backslash_escaped() -> None:
    assert multipart_filename('a "b" c.txt') == "a %22b%22 c.txt"
    assert multipart_filename("dir/é ü.txt") == "dir/é ü.txt"
    with pytest.raises(ValueError, match="control character"):
        multipart_filename("a\nb")


def test_a_quote_in_an_upload_name_arrives_as_the_upstream_client_sends_it(
    server: Sandbox,
) -> None:
    """A backslash-escaped quote would be refused (403): the server refuses backslashes."""
    response = server.upload('quote "in" name.txt', b"quoted\n")
    assert response.status == 200, response.body
    assert server.exists("quote %22in%22 name.txt").json()["exists"] is True
    assert server.delete("quote %22in%22 name.txt").status in (200, 204)


def test_hardening_checks_run_in_every_verification() -> None:
    names = [name for name, _ in contract_checks()]
    assert names[-4:] == ["race", "detached", "flood", "starve"]
    assert names[-4:] == [name for name, _ in contract_checks(process_mode=True)][-4:]


EMULATED = Machine(True, "arm64 image on an amd64 engine")


def test_the_flood_check_is_lighter_on_an_emulated_machine(
    server: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under qemu decoding 0xff crawls: one command of 0x01 still passes the reply budget, and
    the peak RSS (qemu-user's own) is reported, not bounded. Emulation is the sandbox's
    machine, however fast its Python starts."""
    monkeypatch.setattr(hardening, "RSS_LIMIT", hardening.MIB)  # any server is over 1 MiB
    emulated = Sandbox(server.port, server.host, server.workspace, machine=EMULATED)
    result = run_check("flood", partial(hardening.check_flood, emulated))
    assert result.passed, result.detail
    assert result.detail.startswith("1 x 2 x 3 MiB of 0x01: ")
    assert re.search(r"\(limit \d+\.\ds: python3 starts \d+\.\dx as slowly", result.detail)
    assert re.search(r"server peak RSS \d+ MiB \(not bounded\); emulated: arm64 ", result.detail)


def test_an_ordinary_command_gets_the_emulated_timeout_only_under_emulation(
    server: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The imports of a big set under qemu take several times longer: an ordinary command's
    deadline widens by the machine's arches, as the server's start does."""
    monkeypatch.setattr(client, "EXECUTE_TIMEOUT", 1.0)
    monkeypatch.setattr(client, "EMULATED_EXECUTE_TIMEOUT", 10.0)
    emulated = Sandbox(server.port, server.host, server.workspace, machine=EMULATED)
    native = server.execute(["sleep", "2"])
    assert (native["exit_code"], native["timed_out"]) == (124, True)
    slow = emulated.execute(["sleep", "2"])
    assert (slow["exit_code"], slow["timed_out"]) == (0, False)


class SlowStart(Sandbox):
    """A native sandbox on a loaded machine: every `python3 -c pass` takes a second."""

    def python(self, code: str, *args: str, **kwargs: Any) -> dict[str, Any]:
        slow = "import time; time.sleep(1)" if code == "pass" else code
        return super().python(slow, *args, **kwargs)


def test_a_loaded_native_sandbox_keeps_the_full_flood_and_the_rss_bound(
    server: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slowness stretches the GET / deadline only: a slow start is not taken for emulation."""
    slow_start = SlowStart(server.port, server.host, server.workspace)
    result = run_check("flood", partial(hardening.check_flood, slow_start))
    assert result.passed, result.detail
    assert result.detail.startswith("2 x 2 x 10 MiB of 0xff: ")
    stretched = re.search(r"\(limit (\d+\.\d)s: python3 starts (\d+\.\d)x as slowly", result.detail)
    assert stretched and float(stretched[1]) == float(stretched[2]) >= 10, result.detail
    assert re.search(r"server peak RSS \d+ MiB \(limit 256 MiB\); native: ", result.detail)
    assert result.detail.endswith("; native: the server runs as a local process")
    monkeypatch.setattr(hardening, "RSS_LIMIT", hardening.MIB)  # any server is over 1 MiB
    result = run_check("flood", partial(hardening.check_flood, slow_start))
    assert not result.passed
    assert re.fullmatch(
        r"the server's peak RSS reached \d+ MiB \(limit 1 MiB; native: the server runs as a"
        r" local process\)",
        result.detail,
    ), result.detail


def test_the_race_check_races_the_reads_when_nothing_outside_is_writable(
    server: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    candidates = '(tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm")'
    assert candidates in race.RACE_SETUP
    monkeypatch.setattr(race, "RACE_SETUP", race.RACE_SETUP.replace(candidates, "()"))
    result = run_check("race", partial(race.check_race, server))
    assert result.passed, result.detail
    assert "(read routes only: nothing outside is writable)" in result.detail
    assert "delete" not in result.detail and "execute-cwd" in result.detail


# A module is importable from the workspace: `python3 -c` puts its cwd first on sys.path.
CRASHING_MODULES = {
    "bsi_prints.py": "import os\nprint('printed at import')\nos.write(1, b'{not json\\n')\n",
    "bsi_aborts.py": "import os\nos.abort()\n",
    "bsi_raises.py": "raise RuntimeError('broken at import')\n",
}


def test_an_import_that_kills_the_interpreter_is_named_and_the_others_still_pass(
    server: Sandbox,
) -> None:
    for name, source in CRASHING_MODULES.items():
        assert server.upload(name, source.encode()).status == 200
    modules = ["json", "bsi_prints", "bsi_raises", "bsi_aborts", "csv", "no_such_module_bsi"]
    try:
        checks = {check.name: check for check in import_checks(server, modules).checks}
    finally:
        for name in CRASHING_MODULES:
            server.delete(name)
    assert list(checks) == [f"import {module}" for module in modules]
    failed = {name for name, check in checks.items() if not check.passed}
    assert failed == {"import bsi_aborts", "import bsi_raises", "import no_such_module_bsi"}
    assert "failed (exit 134)" in checks["import bsi_aborts"].detail
    assert "RuntimeError: broken at import" in checks["import bsi_raises"].detail
    assert "No module named 'no_such_module_bsi'" in checks["import no_such_module_bsi"].detail
    # Before the crash: from the shared interpreter (timed), whatever a module printed.
    assert checks["import json"].detail.endswith("s)") and "; " in checks["import json"].detail
    assert "s); no distribution found: printed on stdout" in checks["import bsi_prints"].detail
    # After it: each in its own interpreter.
    assert checks["import csv"].passed and "; " not in checks["import csv"].detail


def test_served_checks_run_side_by_side_and_report_in_the_fixed_order(server: Sandbox) -> None:
    checks = served_checks(
        server, ["json", "json"], ["pass", "raise SystemExit(3)"], (), None, process_mode=True
    ).checks
    sdk = ["sdk run", "sdk python3", "sdk timeout", "sdk write-read", "sdk list", "sdk exists"]
    expected = [name for name, _ in contract_checks(process_mode=True)]
    expected += (sdk if sdk_installed() else []) + ["import json", "check 1", "check 2"]
    assert [check.name for check in checks] == expected
    failed = [check for check in checks if not check.passed]
    assert [check.name for check in failed] == ["check 2"], failed


@pytest.mark.parametrize(
    ("latencies", "problem"),
    [
        ([0.1] * 28 + [2.5], None),  # one stall on a busy machine, within 3x the limit
        ([0.1] * 28, None),
        ([0.1] * 27 + [1.2, 1.1], "2 GET / took 1.0s or longer during the attack"),
        ([0.1] * 28 + [3.0], "GET / took 3.00s during the attack"),  # a stall, not a hiccup
        ([0.1] * 28 + [float("inf")], "a GET / was not answered with 200 during the attack"),
        ([], "no GET / was answered during the attack"),
    ],
)
def test_health_latencies_let_one_reply_off_and_no_stall(
    latencies: list[float], problem: str | None
) -> None:
    assert hardening.health_problem(latencies, 1.0, "the attack") == problem


def test_program_checks_run_each_program_and_name_who_needs_a_missing_one(
    server: Sandbox,
) -> None:
    """`program NAME` lines: found and run (the first version option that exits 0), missing
    (one line naming the distribution, the program, the package), or left out on purpose."""
    checks = {
        check.name: check
        for check in program_checks(
            server,
            [
                ProgramExpectation("pdf2image==1.17.0", "bsi-no-such-pdftoppm", "poppler-utils"),
                ProgramExpectation("pydub==0.25.1", "ls", "coreutils"),
                ProgramExpectation("moviepy==2.2.1", "ls", "coreutils"),
                ProgramExpectation("pydub==0.25.1", "bsi-left-ffmpeg", "ffmpeg", left_out=True),
                ProgramExpectation("pdfkit==1.0.0", "bsi-wkhtmltopdf", None),  # Debian has none
                ProgramExpectation("pdfkit==1.0.0", "bsi-left-wkhtml", None, left_out=True),
            ],
        )
    }
    assert list(checks) == [
        "program bsi-left-ffmpeg",
        "program bsi-left-wkhtml",
        "program bsi-no-such-pdftoppm",
        "program bsi-wkhtmltopdf",
        "program ls",
    ]
    unshipped = checks["program bsi-wkhtmltopdf"]
    assert not unshipped.passed and unshipped.detail == (
        "pdfkit==1.0.0 runs bsi-wkhtmltopdf, which is not on the commands' PATH (and no Debian"
        " 13 package ships it)"
    )
    assert checks["program bsi-left-wkhtml"].detail.endswith("(no Debian 13 package)")
    missing = checks["program bsi-no-such-pdftoppm"]
    assert not missing.passed
    assert missing.detail == (
        "pdf2image==1.17.0 runs bsi-no-such-pdftoppm, which is not on the commands' PATH:"
        " install poppler-utils"
    )
    found = checks["program ls"]
    assert found.passed and "--version -> exit 0" in found.detail
    assert found.detail.startswith("for moviepy==2.2.1, pydub==0.25.1: ")
    left = checks["program bsi-left-ffmpeg"]
    assert left.passed and left.detail.startswith("left out (without-programs): pydub==0.25.1")


# A distribution in the workspace (on `python3 -c`'s sys.path): its dist-info names its module.
NOISY_FILES = {
    "bsi_noisy.py": b"import warnings\nwarnings.warn('bsi_noisy: a warning at import')\n",
    "bsi_noisy-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bsi-noisy\nVersion: 1.0\n",
    "bsi_noisy-1.0.dist-info/top_level.txt": b"bsi_noisy\n",
    "bsi_fd_noisy.py": b"import os\nos.write(2, b'\\n  written to fd 2 at import\\n')\n",
    "bsi_quiet.py": b"VALUE = 1\n",
}


def test_an_import_that_writes_to_stderr_is_a_warning_naming_its_distribution(
    server: Sandbox,
) -> None:
    for name, source in NOISY_FILES.items():
        assert server.upload(name, source).status == 200
    modules = ["bsi_noisy", "bsi_fd_noisy", "bsi_quiet", "bsi_prints"]
    assert server.upload("bsi_prints.py", CRASHING_MODULES["bsi_prints.py"].encode()).status == 200
    try:
        shared = {check.name: check for check in import_checks(server, modules).checks}
        alone = import_alone(server, "bsi_noisy")
    finally:
        for name in [*NOISY_FILES, "bsi_prints.py"]:
            server.delete(name.split("/")[0])
    noisy, fd_noisy = shared["import bsi_noisy"], shared["import bsi_fd_noisy"]
    assert noisy.passed and noisy.warning, noisy
    assert "bsi-noisy: wrote to stderr at import: " in noisy.detail
    assert "UserWarning: bsi_noisy: a warning at import" in noisy.detail
    assert fd_noisy.warning and fd_noisy.detail.endswith(
        "no distribution found: wrote to stderr at import: written to fd 2 at import"
    ), fd_noisy.detail
    assert "printed on stdout at import: printed at import" in shared["import bsi_prints"].detail
    assert not shared["import bsi_quiet"].warning, shared["import bsi_quiet"]
    # a module imported alone (the shared interpreter failed) is heard too
    assert alone.passed and alone.warning and "bsi-noisy: wrote to stderr" in alone.detail
    lenient = VerifyReport("image", list(shared.values()))
    assert lenient.passed
    assert [lenient.status(check) for check in shared.values()] == [Status.WARN] * 2 + [
        Status.PASS,
        Status.WARN,
    ]
    assert "WARN  import bsi_noisy" in lenient.table()
    assert lenient.table().endswith("4/4 checks passed, 3 with a warning")
    strict = VerifyReport("image", list(shared.values()), strict=True)
    assert not strict.passed
    assert [check.name for check in strict.failed] == [
        "import bsi_noisy",
        "import bsi_fd_noisy",
        "import bsi_prints",
    ]
    record = strict.to_dict()
    assert record["strict"] is True and record["passed"] is False
    assert [c["status"] for c in record["checks"]] == ["fail", "fail", "pass", "fail"]
    assert [c["passed"] for c in lenient.to_dict()["checks"]] == [True] * 4
