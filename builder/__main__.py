"""`python -m builder` runs the command line."""

from builder.cli import main

main()
