"""Leviathan's expected tokens per step, for both schedules, and the alpha fit."""

import numpy as np
import pytest

from mtplab.engine.strategies import SCHEDULES
from mtplab.measure import theory


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


def test_expected_steps_count_the_last_steps_overshoot():
    assert theory.expected_steps(1.0, 3, "fused", 9) == 2.0  # 4 tokens a step: 8 after the prefill's token
    assert theory.expected_steps(0.0, 1, "fused", 5) == 4.0  # 1 token a step
    assert theory.expected_steps(0.0, 1, "decode-verify", 4) == 2.0  # 2 a step: 3 needed, the last one overshoots
    # long runs approach (n - 1) / tokens per step; short ones pay for the overshoot
    n = 4000
    assert theory.expected_steps(0.7, 3, "decode-verify", n) == pytest.approx(
        (n - 1) / theory.tokens_per_step(0.7, 3), rel=1e-3)


def test_the_steps_a_run_made_are_priced_at_the_predictions_costs():
    # every draft kept, no overshoot: the steps are alpha=1's expected ones, and so is the price
    k, tokens = 3, 21  # 5 tokens a decode-verify step, 20 after the prefill's token: 4 steps
    assert theory.predict_steps([3] * 4, k, "decode-verify", "select", CALIBRATION, tokens)["speedup"] == pytest.approx(
        theory.predict(1.0, k, "decode-verify", "select", CALIBRATION, tokens=tokens)["speedup"])
    # a run that kept fewer drafts than its alpha says is priced for what it did: 3 steps of 2, 2 and 0 kept
    got = theory.predict_steps([2, 2, 0], k, "fused", "select", CALIBRATION, 8)
    step = 0.1 * 2 + 1.6 + (0.03 + 0.03 + 0.01) / 3  # k - 1 head steps (fused) + T(4) + the mean commit
    assert got["step_seconds"] == pytest.approx(step) and got["tokens_per_step"] == pytest.approx(7 / 3)
    assert got["speedup"] == pytest.approx(7 * 1.0 / (3 * step))
    # a K per step (a draft-length policy's): each verify at its own K + 1, or at k + 1 every step where padded
    per_length = theory.step_prices([1, 0], [2, 1], "fused", "select", CALIBRATION)
    padded = theory.step_prices([1, 0], [2, 1], "fused", "select", CALIBRATION, verified=4)
    assert per_length["verify"] == pytest.approx((1.4 + 1.2) / 2) and padded["verify"] == pytest.approx(1.8)
    assert padded["draft"] == per_length["draft"]  # the drafts are the step's own
    with pytest.raises(ValueError, match="prices a run's steps"):
        theory.predict_steps([], k, "fused", "select", CALIBRATION, 8)
    with pytest.raises(ValueError, match=r"prices commits of \[1, 2, 3, 4, 5, 6, 7, 8\] tokens, not of \[10\]"):
        theory.predict_steps([9], k, "fused", "select", CALIBRATION, 8)


def test_the_steps_price_counts_the_tokens_the_rates_count_and_each_slots_fallbacks():
    calib = CALIBRATION | {"eager": {str(m): 2.0 * v for m, v in CALIBRATION["target"].items()}}
    # the last step overshoots: 4 steps of 5 tokens make 20, the rates count 19
    got = theory.predict_steps([3] * 4, 3, "decode-verify", "select", calib, 20)
    step = 1.0 + 0.3 + 1.6 + 0.04
    assert got["speedup"] == pytest.approx(19 * 1.0 / (4 * step))
    # a run that stopped early (2 tokens made of 99 to make) is priced for what it made
    assert theory.predict_steps([1], 3, "fused", "select", calib, 100)["speedup"] == pytest.approx(
        2 * 1.0 / (0.2 + 1.6 + 0.02))  # fused: the first draft is the last head commit's
    # every Verify forward a fallback: priced at the eager T(k+1), as predict prices it
    eager = theory.predict_steps([3] * 4, 3, "decode-verify", "select", calib, 20, eager_share={"verify": 1.0})
    assert eager["step_seconds"] == pytest.approx(1.0 + 0.3 + 3.2 + 0.04)


def test_the_prediction_prices_fallbacks_greedys_loop_and_the_draft_phase():
    calib = CALIBRATION | {"eager": {str(m): 2.0 * v for m, v in CALIBRATION["target"].items()},
                           "draft": {str(k): 0.15 * k for k in range(1, 8)}, "greedy_token": 1.1}
    base = theory.predict(0.0, 1, "decode-verify", "select", calib)  # the draft phase (fused's) and one head step
    assert base["speedup"] == pytest.approx(2 * 1.1 / (1.0 + 0.15 + 0.1 + 1.2 + 0.01))
    eager = theory.predict(0.0, 1, "decode-verify", "select", calib, eager_share={"verify": 1.0})
    assert eager["step_seconds"] == pytest.approx(1.0 + 0.25 + 2.4 + 0.01) and eager["fallback_cost_ratio"] == 2.0
    assert theory.predict(0.0, 1, "fused", "select", calib)["step_seconds"] == pytest.approx(0.15 + 1.2 + 0.01)


