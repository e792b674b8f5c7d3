"""The commands of a run spread over CI runners: `part` and `merge` (builder.cli.runners.parts)."""
