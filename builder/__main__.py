"""`python -m builder` runs the command line."""

from builder.cli.app import main

main()
