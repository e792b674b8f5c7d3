"""`verify_image`: run an image hardened and check the contract, the SDK, imports and snippets."""

from __future__ import annotations

import http.client
from collections.abc import Sequence
from functools import partial

import docker

from builder.engine import engine_client, local_image
from builder.errors import UserError
from builder.verify.checks import contract_checks
from builder.verify.client import Sandbox
from builder.verify.container import STARTUP_TIMEOUT, hardened, image_user_check
from builder.verify.discovery import check_import, check_snippet, modules_of
from builder.verify.report import Check, CheckFailed, ContractViolation, VerifyReport, run_check
from builder.verify.sdk import sdk_checks


def verify_image(
    image: str,
    *,
    modules: Sequence[str] = (),
    checks: Sequence[str] = (),
    distributions: Sequence[str] = (),
    client: docker.DockerClient | None = None,
    startup_timeout: float = STARTUP_TIMEOUT,
    sdk: bool | None = None,
) -> VerifyReport:
    """Run `image` hardened and check the runtime contract, the imports and the snippets.

    `distributions`: import every top-level module these installed distributions provide.
    `sdk`: run the upstream SDK's round trip too; None runs it when the SDK is installed, True
    fails the report when it is not, False leaves it out.
    """
    own_client = client is None
    client = client or engine_client()
    if client is None:
        raise UserError("Docker engine not reachable: verify runs the image on it")
    report = VerifyReport(image)
    try:
        found = local_image(image, client)
        report.checks.append(image_user_check(found.attrs.get("Config", {}).get("User") or ""))
        with hardened(client, image, startup_timeout) as running:
            report.checks.append(Check("health", True, running.health))
            report.checks += served_checks(running.sandbox, modules, checks, distributions, sdk)
            report.checks.append(run_check("still-serving", running.still_serving))
    except CheckFailed as failure:
        report.checks.append(Check("health", False, str(failure)))
    finally:
        if own_client:
            client.close()
    return report


def served_checks(
    sandbox: Sandbox,
    modules: Sequence[str],
    snippets: Sequence[str],
    distributions: Sequence[str],
    sdk: bool | None,
) -> list[Check]:
    """Everything checked through a serving image's port, in report order."""
    done = [run_check(name, partial(check, sandbox)) for name, check in contract_checks()]
    if sdk is not False:
        done += sdk_checks(sandbox, required=bool(sdk))
    wanted = list(dict.fromkeys(modules))
    if distributions:
        try:
            derived, problems = modules_of(sandbox, distributions)
        except (ContractViolation, OSError, http.client.HTTPException) as error:
            derived, problems = [], [Check("requirements", False, f"cannot map: {error}")]
        done += problems
        wanted += [module for module in derived if module not in wanted]
    done += [run_check(f"import {m}", partial(check_import, sandbox, m)) for m in wanted]
    done += [
        run_check(f"check {number}", partial(check_snippet, sandbox, snippet))
        for number, snippet in enumerate(snippets, start=1)
    ]
    return done
