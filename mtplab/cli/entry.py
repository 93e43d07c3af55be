"""The `mtplab` executable (and `python -m mtplab`): the command line, in a process of its own."""

from __future__ import annotations


def console() -> int:
    """The `mtplab` executable's entry point."""
    from mtplab.cli.main import main

    return main(own_process=True)
