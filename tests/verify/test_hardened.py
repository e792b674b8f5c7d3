"""The adversarial checks fail a server without the hardening, each for its own reason.

The server is support/unhardened_server.py: the contract served with the pre-hardening server's
(0bd0c22) three weaknesses — resolve-then-open paths, a kill of the process group only, output
captured whole — and the one issue 23 removed — connections bounded in all but not per source,
with nothing to answer GET / beyond the bound — kept as a small fixture in the tree, so the test
needs no git history (a shallow clone runs it) and shows exactly what each check is there to
catch. It runs in its own network namespace, so the checks' requests come from outside.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from support import sandboxserver
from support.sandboxserver import SERVER_PYTHONPATH, NamespacedServer, sandbox_of, start_namespaced

from builder.verify.checks import CONTRACT
from builder.verify.client import Sandbox, run_check
from builder.verify.hardened import hardening

UNHARDENED = Path(__file__).resolve().parents[1] / "support" / "unhardened_server.py"


@pytest.fixture(scope="module")
def unhardened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """The unhardened server in its own pid namespace, as the contract checks run the real one."""
    original, sandboxserver.SERVER = sandboxserver.SERVER, UNHARDENED
    try:
        process = start_namespaced(tmp_path_factory.mktemp("unhardened") / "workspace")
    finally:
        sandboxserver.SERVER = original
    try:
        yield sandbox_of(process)
    finally:
        process.stop()


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("race", "escaped outside the workspace: "),
        ("detached", "detached processes outlived their command"),
        ("flood", "a reply to 2 x 10 MiB of 0xff is "),
        ("starve", "requests from outside were refused during the attack: GET / -> HTTP 503"),
    ],
)
def test_hardening_checks_fail_against_the_pre_hardening_server(
    unhardened: Sandbox, name: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The detached sleeps last days: a second's grace (stretched by the slowness) shows them
    # outliving their command as well as the verification's five seconds do.
    monkeypatch.setattr(hardening, "CLEANUP_WAIT", 1.0)
    result = run_check(name, partial(dict(CONTRACT)[name], unhardened))
    assert not result.passed
    assert reason in result.detail, result.detail


@pytest.mark.parametrize("name", ["execute", "exit-code", "env", "cwd", "files", "timeout"])
def test_the_unhardened_server_serves_the_contract_the_checks_rely_on(
    unhardened: Sandbox, name: str
) -> None:
    """Else the hardening checks could fail it for a reason other than the one they name."""
    result = run_check(name, partial(dict(CONTRACT)[name], unhardened))
    assert result.passed, result.detail


def test_starve_fails_a_server_that_bounds_no_source_however_many_it_serves(
    tmp_path: Path,
) -> None:
    """A server with no per-source share and room for more connections than the attack holds
    (say, unbounded threads) serves the outside during the attack, yet the sandbox's code
    could still take everything with a few more connections (or threads, up to the process
    limit): the check fails it because the attack was never refused."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {**os.environ, "PYTHONPATH": SERVER_PYTHONPATH}
    original, sandboxserver.SERVER = sandboxserver.SERVER, UNHARDENED
    try:
        process = NamespacedServer(workspace, "--max-connections", "100000", env=env)
    finally:
        sandboxserver.SERVER = original
    try:
        result = run_check("starve", partial(dict(CONTRACT)["starve"], sandbox_of(process)))
    finally:
        process.stop()
    assert not result.passed
    assert "the server never refused one of the attack's connections" in result.detail, result
