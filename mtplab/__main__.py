"""`python -m mtplab`: the command line."""

from .cli import main

raise SystemExit(main())
