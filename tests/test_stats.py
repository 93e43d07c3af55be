"""Medians with bootstrap CIs: the interval covers what the spread says, and noise is flagged."""

import math

import numpy as np
import pytest

from mtplab.measure import stats


def test_bootstrap_ci_of_a_known_spread_brackets_the_true_median():
    # normal, sigma 0.02 around 1.5: the median's standard error is about 1.25 * sigma / sqrt(n)
    x = np.random.default_rng(1).normal(1.5, 0.02, 200)
    lo, hi = stats.bootstrap_ci(x)
    assert lo < 1.5 < hi
    se = 1.2533 * 0.02 / math.sqrt(200)
    assert (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.35)


def test_ci_is_narrow_for_a_tight_sample_and_it_is_stable():
    s = stats.summarize([1.80, 1.83, 1.82, 1.84, 1.81])
    assert s["median"] == pytest.approx(1.82)
    assert 1.80 <= s["ci"][0] <= s["median"] <= s["ci"][1] <= 1.84
    assert s["stable"] is True


def test_a_noisy_sample_is_not_stable():
    s = stats.summarize([1.0, 1.6, 0.7, 1.9, 1.2])
    assert s["half_width"] > stats.STABLE_HALF_WIDTH
    assert s["stable"] is False


def test_no_finite_samples_gives_nan_and_unstable():
    s = stats.summarize([float("nan"), None])
    assert math.isnan(s["median"]) and all(math.isnan(v) for v in s["ci"])
    assert s["stable"] is False


def test_the_ci_is_deterministic():
    x = [1.1, 1.3, 1.2, 1.25, 1.15]
    assert stats.bootstrap_ci(x) == stats.bootstrap_ci(x)


@pytest.mark.parametrize("x, df, p", [(3.841459, 1, 0.05), (6.634897, 1, 0.01), (18.307038, 10, 0.05),
                                      (124.342113, 100, 0.05), (0.5, 3, 0.918891), (0.0, 4, 1.0)])
def test_chi_square_tail_matches_the_tables(x, df, p):
    assert stats.chi2_sf(x, df) == pytest.approx(p, rel=1e-5)


def test_two_sample_chi_square_tells_one_distribution_from_two():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.15, 0.05] + [0.0] * 4)
    a, b = rng.multinomial(4000, p), rng.multinomial(4000, p)
    c = rng.multinomial(4000, [0.45, 0.35, 0.15, 0.05] + [0.0] * 4)
    assert stats.two_sample_chi_square(a, b)[2] > 0.01 and stats.two_sample_chi_square(a, c)[2] < 1e-6
    assert stats.two_sample_chi_square(a, b)[1] == 3  # four cells with counts, the empty ones dropped


def test_goodness_of_fit_tells_its_distribution_from_another_and_fails_a_draw_where_it_has_no_mass():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.15, 0.04, 0.01, 0.0])
    assert stats.goodness_of_fit(rng.multinomial(4000, p), p) > 0.01
    assert stats.goodness_of_fit(rng.multinomial(4000, [0.45, 0.35, 0.15, 0.04, 0.01, 0.0]), p) < 1e-6
    assert stats.goodness_of_fit([10, 0, 0, 0, 0, 1], p) == 0.0  # a draw where p is 0
    assert stats.goodness_of_fit([0, 0, 0, 0, 0, 0], p) == 1.0  # nothing drawn: nothing to test
