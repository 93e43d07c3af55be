"""Where mtplab keeps things: the cache (built models, calibrations, the notebook kernel) and the results root."""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding the package (a checkout's root)


def cache_root() -> Path:
    """$MTPLAB_CACHE, else ~/.cache/mtplab."""
    return Path(os.environ.get("MTPLAB_CACHE", Path.home() / ".cache" / "mtplab"))


def results_root() -> Path:
    """$MTPLAB_RESULTS, else results/ beside the package (the checkout's), whatever the current directory."""
    env = os.environ.get("MTPLAB_RESULTS")
    return Path(env).resolve() if env else CHECKOUT / "results"
