"""`python -m alight` runs the CLI."""

from alight.cli.app import main

main()
