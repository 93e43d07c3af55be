"""Statistics of repeated, paired measurements: medians with bootstrap confidence intervals."""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
STABLE_HALF_WIDTH = 0.05  # a result is stable when its CI half-width is at most 5% of its median


def median(samples) -> float:
    """The median of the finite samples; NaN when there are none."""
    x = np.asarray([s for s in samples if s is not None and math.isfinite(s)], dtype=float)
    return float(np.median(x)) if x.size else float("nan")


def bootstrap_ci(samples, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> list[float]:
    """Percentile bootstrap CI of the median: [lo, hi]; NaNs with fewer than two finite samples (never stable).

    Deterministic for a seed, so a result file re-made from the same samples says the same.
    """
    x = np.asarray([s for s in samples if s is not None and math.isfinite(s)], dtype=float)
    if x.size == 0:
        return [float("nan"), float("nan")]
    if x.size == 1:  # one sample says nothing about the spread
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