def test_a_point_whose_primary_runs_the_copy_pays_its_m1_cost_in_the_decode_and_in_greedy():
    calib = CALIBRATION | {"eager": {"1": 1.5, "2": 2.0}, "greedy_token": 1.1, "copy_target": {"1": 1.25}}
    copy = theory.on_the_copy(calib)
    assert (copy["target"]["1"], copy["eager"]["1"], copy["greedy_token"]) == pytest.approx((1.25, 1.75, 1.35))
    assert copy["target"]["2"] == calib["target"]["2"] and calib["target"]["1"] == 1.0  # the verify's, and no mutation
    got = theory.predict(0.0, 1, "decode-verify", "select", copy)
    assert got["speedup"] == pytest.approx(2 * 1.35 / (1.25 + 0.1 + 1.2 + 0.01))
    assert theory.on_the_copy(CALIBRATION) is CALIBRATION  # a calibration without the copy's cost is as it was


def test_a_batch_waits_for_its_slowest_row():
    one = theory.expected_steps(0.7, 3, "fused", 40)
    assert theory.expected_batch_steps(0.7, 3, "fused", 40, 1) == pytest.approx(one)
    eight = theory.expected_batch_steps(0.7, 3, "fused", 40, 8)
    assert one < eight < 39  # the slowest of 8 rows, never worse than a token a step
    # certain acceptance: every row makes k + 1 tokens a step, so the batch is no slower than one row
    assert theory.expected_batch_steps(1.0, 3, "fused", 41, 8) == pytest.approx(10)


def test_rows_with_alphas_of_their_own_wait_for_the_slowest_and_ride_along():
    """alpha per row: equal values price as one alpha; E[max of the rows' steps] against a simulation of independent
    rows; the riding share is 1 - mean row steps / E[max]."""
    k, schedule, tokens = 3, "decode-verify", 40
    assert theory.expected_batch_steps([0.7] * 4, k, schedule, tokens, 4) == pytest.approx(
        theory.expected_batch_steps(0.7, k, schedule, tokens, 4))
    for commit in ("select", "readvance-m1", "readvance-batched"):
        table = {str(j): float(j * j) for j in range(1, k + 2)}
        assert theory.batch_commit_seconds([0.6] * 3, k, commit, table, 3) == pytest.approx(
            theory.batch_commit_seconds(0.6, k, commit, table, 3))
    alphas = [0.9, 0.9, 0.2]
    rng, extra = np.random.default_rng(0), SCHEDULES.get(schedule).extra_tokens
    steps = np.zeros((20000, len(alphas)))
    for b, alpha in enumerate(alphas):
        made = np.ones(len(steps))  # the prefill's token
        while (made < tokens).any():
            going = made < tokens
            accepted = np.minimum((rng.random((len(steps), k)) < alpha).cumprod(axis=1).sum(axis=1), k)
            made += going * (accepted + extra)
            steps[:, b] += going
    assert theory.expected_batch_steps(alphas, k, schedule, tokens, 3) == pytest.approx(steps.max(axis=1).mean(),
                                                                                         rel=0.01)
    assert theory.riding_share(alphas, k, schedule, tokens, 3) == pytest.approx(
        1 - steps.mean() / steps.max(axis=1).mean(), abs=0.01)
    assert theory.riding_share(1.0, k, schedule, 41, 3) == pytest.approx(0.0)


def test_batch_commit_cost_follows_each_strategys_rows():
    table = {str(n): float(n) for n in range(1, 5)}  # a commit of n tokens costs n
    k, alpha = 3, 0.5
    one = theory.batch_commit_seconds(alpha, k, "select", table, 1)
    assert theory.batch_commit_seconds(alpha, k, "select", table, 8) == pytest.approx(one)  # the mean row's
    assert theory.batch_commit_seconds(alpha, k, "readvance-m1", table, 1) == pytest.approx(one)
    assert theory.batch_commit_seconds(alpha, k, "readvance-m1", table, 8) > one  # the longest row's count
    assert theory.batch_commit_seconds(alpha, k, "readvance-batched", table, 1) == pytest.approx(one)
    # B rows: one forward per distinct count, at most every count once
    assert theory.batch_commit_seconds(alpha, k, "readvance-batched", table, 10**6) == pytest.approx(sum(table.values()))


def test_a_position_a_step_did_not_draft_is_not_judged():
    # K per step (a draft-length policy): 2, 2, 4; accepted 2, 0, 1. Position 3 was drafted once (the last step),
    # where its turn never came (1 kept): judged drafts are 3 at position 1 and 2 at 2, kept 2 and 1.
    tracked = {"expected": [0.5, 0.5, 0.5, 0.5]}
    out = theory.sampled_acceptance([2, 0, 1], 4, tracked, "fused", ks=[2, 2, 4])
    assert (out["judged"], out["kept"]) == (5, 3)
    assert out["measured_per_position"] == [2 / 3, 1 / 2, None, None]
    assert theory.measured_per_position([2, 0, 1], 4, [2, 2, 4]) == [2 / 3, 1 / 3, 0.0, 0.0]
    assert theory.sampled_acceptance([2, 0, 1], 4, tracked, "fused")["judged"] == 6  # K=4 every step: 3 + 2 + 1
