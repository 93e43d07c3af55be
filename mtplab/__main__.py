"""`python -m mtplab`: the command line."""

from mtplab.cli.entry import console

raise SystemExit(console())
