"""Which rows each figure, table and finding is computed on."""

from __future__ import annotations

import json

import pandas as pd

from mtplab.report import selection


def _row(**kw) -> dict:
    row = {"engine": "mtplab", "drafter": "oracle", "k": 2, "alpha": 0.8, "policy": "sibling-pinned",
           "commit": "select", "schedule": "decode-verify"}
    return row | kw


def _frame() -> pd.DataFrame:
    rows = [_row(alpha=a) for a in (0.6, 0.7, 0.8)]
    rows += [_row(policy=p, commit=c) for p in ("shared-jit", "sibling") for c in ("select", "readvance-m1")]
    rows += [_row(drafter="mtp", alpha=None, k=3), _row(engine="ort-genai", drafter="mtp", alpha=None, k=3)]
    rows += [_row(k=4, schedule="fused")]
    return pd.DataFrame(rows)


def test_the_alpha_grid_is_the_pair_swept_over_the_most_alphas():
    g = selection.alpha_grid(_frame())
    assert set(g.alpha) == {0.6, 0.7, 0.8} and set(g.policy) == {"sibling-pinned"} and set(g.commit) == {"select"}
    assert selection.alpha_grid(_frame()[lambda d: d.drafter == "mtp"]).empty


def test_the_policy_grid_is_decode_verify_at_the_k_alpha_with_the_most_policies():
    g = selection.policy_grid(_frame())
    assert set(g.policy) == {"sibling-pinned", "shared-jit", "sibling"} and set(g.schedule) == {"decode-verify"}
    assert (g.k == 2).all() and (g.alpha == 0.8).all()


def test_own_head_and_peer_rows():
    df = _frame()
    assert len(selection.own_head(df)) == 1 and (selection.own_head(df).engine == "mtplab").all()
    assert len(selection.peer_rows(df)) == 1
    no_engine = df[df.engine == "mtplab"].drop(columns="engine")
    assert selection.peer_rows(no_engine).empty and len(selection.own_head(no_engine)) == 1
    assert len(selection.own_engine(no_engine)) == len(no_engine)


def test_split_points_are_the_pinned_policy_at_the_k_where_the_most_commit_strategies_ran():
    s = selection.split_points(_frame())
    assert set(s.policy) == {"sibling-pinned"} and set(s.k) == {2} and set(s.schedule) == {"decode-verify"}
    # the demo's shape: three points of one strategy at k=1, all three strategies at k=3 -> k=3
    rows = [_row(k=1, alpha=a) for a in (0.5, 0.7, 0.9)] + [_row(k=3, commit=c) for c in
                                                              ("select", "readvance-m1", "readvance-batched")]
    s = selection.split_points(pd.DataFrame(rows))
    assert set(s.k) == {3} and set(s.commit) == {"select", "readvance-m1", "readvance-batched"}


def test_counters_long_and_peak_memory():
    df = _frame()
    for slot in ("primary", "verify"):
        for c in selection.COUNTERS:
            df[f"slots.{slot}.{c}"] = 1
    df["arena"] = json.dumps({"main": {"bytes_held": 2**20, "peak_bytes": 2**21}, "verify": {"bytes_held": 2**20}})
    long = selection.counters_long(df)
    assert len(long) == 2 * len(selection.policy_grid(df)) and set(long.slot) == {"primary", "verify"}
    assert (selection.peak_arena_mib(df) == 3.0).all()


def test_figures_for_says_what_the_sweep_can_fill():
    show = selection.figures_for(_frame())
    assert show["alpha_grid"] and show["acceptance"] and show["counters"] and show["time_split"] and show["peer"]
    only_peer = selection.figures_for(_frame()[lambda d: d.engine == "ort-genai"])
    assert only_peer["peer"] and not only_peer["alpha_grid"] and not only_peer["counters"]


def test_the_side_by_side_with_the_peer_compares_greedy_decoding_only():
    from mtplab.report import selection

    rows = pd.DataFrame([{"engine": e, "drafter": "mtp", "policy": "sibling-pinned", "k": 2, "temperature": t}
                         for e in ("mtplab", "ort-genai") for t in (0.0, 0.7)])
    assert list(selection.peer_rows(rows).temperature) == [0.0]
    assert list(selection.own_head_beside_peer(rows).temperature) == [0.0]
    older = rows.drop(columns="temperature")  # a sweep from before sampling: every row decodes greedily
    assert len(selection.peer_rows(older)) == 2


def test_the_alpha_figures_and_the_heads_acceptance_take_greedy_decoding_rows_only():
    rows = pd.DataFrame([{"engine": "mtplab", "drafter": d, "policy": "sibling-pinned", "commit": "select", "k": 2,
                          "alpha": 0.5, "temperature": t} for d in ("oracle", "mtp") for t in (0.0, 1.0)])
    assert list(selection.set_acceptance(rows).temperature) == [0.0]  # the oracle's alpha^i law is greedy's
    assert list(selection.own_head(rows).temperature) == [0.0]
    assert len(selection.temperature_rows(rows)) == 2  # the head's rows against temperature take both


def test_failed_points_are_left_out_of_what_was_measured_and_one_round_points_have_no_ci_said_so():
    from mtplab.report import findings

    df = pd.DataFrame([_row(status="ok", speedup=0.9, speedup_ci="[null, null]", stable=False,
                            greedy_tokens_per_s=100.0),
                       _row(status="failed", speedup=float("nan"), speedup_ci=float("nan"), stable=float("nan"),
                            greedy_tokens_per_s=float("nan"))])
    assert list(selection.ran(df).status) == ["ok"]
    (text,) = findings.stability_findings(df)
    assert "0 of 1 mtplab point stable" in text and "no point has a CI (a CI needs at least two paired rounds)" in text
