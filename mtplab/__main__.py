"""`python -m mtplab`: the command line."""

from mtplab.cli.main import console

raise SystemExit(console())
