"""The report's measurement-quality view: each phase of the timed steps against the calibration's price of it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mtplab.report import quality

CALIBRATION = {"tiny": {
    "target": {str(m): 1e-3 * (1 + 0.1 * (m - 1)) for m in range(1, 9)},
    "draft": {str(k): 2e-4 * k for k in range(1, 8)}, "head": 2e-4, "greedy_token": 1.1e-3,
    "commit": {"select": {str(n): 1e-5 * n for n in range(1, 9)}},
}}


def _point(schedule: str, accepted: list[int], split_ms: dict, greedy_ms: float, **fields) -> dict:
    steps = len(accepted)
    return {"engine": "mtplab", "model_name": "tiny", "policy": "sibling-pinned", "commit": "select", "k": 3,
            "schedule": schedule, "batch": 1, "steps": steps, "accepted_per_step": json.dumps(accepted),
            "time_split": json.dumps({p: v * 1e-3 * steps for p, v in split_ms.items()}),
            "greedy_tokens_per_s": 1e3 / greedy_ms} | fields


def test_each_phase_is_its_timed_cost_per_step_over_its_calibrated_price():
    df = pd.DataFrame([
        # decode T(1), the draft phase of 3, T(4) and the commits of 1 and 4 tokens, each at a known multiple
        _point("decode-verify", [0, 3], {"decode": 1.1, "draft": 0.6, "verify": 1.3 * 1.2, "commit": 0.025 * 2},
               greedy_ms=1.1 * 1.05),
        _point("fused", [3, 3], {"decode": 0.0, "draft": 0.6 * 1.5, "verify": 1.3, "commit": 0.04}, greedy_ms=1.1),
        _point("fused", [3], {"decode": 0.0, "draft": 0.6, "verify": 1.3, "commit": 0.04}, greedy_ms=1.1, batch=2),
        _point("fused", [3], {"decode": 0.0, "draft": 0.6, "verify": 1.3, "commit": 0.04}, greedy_ms=1.1, k=9),
    ])
    t = quality.phase_table(df, CALIBRATION)
    dv, fused = t.loc[("sibling-pinned", "select", "decode-verify")], t.loc[("sibling-pinned", "select", "fused")]
    assert dv["points"] == 1 and fused["points"] == 1  # a batch point and a k beyond the calibration left out
    assert dv["decode / calibrated"] == pytest.approx(1.1) and dv["draft / calibrated"] == pytest.approx(1.0)
    assert dv["verify / calibrated"] == pytest.approx(1.2) and dv["commit / calibrated"] == pytest.approx(2.0)
    assert dv["greedy / calibrated"] == pytest.approx(1.05)
    assert pd.isna(fused["decode / calibrated"]) and fused["draft / calibrated"] == pytest.approx(1.5)
    assert quality.phase_table(df, {}).empty  # no calibration: nothing to price
