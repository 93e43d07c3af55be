"""The report's measurement-quality view: each phase of the timed steps against the calibration's price of it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mtplab.report import quality

CALIBRATION = {"tiny": {
    "target": {str(m): 1e-3 * (1 + 0.1 * (m - 1)) for m in range(1, 9)},
    "draft": {str(k): 2e-4 * k + 1e-4 for k in range(1, 8)}, "head": 2e-4, "greedy_token": 1.1e-3,
    "commit": {"select": {str(n): 1e-5 * n for n in range(1, 9)}},
}}


def _point(schedule: str, accepted, split_ms: dict, greedy_ms: float, **fields) -> dict:
    steps = len(accepted) if isinstance(accepted, list) else 2
    return {"engine": "mtplab", "model_name": "tiny", "policy": "sibling-pinned", "commit": "select", "k": 3,
            "schedule": schedule, "batch": 1, "steps": steps,
            "accepted_per_step": json.dumps(accepted) if isinstance(accepted, list) else accepted,
            "time_split": json.dumps({p: v * 1e-3 * steps for p, v in split_ms.items()}),
            "greedy_tokens_per_s": 1e3 / greedy_ms if greedy_ms else 0.0} | fields


AS_PRICED = {"decode": 0.0, "draft": 0.7, "verify": 1.3, "commit": 0.04}  # fused, k=3, every step keeping 3


def test_each_phase_is_its_timed_cost_per_step_over_its_calibrated_price():
    df = pd.DataFrame([
        # decode T(1), the draft phase of 3 (fused's and one head step), T(4) and the commits of 1 and 4 tokens,
        # each at a known multiple
        _point("decode-verify", [0, 3], {"decode": 1.1, "draft": 0.9, "verify": 1.3 * 1.2, "commit": 0.025 * 2},
               greedy_ms=1.1 * 1.05),
        # two fused points: the median of their draft ratios, 1.5 and 2.5
        _point("fused", [3, 3], AS_PRICED | {"draft": 0.7 * 1.5}, greedy_ms=1.1),
        _point("fused", [3, 3], AS_PRICED | {"draft": 0.7 * 2.5}, greedy_ms=1.1),
        _point("fused", [3], AS_PRICED, greedy_ms=1.1, batch=2),  # a batch point: left out
        _point("fused", [3], AS_PRICED, greedy_ms=1.1, k=9),  # beyond the calibration: left out
    ])
    t = quality.phase_table(df, CALIBRATION)
    dv, fused = t.loc[("sibling-pinned", "select", "decode-verify")], t.loc[("sibling-pinned", "select", "fused")]
    assert dv["points"] == 1 and fused["points"] == 2
    assert dv["decode / calibrated"] == pytest.approx(1.1) and dv["draft / calibrated"] == pytest.approx(1.0)
    assert dv["verify / calibrated"] == pytest.approx(1.2) and dv["commit / calibrated"] == pytest.approx(2.0)
    assert dv["greedy / calibrated"] == pytest.approx(1.05)
    assert fused["decode / calibrated"] == "—" and fused["draft / calibrated"] == pytest.approx(2.0)  # no NaN cell
    assert quality.phase_table(df, {}).empty  # no calibration and no prices of their own: nothing to price


def test_a_points_own_prices_come_first_and_odd_rows_are_left_out_not_raised():
    stored = {f"predicted.phases.{p}": v * 1e-3 for p, v in (AS_PRICED | {"verify": 2.6}).items()}
    df = pd.DataFrame([
        # the prices its efficiency used (a Verify slot at its fallback cost): the verify ran at them
        _point("fused", [3, 3], AS_PRICED | {"verify": 2.6}, greedy_ms=1.1, **stored,
               **{"predicted.greedy_seconds_per_token": 1.1e-3}),
        _point("fused", np.nan, AS_PRICED, greedy_ms=1.1, policy="shared-jit"),  # no accepted counts: no price
        _point("fused", [3, 3], AS_PRICED, greedy_ms=0, policy="sibling"),  # no greedy rate: its ratio NaN
        _point("not-registered", [3, 3], AS_PRICED, greedy_ms=1.1, policy="shared-max"),
    ])
    t = quality.phase_table(df, CALIBRATION)
    assert list(t.index.get_level_values("policy")) == ["sibling", "sibling-pinned"]
    own = t.loc[("sibling-pinned", "select", "fused")]
    assert own["verify / calibrated"] == pytest.approx(1.0) and own["greedy / calibrated"] == pytest.approx(1.0)
    assert t.loc[("sibling", "select", "fused")]["greedy / calibrated"] == "—"
    assert quality.phase_table(df.drop(columns="engine"), CALIBRATION).empty
