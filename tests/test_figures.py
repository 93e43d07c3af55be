"""Each figure's recipe: nothing is shown for a figure the sweep cannot fill."""

from __future__ import annotations

import pandas as pd

from mtplab.report import figures


def test_a_figure_the_sweep_cannot_fill_shows_nothing(capsys):
    peer_only = pd.DataFrame(
        [{"engine": "ort-genai", "drafter": "mtp", "k": 2, "alpha": 0.8, "policy": "sibling-pinned",
          "commit": "select", "schedule": "decode-verify"}]
    )
    for recipe in (
        figures.speedup_vs_alpha,
        figures.tokens_per_s_vs_alpha,
        figures.acceptance,
        figures.per_position,
        figures.slot_counters,
        figures.time_split,
        figures.memory,
    ):
        assert recipe(peer_only) is None, recipe.__name__
    assert figures.counters_table(peer_only) is None
    assert capsys.readouterr().out == ""
