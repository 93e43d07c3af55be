"""The lossless oracle's verdicts."""

import numpy as np
import pytest

from mtplab.check import verdict as oracle
from mtplab.engine.acceptance import top2_margins_xp


def test_identical_tokens():
    r = oracle.token_identity([1, 2, 3], [1, 2, 3], [1.0, 1.0, 1.0])
    assert r["token_identical"] and r["first_divergence"] is None


def test_first_divergence_and_margin_there():
    r = oracle.token_identity([1, 2, 9, 4], [1, 2, 3, 4], [0.5, 0.6, 0.7, 0.8])
    assert (r["first_divergence"], r["margin_at_divergence"]) == (2, 0.7)
    ok, msg = oracle.verdict(r)
    assert not ok and "diverges from greedy at token 2" in msg and "margin there 0.7" in msg


def test_top2_margin():
    assert top2_margins_xp(np, np.array([[0.0, 3.0, 1.0], [2.0, 2.0, 1.0]])).tolist() == [2.0, 0.0]  # a tie: 0


def test_tensor_difference_is_relative_to_the_reference_and_never_passes_nan():
    worst, rel, same = oracle.tensor_difference(np.array([2.0, 4.0]), np.array([2.0, 4.0 + 4e-5]))
    assert not same and worst == pytest.approx(4e-5) and rel == pytest.approx(1e-5, rel=1e-3)
    assert oracle.tensor_difference(np.array([np.nan]), np.array([0.0]))[:2] == (float("inf"), float("inf"))
    assert oracle.tensor_difference(np.zeros((1, 2)), np.zeros((1, 3)))[2] is False  # another shape never passes


@pytest.mark.parametrize(
    "commit, same_device, bitwise",
    [("readvance-m1", True, True), (None, True, True), ("readvance-m1", False, False), ("select", True, False),
     ("readvance-batched", True, False)],
)
def test_each_commit_states_its_guarantee(commit, same_device, bitwise):
    rule = oracle.state_rule(commit, "fp32", same_device)
    assert rule.bitwise is bitwise and (rule.rtol == 0.0) is bitwise
    assert rule.text().startswith("bitwise" if bitwise else "relative 1e-05") and (commit or "greedy") in rule.text()


def test_a_snapshot_breaks_a_bitwise_rule_on_one_ulp_and_a_relative_rule_beyond_its_tolerance():
    ref = {"gdn_state.0": np.ones(4, np.float32), "kv.1.key": np.full((1, 1, 2, 2), 3.0, np.float32)}
    ulp = {**ref, "kv.1.key": np.nextafter(ref["kv.1.key"], 9)}
    assert oracle.states_difference(ulp, ref, oracle.state_rule("readvance-m1", "fp32", True))["first_bad"][
        "tensor"] == "kv.1.key"
    assert oracle.states_difference(ulp, ref, oracle.state_rule("select", "fp32", True))["first_bad"] is None
    drift = {**ref, "gdn_state.0": ref["gdn_state.0"] * (1 + 2e-5)}
    bad = oracle.states_difference(drift, ref, oracle.state_rule("select", "fp32", True))["first_bad"]
    assert bad["tensor"] == "gdn_state.0" and bad["max_rel_diff"] == pytest.approx(2e-5, rel=0.05)
