"""Statistics of repeated, paired measurements: medians with bootstrap confidence intervals."""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
STABLE_HALF_WIDTH = 0.05  # a result is stable when its CI half-width is at most 5% of its median


def finite(samples) -> np.ndarray:
    """The samples that are numbers and finite (None, NaN and infinities left out)."""
    return np.asarray([s for s in samples if s is not None and math.isfinite(s)], dtype=float)


def median(samples) -> float:
    """The median of the finite samples; NaN when there are none."""
    x = finite(samples)
    return float(np.median(x)) if x.size else float("nan")


def bootstrap_ci(samples, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> list[float]:
    """Percentile bootstrap CI of the median: [lo, hi]; NaNs with fewer than two finite samples (never stable).

    Deterministic for a seed, so a result file re-made from the same samples says the same.
    """
    x = finite(samples)
    if x.size < 2:  # one sample says nothing about the spread
        return [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, x.size, (resamples, x.size))], axis=1)
    tail = (1.0 - confidence) / 2 * 100
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return [float(lo), float(hi)]


def half_width(ci, centre: float) -> float:
    """The CI's half-width relative to its centre (the median); NaN when it cannot be said."""
    lo, hi = ci
    if not all(math.isfinite(v) for v in (lo, hi, centre)) or centre == 0:
        return float("nan")
    return (hi - lo) / 2 / abs(centre)


def is_stable(ci, centre: float, limit: float = STABLE_HALF_WIDTH) -> bool:
    """False when the CI's half-width exceeds `limit` of the median (or cannot be computed)."""
    w = half_width(ci, centre)
    return math.isfinite(w) and w <= limit


def summarize(samples) -> dict:
    """Median, CI, relative half-width and the stable flag of one list of samples."""
    m, ci = median(samples), bootstrap_ci(samples)
    return {"median": m, "ci": ci, "half_width": half_width(ci, m), "stable": is_stable(ci, m)}


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X chi-square with df degrees of freedom: the regularized upper incomplete gamma Q(df/2, x/2)
    (a series below a + 1, a continued fraction above; Numerical Recipes' gammq, to 1e-12)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:  # P by its series, Q = 1 - P
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-14:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)  # Q by Lentz's continued fraction
    h, i = d, 0
    while True:
        i += 1
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            return h * math.exp(log_front)


def two_sample_chi_square(a, b, min_expected: float = 5.0) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of Pearson's chi-square test that two histograms over the same
    cells come from one distribution; cells with fewer than min_expected counts expected per side are pooled
    into one cell."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    na, nb = a.sum(), b.sum()
    pooled = a + b
    big = pooled * min(na, nb) / (na + nb) >= min_expected
    a2, b2 = np.append(a[big], a[~big].sum()), np.append(b[big], b[~big].sum())
    keep = (a2 + b2) > 0
    a2, b2 = a2[keep], b2[keep]
    total = a2 + b2
    ea, eb = total * na / (na + nb), total * nb / (na + nb)
    statistic = float(((a2 - ea) ** 2 / ea).sum() + ((b2 - eb) ** 2 / eb).sum())
    df = max(int(keep.sum()) - 1, 1)
    return statistic, df, chi2_sf(statistic, df)


def goodness_of_fit(counts, probs, min_expected: float = 5.0) -> float:
    """The p-value of Pearson's test that counts were drawn from the distribution probs (cells expecting fewer than
    min_expected pooled into one); 0 where a draw fell where probs has no mass, 1 where there is nothing to test
    (one cell, or no draws)."""
    counts, probs = np.asarray(counts, dtype=float), np.asarray(probs, dtype=float)
    if counts[probs == 0].sum():
        return 0.0
    expected = probs * counts.sum()
    big = expected >= min_expected
    e, o = np.append(expected[big], expected[~big].sum()), np.append(counts[big], counts[~big].sum())
    e, o = e[e > 0], o[e > 0]
    if len(e) < 2:
        return 1.0
    return chi2_sf(float(((o - e) ** 2 / e).sum()), len(e) - 1)


# Student t 97.5% quantiles by degrees of freedom (1.96 beyond the table)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def ratio_interval(ratios) -> tuple[float, float] | None:
    """A 95% t interval of the geometric mean of paired ratios (their logs averaged, the width from their spread
    with the t quantile of n - 1 degrees of freedom), or None from fewer than two finite positive ratios. With a
    handful of rounds it is honest where a bootstrap of the median is too narrow (the bootstrap of 3 is their range,
    which holds the median 75% of the time)."""
    x = np.asarray([r for r in ratios if r is not None and math.isfinite(r) and r > 0], dtype=float)
    if x.size < 2:
        return None
    x = np.log(x)
    df = x.size - 1
    t = T975.get(df) or next((v for d, v in sorted(T975.items()) if d >= df), 1.96)
    half = t * x.std(ddof=1) / np.sqrt(x.size)
    return float(np.exp(x.mean() - half)), float(np.exp(x.mean() + half))
