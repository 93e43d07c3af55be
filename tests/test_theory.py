"""Leviathan's expected tokens per step, for both schedules, and the alpha fit."""

import pytest

from mtplab import theory


def test_acceptance_length_limits():
    assert theory.acceptance_length(0.0, 4) == 1.0
    assert theory.acceptance_length(1.0, 4) == 5.0
    assert theory.acceptance_length(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)


def test_decode_verify_schedule_adds_the_guaranteed_token():
    assert theory.tokens_per_step(0.5, 2, "decode-verify") == theory.tokens_per_step(0.5, 2, "fused") + 1


def test_fit_alpha_recovers_a_geometric_curve():
    assert theory.fit_alpha(theory.per_position(0.7, 4)) == pytest.approx(0.7, abs=1e-3)


def test_predicted_speedup_is_tokens_per_step_over_step_cost():
    # free drafts and commit, verify as cheap as a decode: fused speedup = acceptance length
    assert theory.predicted_speedup(0.8, 3, 1.0, 0.0, 0.0, 1.0, 0.0, "fused") == pytest.approx(
        theory.acceptance_length(0.8, 3)
    )
    assert theory.predicted_speedup(0.0, 1, 1.0, 1.0, 0.1, 1.0, 0.0) == pytest.approx(2 / 2.1)


CALIBRATION = {
    "target": {str(m): 1.0 + 0.2 * (m - 1) for m in range(1, 9)},
    "head": 0.1,
    "commit": {"select": {str(n): 0.01 * n for n in range(1, 9)}},
}


def test_accepted_distribution_sums_to_one():
    p = theory.accepted_distribution(0.7, 4)
    assert len(p) == 5 and sum(p) == pytest.approx(1.0)


def test_prediction_from_the_calibration_is_tokens_per_step_over_step_cost():
    got = theory.predict(0.0, 1, "decode-verify", "select", CALIBRATION)
    # alpha 0: 2 tokens per step; step = T(1) + head + T(2) + commit(1 token)
    assert got["speedup"] == pytest.approx(2 * 1.0 / (1.0 + 0.1 + 1.2 + 0.01))


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_predicted_speedup_rises_with_alpha(schedule, k):
    s = [theory.predict(a, k, schedule, "select", CALIBRATION)["speedup"] for a in [i / 20 for i in range(21)]]
    assert all(b >= a for a, b in zip(s, s[1:]))
