"""The `mtplab` executable (and `python -m mtplab`): the process started again with its memory on huge pages where
it can be (mtplab.base.memory.reexec, before the command's imports), then the command."""

from __future__ import annotations


def console() -> int:
    """The `mtplab` executable's entry point."""
    from mtplab.base.memory import reexec

    reexec()
    from mtplab.cli.main import main

    return main(own_process=True)
