"""The greedy baseline's draw from point to point: a smooth drift is not a draw, a scatter beyond what the rounds'
noise puts into a point is, and the efficiency that follows it is fitted and said with its sign and CI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from mtplab.report import baseline, findings, quality

Z = np.array([-2.0, -1.0, 0.0, 1.0, 2.0]) / math.sqrt(2.5)  # five rounds whose log spread has a sample sd of exactly 1


def _points(greedy, efficiency=None, rounds_sd: float = 0.01, **fields) -> pd.DataFrame:
    """mtplab batch-1 greedy points of one greedy, measured a minute apart in this order, each with five rounds whose
    greedy spreads by rounds_sd in log around it (None: no round samples) and whose speedup is 1.4 every round."""
    efficiency = [float("nan")] * len(greedy) if efficiency is None else efficiency
    rows = []
    for i, (g, e) in enumerate(zip(greedy, efficiency)):
        rounds = [] if rounds_sd is None else [{"greedy_tokens_per_s": float(g * math.exp(rounds_sd * z)),
                                                "speedup": 1.4} for z in Z]
        rows.append({"engine": "mtplab", "status": "ok", "batch": 1, "temperature": 0.0, "model_name": "small",
                     "int4": False, "backend": "cpu", "threads": 2, "tokens": 48, "prompt_len": 8,
                     "policy": "sibling-pinned", "commit": "select", "validate": True, "greedy_tokens_per_s": float(g),
                     "efficiency": e, "speedup": 1.4, "round_samples": json.dumps(rounds),
                     "extra": json.dumps({"greedy_baseline": "paired rounds"}),
                     "env": json.dumps({"measured_at": 1000.0 + 60 * i})} | fields)
    return pd.DataFrame(rows)


def _draw(df: pd.DataFrame) -> dict:
    (_, part), = baseline.groups(df)
    return baseline.draw(part)


def test_the_scatter_is_a_95_percent_half_width_of_independent_draws():
    rng = np.random.default_rng(0)
    d = _draw(_points(95 * np.exp(0.05 * rng.standard_normal(400))))
    assert d["points"] == 400
    assert d["scatter"] == pytest.approx(math.expm1(1.96 * 0.05), rel=0.12)


def test_a_smooth_drift_is_no_scatter_and_no_draw():
    t = np.arange(24)
    d = _draw(_points(80 + 20 * np.sin(t / 23 * np.pi / 2)))  # 25% over the sweep
    assert d["scatter"] < 0.01 and not d["drawn"]
    assert baseline.finding(_points(80 + 20 * np.sin(t / 23 * np.pi / 2))) == []


def test_the_noise_is_what_the_rounds_spread_puts_into_a_points_median():
    # the median point's variance, over the median of chi-square(4) / 4 (Wilson-Hilferty), then pi / 2n of it
    sigma = 0.03 / (1 - 2 / 36) ** 1.5 * math.sqrt(math.pi / 10)
    d = _draw(_points([95.0] * 12, rounds_sd=0.03))
    assert d["noise"] == pytest.approx(math.expm1(1.96 * sigma))
    assert math.isnan(_draw(_points([95.0] * 12, rounds_sd=None))["noise"])
    slow = _points([95.0] * 12, rounds_sd=0.03)  # one round 25% slow at two points: the median point's spread stays
    rounds = json.loads(slow.round_samples[0])
    rounds[2]["greedy_tokens_per_s"] *= 0.75
    slow.loc[[0, 5], "round_samples"] = json.dumps(rounds)
    assert _draw(slow)["noise"] == pytest.approx(d["noise"])


@pytest.mark.parametrize("times, drawn", [(1.5, False), (3.0, True)])
def test_a_point_draws_from_twice_the_noise(times, drawn):
    noise_sigma = 0.03 * math.sqrt(math.pi / 10)
    a = times * noise_sigma / (4 / (math.sqrt(6) * 0.6745))  # alternating +-a: every second difference is 4a
    df = _points(95 * np.exp(a * np.array([1, -1] * 6)), rounds_sd=0.03)
    assert _draw(df)["drawn"] is drawn
    assert bool(baseline.finding(df)) is drawn


def test_points_are_taken_in_the_order_they_were_measured():
    t = np.arange(16)
    df = _points(80 + 20 * np.sin(t / 15 * np.pi / 2))
    assert _draw(df.sample(frac=1.0, random_state=0))["scatter"] < 0.01  # the table's order is not the measured one
    iso = df.assign(env=[json.dumps({"measured_at": f"2026-12-05T16:{10 + i:02d}:00Z"}) for i in range(16)])
    assert _draw(iso.sample(frac=1.0, random_state=1))["scatter"] < 0.01  # times as ISO text


def test_only_points_of_one_greedy_are_grouped():
    base = _points([85, 105] * 6)
    others = [
        _points([60, 61] * 6, threads=1),  # another greedy: each its own group
        _points([50, 51] * 6, prompt_len=512),
        _points([40, 41] * 6, policy="shared-max"),
        _points([30] * 12, temperature=0.7),  # a sampled baseline: no greedy
        _points([10] * 12, engine="ort-genai"),  # the peer's rows
        _points([20] * 12, batch=4),
        _points([1] * 12, status="failed"),
        _points([5] * 12, extra=json.dumps({"greedy_baseline": "paired rounds; the Primary slot ran eager in some"})),
        _points([7] * 12, env=""),  # no time: no order
        _points([9] * 12, greedy_tokens_per_s=float("inf")),
    ]
    parts = baseline.groups(pd.concat([base, *others], ignore_index=True))
    keys = sorted((k["threads"], k["prompt_len"], k["policy"]) for k, _ in parts)
    assert keys == [(1, 8, "sibling-pinned"), (2, 8, "shared-max"), (2, 8, "sibling-pinned"), (2, 512, "sibling-pinned")]
    assert all(len(p) == 12 for _, p in parts)
    assert baseline.groups(pd.DataFrame()) == []


def test_the_efficiency_that_follows_greedy_is_fitted_and_said_with_its_sign():
    rng = np.random.default_rng(0)
    greedy = 95 * np.exp(0.08 * rng.standard_normal(30))
    falling = 0.95 * (greedy / 95) ** -0.7 * np.exp(0.005 * rng.standard_normal(30))
    d = _draw(_points(greedy, falling))
    low, high = d["slope_ci"]
    assert d["slope"] == pytest.approx(-0.7, abs=0.05) and low < -0.7 < high < 0 and d["r"] < -0.95
    centre = np.exp(np.median(np.log(greedy)))
    assert d["adjusted"][1] == pytest.approx(0.95 * (centre / 95) ** -0.7, rel=0.01)
    assert d["with_efficiency"] == 30
    (text,) = baseline.finding(_points(greedy, falling))
    assert "about 7% lower" in text and "Compare speedups across points" in text
    rising = 0.95 * (greedy / 95) ** 0.5
    (text,) = baseline.finding(_points(greedy, rising))
    assert "about 5% higher" in text
    flat = 0.95 * np.exp(0.05 * rng.standard_normal(30))  # no relation: the slope's CI holds 0
    (text,) = baseline.finding(_points(greedy, flat))
    assert "efficiency follows" not in text and text.endswith("shares it.")
    assert baseline.efficiency_against_greedy(_points(greedy, falling)) is not None


def test_what_is_missing_is_said_and_nothing_is_printed_as_nan():
    few = _points([85, 105] * 4)  # under MIN_POINTS
    assert _draw(few) is None and baseline.quality_lines(few) == [] and baseline.finding(few) == []
    bare = _points([85, 105] * 6, rounds_sd=None)  # no round samples: no noise to set the scatter beside
    (line,) = baseline.quality_lines(bare)
    assert "no round samples" in line and "nan" not in line.lower()
    assert baseline.finding(bare) == [] and baseline.efficiency_against_greedy(bare) is None
    (line,) = baseline.quality_lines(_points([60, 70] * 6, threads=1))
    assert "(`small`, 1 thread, 48 tokens, sibling-pinned/select)" in line


def test_the_report_carries_the_draw_in_its_findings_and_its_quality_view():
    df = _points([85, 105] * 6, speedup=1.4, speedup_ci=json.dumps([1.35, 1.45]), stable=True)
    texts = findings.stability_findings(df)
    assert len(texts) == 2 and texts[1].startswith("- **Points differ by more than their rounds say**")
    assert "- Greedy from point to point" in quality.quality_markdown(df.assign(point_id=[f"p{i}" for i in range(12)]), {}, {})


def test_the_slope_is_fitted_on_disjoint_rounds_so_round_noise_does_not_tilt_it():
    """A point's efficiency divides by its greedy rounds: from the same rounds, noise alone would tilt the fit."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(30):  # no draw: every point's greedy and speculative rounds only noisy, independently
        greedy = 95 * np.exp(0.04 * rng.standard_normal(5))
        speedup = 140 * np.exp(0.04 * rng.standard_normal(5)) / greedy
        rows.append(_points([float(np.median(greedy))], [float(np.median(speedup)) / 1.47])
                    .assign(speedup=float(np.median(speedup)), env=json.dumps({"measured_at": 1000.0 + 60 * i}),
                            round_samples=json.dumps([{"greedy_tokens_per_s": float(g), "speedup": float(v)}
                                                      for g, v in zip(greedy, speedup)])))
    df = pd.concat(rows, ignore_index=True)
    naive = np.polyfit(np.log(df.greedy_tokens_per_s), np.log(df.efficiency), 1)[0]
    d = _draw(df)
    assert naive < -0.5  # the same rounds on both axes: a slope from noise alone
    assert d["slope_ci"][0] <= 0 <= d["slope_ci"][1] and abs(d["slope"]) < 0.4


def test_a_point_without_a_key_or_with_tied_times_joins_no_group_and_nothing_reads_nan():
    for odd in (_points([85, 105] * 6, env=""), _points([85, 105] * 6, threads=float("nan")),
                _points([85, 105] * 6, env=json.dumps({"measured_at": 5.0}))):  # every time the same: no order
        assert baseline.groups(odd) == [] and baseline.quality_lines(odd) == [] and baseline.finding(odd) == []
    numeric_text = _points([85, 105] * 6).assign(env=[json.dumps({"measured_at": str(1000 + 60 * i)}) for i in range(12)])
    assert len(baseline.groups(numeric_text)) == 1
    negative_control = pd.concat([_points([85, 105] * 6), _points([40, 41] * 6, validate=False)], ignore_index=True)
    assert len(baseline.groups(negative_control)) == 2

