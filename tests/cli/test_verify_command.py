"""`build-sandbox-image verify`'s options and exit codes, over a verification that returns a
given report: what the command does with a report, not how one is made. The command run for
real against the reference image is tests/integration/test_reference_image.py's
(`test_verify_client_sdk_and_the_hardening_checks_pass_on_the_reference_image`)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from builder.cli import app as cli
from builder.verify.report import Check, VerifyReport


def test_verify_command_exit_codes(monkeypatch):
    reports = {
        "good": VerifyReport("good", [Check("health", True, "ok")]),
        "bad": VerifyReport("bad", [Check("health", True, "ok"), Check("uid", False, "uid 0")]),
    }
    monkeypatch.setattr(
        "builder.verify.run.verify_image",
        lambda image, **kwargs: reports[image.as_written],
        raising=True,
    )
    runner = CliRunner()
    result = runner.invoke(cli.main, ["verify", "good"])
    assert result.exit_code == 0, result.output
    assert "PASS  health" in result.output
    result = runner.invoke(cli.main, ["verify", "bad", "--json"])
    assert result.exit_code == 1
    payload = json.loads(result.output[: result.output.rindex("}") + 1])
    assert payload["passed"] is False
    assert "failed: uid" in result.output


def test_verify_client_sdk_makes_the_sdk_round_trip_required(monkeypatch):
    seen = []

    def fake_verify(image, **kwargs):
        seen.append(kwargs["sdk"])
        return VerifyReport(image, [Check("health", True, "ok")])

    monkeypatch.setattr("builder.verify.run.verify_image", fake_verify, raising=True)
    runner = CliRunner()
    assert runner.invoke(cli.main, ["verify", "img", "--client", "sdk"]).exit_code == 0
    assert runner.invoke(cli.main, ["verify", "img"]).exit_code == 0
    assert seen == [True, None]
    result = runner.invoke(cli.main, ["verify", "img", "--client", "curl"])
    assert result.exit_code == 2 and "'curl' is not 'sdk'" in result.output
