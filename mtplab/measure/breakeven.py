"""When MTP pays: the break-even acceptance of each commit strategy and schedule, from the cost model.

A speculative step costs [T(1) if decode-verify] + the k head steps + T(k+1) + the commit of the
consumed tokens, and makes tokens_per_step(alpha, k) tokens; greedy pays G per token (T(1) plus its
loop's host work). MTP beats greedy where tokens_per_step * G > the step's cost. The break-even alpha
is the smallest alpha where it does (theory.predict: the first crossing on a grid, refined by bisection).

Closed forms:
- readvance-m1 re-advances each consumed token with one M=1 forward, so every emitted token costs one
  M=1 forward as in greedy, and the drafts and the verify come on top: its speedup is below
  G / c1 (c1: one re-advance forward, about T(1)) whatever alpha is; it never wins where G <= c1
  (greedy's loop costs no more per token than one forward), as on a replayed graph.
- k = 1, any commit: the commit of j + 1 tokens costs c(j + 1), so the step costs
  D + h + T(2) + c(1) + alpha (c(2) - c(1)) for (1 + decodes + alpha) tokens, and
  alpha* = (D + h + T(2) + c(1) - (1 + decodes) G) / (G - (c(2) - c(1))).
`hardware_calibration` builds the cost model from someone else's costs (milliseconds), so the same
functions predict for their hardware.
"""

from __future__ import annotations

from mtplab.engine.strategies import SCHEDULES
from mtplab.measure import theory

BISECTIONS = 30
SCAN = 100  # alpha steps searched for the first crossing before bisecting


def speedup(alpha: float, k: int, schedule: str, commit: str, calibration: dict, tokens: int | None = None) -> float:
    """The predicted speedup over greedy at alpha (theory.predict)."""
    return theory.predict(alpha, k, schedule, commit, calibration, tokens=tokens)["speedup"]


def break_even_alpha(k: int, schedule: str, commit: str, calibration: dict, tokens: int | None = None) -> float | None:
    """The smallest alpha at which MTP beats greedy (0.0: at any alpha), or None when no alpha on a grid of SCAN
    steps does. The speedup need not rise with alpha (a re-advance costs more tokens as more drafts pass, and a
    finite run's last step overshoots), so the grid finds the first crossing and bisection refines it."""
    grid = [i / SCAN for i in range(SCAN + 1)]
    above = next((a for a in grid if speedup(a, k, schedule, commit, calibration, tokens) >= 1.0), None)
    if above is None or above == 0.0:
        return above
    lo, hi = above - 1.0 / SCAN, above
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if speedup(mid, k, schedule, commit, calibration, tokens) >= 1.0 else (mid, hi)
    return hi


def closed_form_k1(schedule: str, commit: str, calibration: dict) -> float | None:
    """alpha* at k = 1 in closed form (the module's formula), None where the denominator leaves no solution; it
    may fall outside [0, 1] (below 0: MTP wins at any alpha; above 1: never)."""
    c = calibration["commit"][commit]
    t = calibration["target"]
    g = theory.greedy_seconds(calibration)
    decodes = SCHEDULES.get(schedule).decodes
    head = theory.draft_seconds(calibration, 1, schedule)
    denominator = g - (c["2"] - c["1"])
    if denominator <= 0:
        return None
    return (decodes * t["1"] + head + theory.verify_seconds(calibration, 1, commit) + c["1"] - (1 + decodes) * g) / denominator


def ceiling(k: int, schedule: str, commit: str, calibration: dict, tokens: int | None = None) -> float:
    """The speedup at alpha = 1 (every draft kept)."""
    return speedup(1.0, k, schedule, commit, calibration, tokens)


def ratios(calibration: dict, k: int, commit: str) -> dict:
    """The cost ratios that decide the break-even at k, over T(1): the verify T(k+1), the draft phase per draft (its k
    head steps and the head's commit, decode-verify's), the commit of k+1 tokens, and greedy's cost per token."""
    t1 = calibration["target"]["1"]
    return {
        "verify_ratio": theory.verify_seconds(calibration, k, commit) / t1,
        "head_ratio": theory.draft_seconds(calibration, k) / k / t1,
        "commit_ratio": calibration["commit"][commit][str(k + 1)] / t1,
        "greedy_ratio": theory.greedy_seconds(calibration) / t1,
    }


def table(calibration: dict, ks, schedules, commits, tokens: int | None = None) -> list[dict]:
    """One row per (commit, schedule, k): the break-even alpha, the speedup ceiling at alpha = 1 and the cost
    ratios that decide them (`ratios`)."""
    return [{"commit": commit, "schedule": schedule, "k": k,
             "break_even_alpha": break_even_alpha(k, schedule, commit, calibration, tokens),
             "ceiling": ceiling(k, schedule, commit, calibration, tokens), **ratios(calibration, k, commit)}
            for commit in commits for schedule in schedules for k in ks if theory.covers(calibration, k, commit)]


def hardware_calibration(t1_ms: float, verify_slope: float, head_ms: float, select_ms: float,
                         greedy_ms: float | None = None, restore_ms: float = 0.0, max_k: int = 8) -> dict:
    """A cost model from someone else's measurements, in milliseconds: T(1), the verify's growth
    T(M) = T(1) * (1 + verify_slope * (M - 1)), one head step, select's commit, greedy's cost per token
    (default T(1)) and a state restore (before a re-advance). Re-advances cost what their forwards cost:
    readvance-m1 m * T(1), readvance-batched T(m). Assumptions: both slots replay (no eager forwards), the
    head's k steps cost k head steps, and a commit's cost does not depend on which tokens were kept."""
    if min(t1_ms, head_ms, select_ms, restore_ms) < 0 or t1_ms <= 0 or verify_slope < 0 or (
            greedy_ms is not None and greedy_ms <= 0):
        raise ValueError(f"costs must be >= 0 (T(1) and greedy's cost > 0), and verify_slope >= 0: got t1_ms={t1_ms}, "
                         f"verify_slope={verify_slope}, head_ms={head_ms}, select_ms={select_ms}, "
                         f"greedy_ms={greedy_ms}, restore_ms={restore_ms}")
    s = 1e-3
    target = {str(m): t1_ms * (1 + verify_slope * (m - 1)) * s for m in range(1, max_k + 2)}
    return {
        "key": {"model": "your hardware", "synthetic": True},
        "target": target,
        "head": head_ms * s,
        "greedy_token": (greedy_ms if greedy_ms is not None else t1_ms) * s,
        "commit": {
            "readvance-m1": {str(m): m * t1_ms * s + restore_ms * s for m in range(1, max_k + 2)},
            "readvance-batched": {str(m): target[str(m)] + restore_ms * s for m in range(1, max_k + 2)},
            "select": {str(m): select_ms * s for m in range(1, max_k + 2)},
        },
    }
