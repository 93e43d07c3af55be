"""The greedy baseline's draw from point to point: how far the same greedy moves between a sweep's points beyond
what each point's own rounds say, and how much of the efficiency's spread follows it.

Every mtplab point of one model, thread count and length runs the same greedy, each point in a process of its own.
Its tokens/s should differ between points only by the machine's slow drift and each point's round-to-round noise,
which the point's CI holds. `draw` measures what is left: the scatter of greedy between points measured one after
another (a smooth drift cancels out of their second differences), set beside the points' own CI widths. Where
points scatter more, each point's greedy drew a speed of its own: its process's sessions (two engines of one
process on small at 2 threads sat 6% apart, steadily) and the machine's state while it ran (the same two moved
together by a CV of 4.4% over a minute, their speculative runs by 1.6-2.5%): benchmarks/process_spread.py runs
one point in fresh processes to show it. Paired rounds cancel it only as far as the speculative side shares it;
`draw` also measures how far the efficiency follows it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from mtplab.report.selection import batch_one, own_engine, ran
from mtplab.report.tables import ci_pair

MIN_POINTS = 6  # fewer points say nothing about a scatter between them
COUPLED = 0.5  # |correlation| from which the efficiency is said to follow greedy's draw
_MEDIAN_ABS_NORMAL = 0.6745  # median |z| of a standard normal: a robust sigma from a median


def _measured_at(env) -> float:
    env = json.loads(env) if isinstance(env, str) else env
    value = (env or {}).get("measured_at") if isinstance(env, dict) else None
    return float(value) if value is not None else math.nan


def groups(df: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """The sweep's points that run one greedy: mtplab's batch-1 points that ran, by model, threads and tokens, each
    group in the order its points were measured (sweep order where a time is missing)."""
    own = batch_one(own_engine(ran(df)))
    if own.empty or "greedy_tokens_per_s" not in own:
        return []
    own = own[own.greedy_tokens_per_s.notna() & (own.greedy_tokens_per_s > 0)]
    keys = [c for c in ("model_name", "threads", "tokens") if c in own]
    at = own["env"].map(_measured_at) if "env" in own else pd.Series(math.nan, index=own.index)
    own = own.assign(_at=at.fillna(pd.Series(np.arange(len(own), dtype=float), index=own.index)))
    parts = list(own.groupby(keys)) if keys else [((), own)]
    return [(key if isinstance(key, tuple) else (key,), part.sort_values("_at")) for key, part in parts]


def draw(points: pd.DataFrame) -> dict | None:
    """For points that run one greedy (a `groups` part, in measured order): "points"; "scatter", the 95% half-width
    of greedy's point-to-point scatter as a fraction (1.96 robust sigmas of log tok/s, from the second differences of
    successive points: a smooth drift, about the same step from each point to the next, cancels); "within", the median 95% half-width of each point's own greedy CI; and, over the points
    with an efficiency, "r" and "slope" of log efficiency on log greedy with the efficiencies at the group's median
    greedy ("adjusted": min, median, max; a least-squares fit, diagnosis only). None under MIN_POINTS points."""
    g = points.greedy_tokens_per_s.to_numpy(dtype=float)
    if len(g) < MIN_POINTS:
        return None
    bends = np.diff(np.log(g), 2)  # e[i+2] - 2 e[i+1] + e[i]: 6 sigma^2 for independent draws, ~0 on a smooth drift
    sigma = float(np.median(np.abs(bends))) / (math.sqrt(6) * _MEDIAN_ABS_NORMAL)
    half = [(hi - lo) / 2 / v for (lo, hi), v in zip(map(ci_pair, points.get("greedy_tokens_per_s_ci", [])), g)]
    half = [h for h in half if math.isfinite(h)]
    out = {"points": len(g), "scatter": math.expm1(1.96 * sigma),
           "within": float(np.median(half)) if half else math.nan, "r": math.nan, "slope": math.nan}
    if "efficiency" in points:
        e = points.efficiency.to_numpy(dtype=float)
        has = np.isfinite(e) & (e > 0)
        if has.sum() >= MIN_POINTS and np.ptp(np.log(g[has])) > 0:
            x, y = np.log(g[has]), np.log(e[has])
            slope, _ = np.polyfit(x, y, 1)
            adjusted = np.exp(y - slope * (x - np.median(np.log(g))))
            out |= {"r": float(np.corrcoef(x, y)[0, 1]), "slope": float(slope), "with_efficiency": int(has.sum()),
                    "adjusted": [float(adjusted.min()), float(np.median(adjusted)), float(adjusted.max())]}
    return out


def _label(key: tuple, many: bool) -> str:
    model, threads, tokens = (tuple(key) + (None, None, None))[:3]
    return f" (`{model}`, {threads} threads, {tokens} tokens)" if many else ""


def quality_lines(df: pd.DataFrame) -> list[str]:
    """The measurement-quality bullets: each greedy's point-to-point scatter beside its points' own CIs, and how far
    the efficiency follows it."""
    parts = groups(df)
    out = []
    for key, points in parts:
        d = draw(points)
        if d is None:
            continue
        text = (f"- Greedy from point to point{_label(key, len(parts) > 1)}: successive points scatter by ±{d['scatter']:.1%} "
                f"(95%, {d['points']} points, measured in turn; a smooth drift cancels out), where each point's own "
                f"rounds put its greedy within ±{d['within']:.1%} (median CI half-width).")
        if math.isfinite(d["r"]):
            low, mid, high = d["adjusted"]
            text += (f" Efficiency against the point's greedy: r = {d['r']:.2f}, slope {d['slope']:.2f} over "
                     f"{d['with_efficiency']} points; at the median greedy the efficiencies would span "
                     f"{low:.2f}-{high:.2f} (median {mid:.2f}; a least-squares fit, diagnosis only).")
        out.append(text)
    return out


def finding(df: pd.DataFrame) -> list[str]:
    """The headline warning where greedy scatters between points by more than twice their own CIs: paired rounds
    inside a point do not hold it, and a speedup compared across points carries it (as far as the efficiency
    follows greedy's draw, said where it does)."""
    out = []
    for key, points in groups(df):
        d = draw(points)
        if d is None or not d["scatter"] > 2 * d["within"]:
            continue
        text = (f"- **Points differ by more than their CIs**{_label(key, True)}: the same greedy scatters by "
                f"±{d['scatter']:.0%} from point to point, while each point's rounds agree within ±{d['within']:.1%}. "
                "Each point's greedy draws a speed of its own (its process's sessions, the machine's state while it "
                "ran), which its paired rounds cancel only as far as the speculative side shares it")
        if math.isfinite(d["r"]) and abs(d["r"]) >= COUPLED:
            text += (f": efficiency follows the point's greedy (r = {d['r']:.2f}, slope {d['slope']:.2f}), so a point "
                     f"whose greedy drew 10% faster shows a speedup about {abs(d['slope']) * 10:.0f}% lower. Compare "
                     "speedups across points with that in mind")
        out.append(text + "; a spec's `repeats` runs each point again in a process of its own, which measures the draw "
                   "point by point.")
    return out


def efficiency_against_greedy(df: pd.DataFrame):
    """Each point's efficiency against its greedy tok/s (per greedy the sweep ran), with the least-squares line of
    log efficiency on log greedy: a draw of the baseline the speculative side does not share tilts the cloud. None
    where no greedy has MIN_POINTS points with an efficiency."""
    drawn = []
    for key, points in groups(df):
        d = draw(points)
        if d is not None and math.isfinite(d["r"]):
            has = points.efficiency.notna() & (points.efficiency > 0)
            drawn.append((key, d, points.greedy_tokens_per_s[has].to_numpy(float), points.efficiency[has].to_numpy(float)))
    if not drawn:
        return None
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    for key, d, g, e in drawn:
        ax.scatter(g, e, s=14, label=f"{key[0]}, {key[1]} threads: r = {d['r']:.2f}" if len(key) > 1 else f"r = {d['r']:.2f}")
        slope, intercept = np.polyfit(np.log(g), np.log(e), 1)
        x = np.linspace(g.min(), g.max(), 20)
        ax.plot(x, np.exp(intercept + slope * np.log(x)), lw=1)
    ax.axhline(1.0, color="grey", lw=0.6, ls=":")
    ax.set(xlabel="the point's greedy tok/s", ylabel="efficiency", title="Efficiency against each point's own greedy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
