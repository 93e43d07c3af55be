"""The lossless oracle's verdicts."""

import numpy as np

from mtplab import oracle


def test_identical_tokens():
    r = oracle.token_identity([1, 2, 3], [1, 2, 3], [1.0, 1.0, 1.0])
    assert r["token_identical"] and r["first_divergence"] is None


def test_first_divergence_and_margin_there():
    r = oracle.token_identity([1, 2, 9, 4], [1, 2, 3, 4], [0.5, 0.6, 0.7, 0.8])
    assert (r["first_divergence"], r["margin_at_divergence"]) == (2, 0.7)
    ok, msg = oracle.verdict(r, "select")
    assert not ok and "diverges from greedy at token 2" in msg and "margin there 0.7" in msg


def test_top2_margin():
    assert oracle.top2_margin(np.array([0.0, 3.0, 1.0])) == 2.0


def test_state_identity_and_tolerances():
    a = {"s": np.ones(3, np.float32)}
    same = oracle.state_identity(a, {"s": np.ones(3, np.float32)})
    assert same == {"state_max_abs_diff": 0.0, "state_bitwise": True}
    near = oracle.state_identity(a, {"s": np.ones(3, np.float32) + 1e-6})
    ident = {"token_identical": True, **near}
    assert oracle.verdict(ident, "select")[0]
    assert not oracle.verdict(ident, "readvance-m1")[0]
