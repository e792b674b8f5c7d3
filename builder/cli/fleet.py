"""What `rebuild` with several --config prints: the fleet's table and its verdict. Prints only.

Apart from builder/cli/app.py so that module stays within its size; the fleet itself is
builder.orchestration.fleet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from builder.errors import UserError

if TYPE_CHECKING:
    from builder.orchestration.fleet import Fleet, FleetResult


def show_fleet(result: FleetResult, fleet: Fleet) -> bool:
    """Print the table; a failed template is the one error line naming every failed one.

    True when --check found templates to rebuild (they are named): the CLI exits 3 then.
    """
    done = "checked against" if fleet.check_only else "rebuilt onto"
    click.echo(f"\nfleet: {len(result.rows)} templates {done} {fleet.new_version}")
    click.echo(result.table())
    if result.failed:
        raise UserError(
            f"rebuild failed for {len(result.failed)} of {len(result.rows)} templates:"
            f" {', '.join(result.failed)}"
        )
    if fleet.check_only and result.needing_rebuild:
        click.echo(f"rebuild needed: {', '.join(result.needing_rebuild)}")
        return True
    return False
