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
        figures.head_by_k,
        figures.speedup_vs_alpha,
        figures.every_point,
        figures.tokens_per_s_vs_alpha,
        figures.acceptance,
        figures.per_position,
        figures.slot_counters,
        figures.time_split,
        figures.memory,
        figures.temperature,
        figures.sampled_acceptance,
    ):
        assert recipe(peer_only) is None, recipe.__name__
    assert figures.counters_table(peer_only) is None
    assert capsys.readouterr().out == ""


def test_acceptance_and_speedup_against_temperature_draw_a_line_per_k_and_engine(capsys):
    rows = [{"engine": engine, "drafter": "mtp", "k": k, "temperature": t, "draft_acceptance": 0.8 - 0.3 * t,
             "speedup": 1.5 - 0.2 * t, "speedup_ci": [1.4 - 0.2 * t, 1.6 - 0.2 * t], "policy": "sibling-pinned",
             "commit": "select", "schedule": "fused", "alpha": 0.8}
            for engine in ("mtplab", "ort-genai") for k in (1, 3) for t in (0.0, 0.7, 1.0)]
    fig = figures.temperature(pd.DataFrame(rows))
    assert "Markdown" in capsys.readouterr().out  # its caption
    acceptance, speedup = fig.axes[:2]
    assert speedup.get_title() == "Speedup against temperature"
    assert len(acceptance.get_lines()) == 4  # k 1 and 3, mtplab and the peer
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["k=1", "k=3", "k=1 onnxruntime-genai", "k=3 onnxruntime-genai"]
    one_temperature = pd.DataFrame(rows).assign(temperature=0.0)
    assert figures.temperature(one_temperature) is None  # nothing to draw against


SETTING = {"policy": "sibling-pinned", "commit": "select", "schedule": "fused"}


def test_expected_against_measured_acceptance_draws_a_point_per_sampled_row(capsys):
    rows = pd.DataFrame([
        {"engine": "mtplab", "drafter": d, "k": 3, "temperature": t, "alpha": 0.5, **SETTING,
         "theory.sampled_acceptance.expected": e, "theory.sampled_acceptance.measured": e + 0.01,
         "theory.sampled_acceptance.judged": 200}
        for d, e in (("oracle", 0.5), ("mtp", 0.1)) for t in (0.7, 1.0)
    ] + [{"engine": "mtplab", "drafter": "oracle", "k": 3, "temperature": 0.0, "alpha": 0.5, **SETTING}])  # greedy: not drawn
    fig = figures.sampled_acceptance(rows)
    assert "Markdown" in capsys.readouterr().out
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["MTP head, T=0.7", "MTP head, T=1", "oracle mixture, T=0.7", "oracle mixture, T=1"]
    assert figures.sampled_acceptance(rows[rows.temperature == 0]) is None


def test_the_heads_speedup_by_k_draws_a_line_per_schedule_labelled_with_its_acceptance(capsys):
    rows = [{"engine": "mtplab", "drafter": "mtp", "k": k, "temperature": 0.0, "alpha": 0.8, "speedup": 0.5 + 0.1 * k,
             "speedup_ci": [0.45 + 0.1 * k, 0.55 + 0.1 * k], "draft_acceptance": 1.0 - 0.05 * k, **SETTING,
             "schedule": schedule} for schedule in ("decode-verify", "fused") for k in (1, 2, 3)]
    fig = figures.head_by_k(pd.DataFrame(rows))
    assert "Markdown" in capsys.readouterr().out  # its caption
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["decode-verify", "fused"]
    assert sorted(t.get_text() for t in ax.texts if t.get_text().endswith("%")) == sorted(["95%", "90%", "85%"] * 2)
    assert figures.head_by_k(pd.DataFrame(rows).assign(k=3)) is None  # one k: nothing to draw against


def test_every_point_draws_a_row_per_timed_point_named_by_what_varies(capsys):
    rows = [{"engine": "mtplab", "drafter": "oracle", "k": k, "alpha": a, "policy": "sibling-pinned", "commit": "select",
             "schedule": "fused", "speedup": s, "speedup_ci": [s - 0.05, s + 0.05], "stable": s > 1}
            for k, a, s in ((1, 0.5, 0.9), (3, 0.5, 1.2), (3, 0.9, 1.6))]
    rows.append(rows[0] | {"k": 2, "speedup": float("nan"), "speedup_ci": [None, None]})  # a failed point: not drawn
    fig = figures.every_point(pd.DataFrame(rows))
    assert "Markdown" in capsys.readouterr().out  # its caption
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names == ["k=1, alpha=0.5", "k=3, alpha=0.5", "k=3, alpha=0.9"]  # slowest at the bottom, fastest on top
    assert figures.every_point(pd.DataFrame(rows[:1] + rows[3:])) is None  # one timed point: no figure
