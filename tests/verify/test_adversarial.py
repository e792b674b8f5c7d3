"""The hardening checks against a server that answers in shapes the contract does not allow.

A non-conforming image must fail the check with one clear line; the report goes on. The fake
sandbox here answers /execute like a server would for the checks' own helper scripts, and the
route under test with JSON of the wrong shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial

import pytest

from builder import contract
from builder.verify import checks
from builder.verify.client import LOCAL_PROCESS, Machine, Response, Sandbox, run_check
from builder.verify.hardened import hardening, race

Answer = Callable[[list[str]], str]  # argv -> what the command printed


class Misshapen(Sandbox):
    """/execute runs nothing: `stdout_for` says what each command printed; every other route
    answers `other`."""

    def __init__(self, stdout_for: Answer, other: bytes, machine: Machine = LOCAL_PROCESS) -> None:
        super().__init__(port=1, machine=machine)
        self.stdout_for = stdout_for
        self.other = other

    def request(self, method, path, body=None, headers=None, timeout=30.0) -> Response:
        if path == contract.EXECUTE:
            argv = json.loads(body)["command"]
            stdout = self.stdout_for(argv)
            if stdout is None:
                return Response(200, b"[]")
            reply = {"stdout": stdout, "stderr": "", "exit_code": 0}
            return Response(200, json.dumps(reply).encode())
        return Response(200, self.other)


def _script(argv: list[str]) -> str:
    return argv[2] if argv[:2] == ["python3", "-c"] else ""


def test_flood_reply_that_is_not_an_object_fails_the_check():
    def stdout_for(argv: list[str]) -> str | None:
        if _script(argv) == hardening.FLOOD:
            return None  # the flood's reply is `[]`
        return "VmHWM unknown\n" if argv == list(hardening.PEAK_RSS) else ""

    result = run_check("flood", partial(hardening.check_flood, Misshapen(stdout_for, b"{}")))
    assert not result.passed
    assert "not a JSON object" in result.detail


@pytest.mark.parametrize("printed", ["warning: something\n", "", "VmHWM: 12 kB\n", "-5\n"])
def test_an_unreadable_peak_rss_fails_a_native_flood(monkeypatch, printed: str):
    """Natively the bound must be checked: an `sh` without $PPID, or one printing anything but
    a number of kB, cannot let the flood pass with its bound unchecked."""

    def stdout_for(argv: list[str]) -> str:
        return printed if argv == list(hardening.PEAK_RSS) else ""

    flood = {"stdout": "", "stderr": "", "exit_code": 0, "truncated": {"stdout": True}}
    monkeypatch.setattr(Misshapen, "request", _flood_answers(Misshapen.request, flood))
    result = run_check("flood", partial(hardening.check_flood, Misshapen(stdout_for, b"{}")))
    assert not result.passed
    assert result.detail.startswith("the server's peak RSS could not be read (limit 256 MiB):")


def test_an_unreadable_peak_rss_is_reported_under_emulation(monkeypatch):
    def stdout_for(argv: list[str]) -> str:
        return "warning: something\n" if argv == list(hardening.PEAK_RSS) else ""

    sandbox = Misshapen(stdout_for, b"{}", Machine(True, "arm64 image on an amd64 engine"))
    flood = {"stdout": "", "stderr": "", "exit_code": 0, "truncated": {"stdout": True}}
    monkeypatch.setattr(Misshapen, "request", _flood_answers(Misshapen.request, flood))
    result = run_check("flood", partial(hardening.check_flood, sandbox))
    assert result.passed, result.detail
    assert "server peak RSS not readable (not bounded)" in result.detail


ENV_PYTHONPATH = "PYTHONPATH=/app/deps"
CANNED_ENV = f"{ENV_PYTHONPATH}\0BSI_VERIFY=a value with spaces, $HOME and 'quotes'\0"


@pytest.mark.parametrize(
    ("plain", "seen"),
    [
        # what a command finds first (getenv, os.environ) is not what was sent
        (
            f"{ENV_PYTHONPATH}\0",
            lambda v: f"BSI_VERIFY=mangled\0{ENV_PYTHONPATH}\0BSI_VERIFY={v}\0",
        ),
        (f"{ENV_PYTHONPATH}\0", lambda v: f"{ENV_PYTHONPATH}\0PYTHONPATH=/x\0BSI_VERIFY={v}\0"),
        # an `env` printing the same canned output whatever the environment
        (CANNED_ENV, lambda v: CANNED_ENV),
    ],
    ids=["duplicate-sent-variable", "duplicate-server-variable", "canned"],
)
def test_an_environment_a_command_does_not_see_as_sent_fails_the_env_check(
    plain: str, seen: Callable[[str], str]
):
    class Env(Sandbox):
        def request(self, method, path, body=None, headers=None, timeout=30.0) -> Response:
            value = (json.loads(body).get("env") or {}).get("BSI_VERIFY")
            reply = {"stdout": seen(value) if value else plain, "stderr": "", "exit_code": 0}
            return Response(200, json.dumps(reply).encode())

    result = run_check("env", partial(checks.check_env, Env(1)))
    assert not result.passed, result.detail


def _flood_answers(request, flood: dict):
    def answer(self, method, path, body=None, headers=None, timeout=30.0) -> Response:
        if path == contract.EXECUTE and hardening.FLOOD in json.loads(body)["command"]:
            return Response(200, json.dumps(flood).encode())
        return request(self, method, path, body, headers, timeout)

    return answer


def test_race_exists_answer_that_is_not_an_object_fails_the_check():
    layout = json.dumps({"outside": "/tmp/x", "name": "n", "writable": True})

    def stdout_for(argv: list[str]) -> str:
        return layout if _script(argv) == race.RACE_SETUP else ""

    result = run_check("race", partial(race.check_race, Misshapen(stdout_for, b'"yes"')))
    assert not result.passed
    assert "not a JSON object" in result.detail


def test_race_setup_printing_the_wrong_json_fails_the_check():
    def stdout_for(argv: list[str]) -> str:
        return "[1, 2]" if _script(argv) == race.RACE_SETUP else ""

    result = run_check("race", partial(race.check_race, Misshapen(stdout_for, b"{}")))
    assert not result.passed
    assert "the race's setup printed [1, 2]" in result.detail


def test_process_listing_that_is_not_a_list_fails_the_detached_check():
    def stdout_for(argv: list[str]) -> str:
        if argv[:2] == ["sh", "-c"]:
            return "detached\n"
        return "0" if _script(argv) == hardening.SURVIVORS else ""

    result = run_check("detached", partial(hardening.check_detached, Misshapen(stdout_for, b"{}")))
    assert not result.passed
    assert "the process listing printed 0, not a list" in result.detail


def test_a_check_meeting_json_of_an_unforeseen_shape_fails_alone():
    def check() -> str:
        return {"stdout": 1}["exit_code"]  # type: ignore[return-value]

    result = run_check("odd", check)
    assert not result.passed and result.detail.startswith("unexpected answer (KeyError")


def test_race_damage_is_the_swappers_count_else_counted_again():
    """The swapper counts what escaping deletes and uploads did once the client stopped it;
    when it stopped on its own (no count), a separate command counts, and escapes still show."""
    layout = {"outside": "/tmp/x", "name": "n", "writable": True}
    asked: list[str] = []

    def stdout_for(argv: list[str]) -> str:
        asked.append(_script(argv))
        return json.dumps({"delete": ["v3"], "upload": []})

    counted = race.Race(Misshapen(stdout_for, b"{}"), "t", layout)
    counted.count_damage({"delete": [], "upload": ["u7.txt"]})
    assert (counted.escapes["delete"], counted.escapes["upload"], asked) == ([], ["u7.txt"], [])

    recounted = race.Race(Misshapen(stdout_for, b"{}"), "t", layout)
    recounted.count_damage(None)
    assert (recounted.escapes["delete"], asked) == (["v3"], [race.RACE_DAMAGE])
