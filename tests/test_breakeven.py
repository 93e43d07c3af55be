"""Break-even acceptance: the bisection agrees with the closed forms, and readvance-m1 never wins at greedy's cost."""

from __future__ import annotations

import pytest
from conftest import synthetic_calibration

from mtplab.measure import breakeven

H200 = breakeven.hardware_calibration(17.9, 0.1, 1.0, 0.3, restore_ms=0.1)  # the seed's T(1), the rest assumed


@pytest.mark.parametrize("calibration", [H200, synthetic_calibration()], ids=["hardware", "synthetic"])
@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
def test_the_bisection_agrees_with_the_closed_form_at_k1(calibration, schedule):
    for commit in ("select", "readvance-batched"):
        closed = breakeven.closed_form_k1(schedule, commit, calibration)
        found = breakeven.break_even_alpha(1, schedule, commit, calibration)
        if closed is None or closed > 1:
            assert found is None
        elif closed < 0:
            assert found == 0.0
        else:
            assert found == pytest.approx(closed, abs=1e-6)
            assert breakeven.speedup(found, 1, schedule, commit, calibration) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
def test_readvance_m1_never_beats_greedy_when_greedy_costs_one_forward_a_token(schedule):
    for k in (1, 2, 4, 8):
        assert breakeven.break_even_alpha(k, schedule, "readvance-m1", H200) is None
        assert breakeven.ceiling(k, schedule, "readvance-m1", H200) < 1
    assert breakeven.closed_form_k1(schedule, "readvance-m1", H200) is None  # c(2) - c(1) = T(1) = greedy's cost
    slow_greedy = breakeven.hardware_calibration(17.9, 0.1, 1.0, 0.3, greedy_ms=40.0)  # a greedy loop twice T(1)
    assert breakeven.break_even_alpha(4, schedule, "readvance-m1", slow_greedy) is not None


def test_select_needs_less_acceptance_than_the_re_advances_and_more_drafts_need_more():
    rows = {(r["commit"], r["schedule"], r["k"]): r for r in
            breakeven.table(H200, [1, 2, 4], ["decode-verify", "fused"], ["select", "readvance-batched", "readvance-m1"])}
    for k in (2, 4):
        assert rows[("select", "fused", k)]["break_even_alpha"] < rows[("readvance-batched", "fused", k)]["break_even_alpha"]
    assert rows[("select", "fused", 1)]["break_even_alpha"] < rows[("select", "fused", 4)]["break_even_alpha"]
    assert rows[("select", "fused", 4)]["verify_ratio"] == pytest.approx(1.4)


def test_costs_that_cannot_be_are_refused():
    with pytest.raises(ValueError, match="costs must be >= 0"):
        breakeven.hardware_calibration(0.0, 0.1, 1.0, 0.3)
    with pytest.raises(ValueError, match="verify_slope >= 0"):
        breakeven.hardware_calibration(10.0, -0.1, 1.0, 0.3)
    with pytest.raises(ValueError, match="greedy_ms=0"):
        breakeven.hardware_calibration(10.0, 0.1, 1.0, 0.3, greedy_ms=0)


def test_a_speedup_that_falls_again_at_high_alpha_still_gives_the_first_crossing():
    # re-advances cost more as more drafts pass, and a short run's last step overshoots: the curve is not monotone
    c = breakeven.hardware_calibration(17.9, 0.05, 0.5, 0.3, greedy_ms=30, restore_ms=0.1, max_k=4)
    args = (1, "decode-verify", "readvance-m1", c)
    assert breakeven.speedup(1.0, *args, tokens=8) < 1  # no win at alpha = 1, and yet one below it
    found = breakeven.break_even_alpha(*args, tokens=8)
    assert found is not None and 0.1 < found < 0.5
    assert breakeven.speedup(found, *args, tokens=8) == pytest.approx(1.0, abs=1e-4)
    assert breakeven.speedup(found - 0.01, *args, tokens=8) < 1
