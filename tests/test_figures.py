"""Each figure's recipe: nothing is shown for a figure the sweep cannot fill."""

from __future__ import annotations

import pandas as pd

from mtplab.report import drawable, figures


def test_a_figure_the_sweep_cannot_fill_says_what_it_needs_and_the_report_leaves_it_out(monkeypatch, capsys):
    peer_only = pd.DataFrame(
        [{"engine": "ort-genai", "drafter": "mtp", "k": 2, "alpha": 0.8, "policy": "sibling-pinned",
          "commit": "select", "schedule": "decode-verify"}]
    )
    said: list[str] = []
    monkeypatch.setattr(drawable, "markdown", said.append)
    recipes = (figures.head_by_k, figures.speedup_vs_alpha, figures.every_point, figures.tokens_per_s_vs_alpha,
               figures.acceptance, figures.per_position, figures.slot_counters, figures.time_split, figures.memory,
               figures.temperature, figures.sampled_acceptance, figures.by_context, figures.by_kind,
               figures.head_prediction)
    for recipe in recipes:
        assert recipe(peer_only) is None, recipe.__name__
    assert figures.counters_table(peer_only) is None
    assert len(said) == len(recipes) + 1 and all(t.startswith("*Not drawn (") for t in said)
    assert "*Not drawn (alpha grid): it needs oracle points at two alphas or more (a grid over alpha), and these 1 " \
           "point hold none.*" in said
    said.clear()
    for recipe in recipes:  # the report's way: what it cannot fill, it leaves out without a word
        figures.show(recipe, peer_only)
    assert said == [] and capsys.readouterr().out == ""
    assert set(drawable.NEEDS) >= set(figures.selection.figures_for(peer_only))  # every figure's need in words
    said.clear()  # a batch-1 figure called on batch points draws none of them, and says where they go
    batch_points = pd.DataFrame([{"engine": "mtplab", "drafter": "oracle", "k": 2, "alpha": a, "batch": 4,
                                  "policy": "sibling-pinned", "commit": "select", "schedule": "fused",
                                  "speedup": 0.9, "speedup_ci": [0.8, 1.0]} for a in (0.6, 0.9)])
    assert figures.speedup_vs_alpha(batch_points) is None
    assert said == ["*Not drawn (alpha grid): it needs oracle points at two alphas or more (a grid over alpha), and "
                    "these 0 points hold none (2 batch points left out: the batch section draws them).*"]


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


HEAD = {"engine": "mtplab", "drafter": "mtp", "temperature": 0.0, "alpha": 0.8, **SETTING}


def test_acceptance_by_context_draws_a_line_per_position_pooled_over_prompts_with_the_training_rows_marked(capsys):
    from mtplab.model.folders import SHIPPED

    model = str((SHIPPED / "pycode").resolve())  # its card: trained on 256-token rows
    rows = pd.DataFrame([{**HEAD, "model": model, "k": 2, "prompts": "context", "context": c, "seed": s,
                          "accepted_per_step": [2, 1, 0, 2] if c < 256 else [0, 1, 0, 0]}
                         for c in (64, 256, 512) for s in range(3)])
    fig = figures.by_context(rows)
    assert "Markdown" in capsys.readouterr().out
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["position 1", "position 2"]
    first = ax.get_lines()[0].get_ydata()  # position 1: 3 of 4 steps kept a draft below 256, 1 of 4 from it
    assert list(first) == [0.75, 0.25, 0.25]
    assert any("trained on 256-token rows" in t.get_text() for t in ax.texts)
    assert figures.by_context(rows.assign(context=512)) is None  # one length: nothing to draw against


def test_acceptance_by_kind_draws_a_line_per_prompt_set_and_leaves_context_cuts_out(capsys):
    rows = pd.DataFrame([{**HEAD, "k": 2, "prompts": kind, "context": 0, "accepted_per_step": steps}
                         for kind, steps in (("code", [2, 2, 1, 0]), ("data", [2, 2, 2, 2]))]
                        + [{**HEAD, "k": 2, "prompts": "context", "context": 64, "accepted_per_step": [0]}])
    fig = figures.by_kind(rows)
    assert "Markdown" in capsys.readouterr().out
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["code (4 steps)", "data (4 steps)"]
    assert list(ax.get_lines()[0].get_ydata()) == [0.75, 0.5]


