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
