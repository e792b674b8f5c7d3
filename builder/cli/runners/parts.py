"""`part` and `merge`: one arch per CI runner, then one job to publish (issue 46).

Parse, call builder.orchestration.runners.parts, print. The plan directory is what
`build-sandbox-image … --push REPO --no-build --output PLAN` wrote (docs/scale-out.md).
"""

from __future__ import annotations

from pathlib import Path

import click

from builder.cli.cache import CACHE_MAX_OPTION
from builder.cli.errors import reports_errors
from builder.cli.references import Reference
from builder.cli.shared import (
    APT_AUTH_OPTION,
    APT_CA_OPTION,
    CONTAINER_OPTION,
    ENGINE_OPTION,
    REPORTER,
    TEMPLATE_OPTION,
    apt_secrets,
    note,
)
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.resolve.target import ARCHES

PLAN_ARGUMENT = click.argument(
    "plan_dir", metavar="PLAN", type=click.Path(exists=True, file_okay=False, path_type=Path)
)
PUSH_OPTION = click.option(
    "--push",
    "repository",
    required=True,
    type=Reference("push target", repository=True),
    metavar="REPOSITORY",
    help="The repository every part of the plan is pushed to.",
)
SIGN_OPTION = click.option(
    "--sign-key",
    type=click.Path(path_type=Path),
    help="Sign what is pushed with this cosign key or PKCS#8 P-256 PEM (passphrase:"
    " BSI_SIGN_PASSWORD, else COSIGN_PASSWORD).",
)


@click.command("part")
@PLAN_ARGUMENT
@click.option("--arch", required=True, type=click.Choice(sorted(ARCHES)), help="The arch to build.")
@PUSH_OPTION
@ENGINE_OPTION
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Cache directory.")
@CACHE_MAX_OPTION
@SIGN_OPTION
@APT_CA_OPTION
@APT_AUTH_OPTION
@click.option("--strict", is_flag=True, help="Fail verification on a warning too.")
@reports_errors
def part_command(
    plan_dir: Path,
    arch: str,
    repository: ImageRef,
    engine_urls: tuple[str, ...],
    cache_dir: Path | None,
    cache_max: int | None,
    sign_key: Path | None,
    apt_ca_bundle: Path | None,
    apt_auth: Path | None,
    strict: bool,
) -> None:
    """Build ARCH's image of PLAN, verify it hardened, push it by digest (no tag moves).

    Writes PLAN/parts/ARCH.json for `merge`. Nothing is resolved and no package index is
    asked: the layers are the plan's, checked against it.
    """
    from builder.cache import Cache, default_root
    from builder.cache.bound import bounded_use
    from builder.engines.connection import engine_client
    from builder.engines.per_arch import connect, engine_flags
    from builder.orchestration.commands import signing_key
    from builder.orchestration.runners.document import read_document
    from builder.orchestration.runners.parts import PartJob, part

    key = signing_key(sign_key)
    document = read_document(plan_dir)
    client = engine_client()
    if client is None:
        raise UserError("part: no Docker engine reachable to build on")
    cache = Cache(cache_dir or default_root(), warn=REPORTER.warn)
    secrets = apt_secrets(apt_ca_bundle, apt_auth)
    job = PartJob(plan_dir, arch, repository, key, strict, secrets)
    with connect(engine_flags(engine_urls), client) as engines, bounded_use(cache, cache_max):
        record = part(job, document, engines, cache, REPORTER)
    how = " (emulated)" if record.emulated else ""
    note(f"part {arch}{how}: {record.repository}@{record.digest} ({record.size} bytes)")
    note(f"pushed {record.bytes_pushed} bytes; no tag moved (merge moves it)")
    note(f"recorded in {plan_dir / 'parts' / f'{arch}.json'}")


@click.command("merge")
@PLAN_ARGUMENT
@PUSH_OPTION
@TEMPLATE_OPTION
@CONTAINER_OPTION
@click.option(
    "--state",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Record what was pushed here, as a config's run does (for `rebuild`).",
)
@SIGN_OPTION
@reports_errors
def merge_command(
    plan_dir: Path,
    repository: ImageRef,
    template: Path | None,
    container: str | None,
    state: Path | None,
    sign_key: Path | None,
) -> None:
    """Check every part of PLAN, then write the index, its tag, signatures, template, state.

    Every planned arch must have one part of this plan, verified, whose image REPOSITORY holds;
    otherwise nothing is written.
    """
    from builder.orchestration.commands import signing_key
    from builder.orchestration.runners.document import read_document
    from builder.orchestration.runners.parts import MergeJob, merge
    from builder.publish.template import apply_hint

    key = signing_key(sign_key)
    document = read_document(plan_dir)
    merged = merge(
        MergeJob(plan_dir, repository, template, container, state, key), document, REPORTER
    )
    for record in merged.parts:
        note(f"  {record.arch}: {record.digest}")
    note(f"pushed {merged.written.reference} as {', '.join(merged.written.tags)}")
    if merged.template_change is not None and template is not None:
        change = merged.template_change
        note(f"template {change.template_name}: {change.old_image} -> {change.new_image}")
        note(apply_hint(template))
    if state is not None:
        note(f"state recorded in {state}")