def test_the_heads_speedup_against_the_cost_model_draws_a_marker_per_commit_and_k(capsys):
    rows = pd.DataFrame([{**HEAD, "k": k, "commit": commit, "speedup": 0.8, "speedup_ci": [0.7, 0.9],
                          "predicted.speedup": 0.9 + 0.1 * k} for k in (1, 2) for commit in ("readvance-m1", "select")])
    fig = figures.head_prediction(rows)
    assert "Markdown" in capsys.readouterr().out
    legends = [c for c in fig.axes[0].get_children() if c.__class__.__name__ == "Legend"]
    assert [[t.get_text() for t in lg.get_texts()] for lg in legends] == [["readvance-m1", "select"], ["k=1", "k=2"]]
    assert len(fig.axes[0].containers) == 4  # a marker per commit and k
    assert figures.head_prediction(rows.assign(**{"predicted.speedup": float("nan")})) is None


def test_pooled_acceptance_resamples_prompts_and_gives_no_interval_for_one():
    import numpy as np

    from mtplab.report.plots_head import pooled_by_prompt, position_counts, wilson

    assert list(position_counts([3, 0, 1, 2], 3)) == [3, 2, 1, 4]
    counts = np.array([position_counts([1, 1], 1), position_counts([0, 0], 1), position_counts([1, 0], 1)])
    est, ci = pooled_by_prompt(counts)
    assert est[0] == 0.5 and ci[0, 0] < 0.5 < ci[1, 0] and ci[0, 0] >= 0 and ci[1, 0] <= 1
    assert np.isnan(pooled_by_prompt(counts[:1])[1]).all()
    lo, hi = wilson(np.array([0.0, 10.0]), np.array([10.0, 10.0]))
    assert lo[0] == 0 and 0 < hi[0] < 0.35 and 0.65 < lo[1] < 1 and hi[1] == 1


def test_the_temperature_figure_keeps_one_commit_where_a_sweep_ran_several(capsys):
    rows = [{"engine": "mtplab", "drafter": "mtp", "k": 2, "temperature": t, "draft_acceptance": 0.5, "accepted": 50,
             "drafted": 100, "speedup": 1.0, "speedup_ci": [0.9, 1.1], "policy": "sibling-pinned", "commit": c,
             "schedule": "fused", "alpha": 0.8} for t in (0.0, 0.7) for c in ("readvance-m1", "select")]
    fig = figures.temperature(pd.DataFrame(rows))
    capsys.readouterr()
    acceptance = fig.axes[0]
    assert len(acceptance.containers) == 1 and "commit select" in acceptance.get_title()
    assert acceptance.containers[0].has_yerr  # the drafts judged give it a Wilson interval


def test_choosing_k_draws_each_policy_against_the_best_fixed_k_and_the_share_of_steps_at_each_k(capsys):
    base = {**HEAD, "k": 3, "prompts": "code", "speedup_ci": [0.7, 0.9], "tokens_per_s": 100.0, "k_confidence": 0.4,
            "accepted_per_step": "[1, 2, 0, 1]", "k_per_step": "[]"}
    rows = pd.DataFrame([base | {"k": k, "k_policy": "fixed", "speedup": 0.5 + 0.1 * k} for k in (1, 2, 3)]
                        + [base | {"k_policy": "probe", "speedup": 0.75, "k_per_step": "[2, 2, 3, 1]"}])
    fig = figures.k_policies(rows)
    assert "Markdown" in capsys.readouterr().out
    from mtplab.report.plots_k import policy_table

    table = policy_table(rows)
    assert set(table["best fixed K (hindsight)"]) == {"K=3: 0.80x"} and list(table["mean K"]) == ["1.00", "2.00",
                                                                                                  "3.00", "2.00"]
    left, right = fig.axes[:2]
    assert [t.get_text() for t in left.get_yticklabels()] == ["fixed K=1", "fixed K=2", "fixed K=3", "probe (K<=3)"]
    shares = [[p.get_width() for p in c] for c in right.containers]  # a stack per K: the probe's 1, 2, 1 of 4 steps
    assert [s[-1] for s in shares] == [0.25, 0.5, 0.25] and [s[0] for s in shares] == [1.0, 0.0, 0.0]
    assert figures.k_policies(rows[rows.k_policy == "fixed"]) is None  # no policy: nothing to choose between
    # two commits: each has its own best fixed K, and its own panel
    both = pd.concat([rows.assign(commit="select"),
                      rows.assign(commit="per-position", speedup=rows.speedup + 0.1)], ignore_index=True)
    table = policy_table(both)
    best = table.groupby("commit")["best fixed K (hindsight)"].unique()
    assert list(best["select"]) == ["K=3: 0.80x"] and list(best["per-position"]) == ["K=3: 0.90x"]
    assert "commit=per-position" in figures.k_policies(both).axes[0].get_title()
