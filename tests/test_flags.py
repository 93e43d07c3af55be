"""Named warnings: the oracle's acceptance test raises false alarms at its stated rate, and sees a wrong alpha."""

from __future__ import annotations

import numpy as np

from mtplab.check import flags


def _oracle_run(rng, alpha: float, k: int, tokens: int, decodes: int = 1) -> list[int]:
    """Accepted counts of a correct oracle drafter's run: each draft right with probability alpha, until `tokens`."""
    emitted, accepted = 1, []
    while emitted < tokens:
        right = rng.random(k) < alpha
        a = k if right.all() else int(np.argmin(right))
        accepted.append(a)
        emitted += a + 1 + decodes
    return accepted


def test_the_oracle_test_is_exact_where_a_normal_one_alarms_on_skewed_counts():
    # alpha 0.99 at k=1: 4 rejections in 64 steps has p ~ 0.009 (a z-test puts it at z = -4.5, beyond its 0.1% line)
    assert flags.accepted_sum_p_value([1] * 60 + [0] * 4, 1, 0.99) > flags.ORACLE_FALSE_ALARM
    assert flags.oracle_warning([1] * 60 + [0] * 4, 1, 0.99) is None
    w = flags.oracle_warning([1] * 56 + [0] * 8, 1, 0.99)
    assert w["name"] == "oracle_acceptance" and "exact two-sided p = " in w["message"]


def test_a_correct_oracle_raises_at_most_the_stated_false_alarms_and_a_wrong_alpha_is_seen():
    rng = np.random.default_rng(0)
    for alpha, k in ((0.99, 1), (0.99, 3), (0.5, 3)):
        runs = 2000
        alarms = sum(flags.oracle_warning(_oracle_run(rng, alpha, k, 128), k, alpha) is not None for _ in range(runs))
        # stated 0.1%: about 2 in 2000 at most (the normal test raised 19-24 here at alpha 0.99)
        assert alarms <= 6, (alpha, k, alarms)
    # drafts right at 0.5 where 0.8 is set: flagged in nearly every run of 128 tokens (at 0.68, about a fifth: one
    # run of 128 tokens at k=3 has some 40 steps, too few to tell 0.68 from 0.8 at a 0.1% false-alarm rate)
    seen = sum(flags.oracle_warning(_oracle_run(rng, 0.5, 3, 128), 3, 0.8) is not None for _ in range(200))
    assert seen >= 190


def test_an_expected_acceptance_that_is_not_a_number_is_flagged():
    w = flags.sampled_warning({"judged": 13, "kept": 7, "expected": float("nan")})
    assert w["name"] == "sampled_acceptance" and "is nan: the probabilities the rule drew from were not finite" in w["message"]


def test_a_mixture_whose_drafts_are_accepted_below_alpha_is_flagged_and_one_above_is_not():
    """alpha * p + (1 - alpha) * [d] is accepted with sum(min(p, q)) = alpha + (1 - alpha) p(d) >= alpha, draft by
    draft: an expectation under alpha is a mixture drafting otherwise (here 0.6 alpha on p, as a planted bug did)."""
    w = flags.mixture_warning({"judged": 40, "kept": 12, "expected": 0.30}, 0.5)
    assert w["name"] == "oracle_acceptance" and "30.0%, below the alpha 0.5" in w["message"]
    assert flags.mixture_warning({"judged": 40, "kept": 21, "expected": 0.5}, 0.5) is None
    # alpha 1: the verify's p and the mixture's own forward differ by rounding (measured 0.9999996)
    assert flags.mixture_warning({"judged": 40, "kept": 40, "expected": 0.9999996}, 1.0) is None
    assert flags.mixture_warning({"judged": 0, "kept": 0, "expected": None}, 0.5) is None
