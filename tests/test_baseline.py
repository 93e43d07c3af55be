"""The greedy baseline's draw from point to point: a slow drift is not a draw, a scatter beyond the points' own CIs
is, and the efficiency that follows it is measured and said."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from mtplab.report import baseline, findings


def _points(greedy, efficiency=None, within: float = 0.01, **fields) -> pd.DataFrame:
    """mtplab batch-1 points of one greedy, measured a minute apart in this order."""
    efficiency = [float("nan")] * len(greedy) if efficiency is None else efficiency
    return pd.DataFrame([{"engine": "mtplab", "status": "ok", "batch": 1, "model_name": "small", "threads": 2,
                          "tokens": 48, "greedy_tokens_per_s": g, "efficiency": e,
                          "greedy_tokens_per_s_ci": json.dumps([g * (1 - within), g * (1 + within)]),
                          "env": json.dumps({"measured_at": 1000.0 + 60 * i})} | fields
                         for i, (g, e) in enumerate(zip(greedy, efficiency))])


def test_a_slow_drift_is_no_scatter_and_alternating_draws_are():
    t = np.arange(12)
    drift = _points(80 + 20 * np.sin(t / 11 * np.pi / 2))  # 25% over the sweep, a smooth step from point to point
    (key, part), = baseline.groups(drift)
    assert key == ("small", 2, 48)
    d = baseline.draw(part)
    assert d["points"] == 12 and d["scatter"] < 0.02 and d["within"] == pytest.approx(0.01)
    draws = _points([85, 105] * 6)  # the same mean, every point 20% off the one before
    assert baseline.draw(baseline.groups(draws)[0][1])["scatter"] > 0.2
    assert baseline.finding(drift) == []  # a drift is no draw: the paired rounds cancel it
    (text,) = baseline.finding(draws)
    assert "Points differ by more than their CIs" in text and "±1.0%" in text


def test_points_are_taken_in_the_order_they_were_measured_not_the_tables():
    shuffled = _points(np.linspace(80, 100, 12)).sample(frac=1.0, random_state=0)
    assert baseline.draw(baseline.groups(shuffled)[0][1])["scatter"] < 0.02


def test_the_efficiency_that_follows_greedy_is_measured_and_said():
    rng = np.random.default_rng(0)
    greedy = rng.permutation(np.linspace(85, 105, 20))
    efficiency = 0.95 * (greedy / 95) ** -0.7  # a 10% faster greedy, a 7% lower speedup
    df = _points(greedy, efficiency)
    d = baseline.draw(baseline.groups(df)[0][1])
    assert d["slope"] == pytest.approx(-0.7) and d["r"] == pytest.approx(-1.0)
    centre = np.exp(np.median(np.log(greedy)))  # every efficiency at the median greedy: one value
    assert d["adjusted"] == pytest.approx([0.95 * (centre / 95) ** -0.7] * 3, rel=1e-9)
    (text,) = baseline.finding(df)
    assert "r = -1.00, slope -0.70" in text and "about 7% lower" in text
    (line,) = baseline.quality_lines(df)
    assert "over 20 points" in line and "diagnosis only" in line
    assert baseline.efficiency_against_greedy(df) is not None


def test_groups_keep_one_greedy_each_and_leave_out_what_is_not_one():
    a = _points([85, 105] * 3)
    b = _points([60, 61] * 3, threads=1)  # another thread count: another greedy
    other = _points([10] * 6, engine="ort-genai")  # the peer's rows
    batch = _points([50] * 6, batch=4)
    failed = _points([1] * 6, status="failed")
    parts = baseline.groups(pd.concat([a, b, other, batch, failed], ignore_index=True))
    assert [key for key, _ in parts] == [("small", 1, 48), ("small", 2, 48)]
    assert all(len(p) == 6 for _, p in parts)


def test_too_few_points_or_no_efficiency_say_nothing():
    few = _points([85, 105, 85, 105, 85])
    assert baseline.draw(baseline.groups(few)[0][1]) is None
    assert baseline.finding(few) == [] and baseline.quality_lines(few) == []
    plain = _points([85, 105] * 4)  # a scatter, no efficiency (no calibration)
    d = baseline.draw(baseline.groups(plain)[0][1])
    assert math.isnan(d["r"]) and baseline.efficiency_against_greedy(plain) is None
    (text,) = baseline.finding(plain)
    assert "efficiency follows" not in text
    assert baseline.groups(pd.DataFrame()) == []


def test_the_sweeps_trust_finding_carries_the_draw():
    df = _points([85, 105] * 4, speedup=1.4, speedup_ci=json.dumps([1.35, 1.45]), stable=True)
    texts = findings.stability_findings(df)
    assert len(texts) == 2 and texts[1].startswith("- **Points differ by more than their CIs**")
