"""What `rebuild` with several --config (or --shard, or --output-json) prints: the fleet's
table and its verdict; which configs a --shard job takes, and the table written as JSON
(builder.orchestration.shard does the slicing and the writing).

Apart from builder/cli/app.py so that module stays within its size; the fleet itself is
builder.orchestration.fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from builder.cli.shared import echo
from builder.errors import UserError

if TYPE_CHECKING:
    from builder.orchestration.fleet import Fleet, FleetResult
    from builder.orchestration.shard import Shard


@dataclass(frozen=True)
class FleetOutput:
    """Which configs this job rebuilds, as a fleet (a table) or not, and where its JSON goes."""

    configs: tuple[Path, ...]
    as_fleet: bool  # several configs, a shard, or a JSON table asked for: the table
    shard: Shard | None = None
    json_path: Path | None = None
    given: int = 0  # how many configs the command line named, the slice's whole


def fleet_output(
    configs: tuple[Path, ...], shard_text: str | None, json_path: Path | None, check: bool
) -> FleetOutput:
    """--shard K/N takes this job's slice (builder.orchestration.shard); --check stays one job.
    A JSON table's path that is a symlink is refused now, not after the fleet (builder.files)."""
    from builder.files import refuse_link

    if shard_text is None:
        if json_path is not None:
            refuse_link(json_path)
        return FleetOutput(configs, len(configs) > 1 or json_path is not None, None, json_path)
    from builder.orchestration.shard import parse_shard, shard_configs

    if check:
        raise click.UsageError("--shard: rebuild --check runs as one job (it builds nothing)")
    shard = parse_shard(shard_text)  # a bad value is its one error line
    mine = tuple(shard_configs(configs, shard))
    refuse_link(json_path or shard.default_json)
    return FleetOutput(mine, True, shard, json_path or shard.default_json, len(configs))


def show_fleet(result: FleetResult, fleet: Fleet, output: FleetOutput | None = None) -> bool:
    """Print the table (and write it as JSON when asked); a failed template is the one error
    line naming every failed one.

    True when --check found templates to rebuild (they are named): the CLI exits 3 then.
    """
    done = "checked against" if fleet.check_only else "rebuilt onto"
    shard = output.shard if output is not None else None
    of = f" (shard {shard} of {output.given} configs)" if output and shard else ""
    echo(f"\nfleet: {len(result.rows)} templates {done} {fleet.new_version}{of}")
    echo(result.table())
    if output is not None and output.json_path is not None:
        from builder.orchestration.shard import table_document, write_table

        write_table(output.json_path, table_document(result, fleet, shard))
        echo(f"table written to {output.json_path}")
    if result.failed:
        raise UserError(
            f"rebuild failed for {len(result.failed)} of {len(result.rows)} templates:"
            f" {', '.join(result.failed)}"
        )
    if fleet.check_only and result.needing_rebuild:
        echo(f"rebuild needed: {', '.join(result.needing_rebuild)}")
        return True
    return False
