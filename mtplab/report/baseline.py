"""The greedy baseline's draw from point to point: how far the same greedy moves between a sweep's points beyond
what each point's own rounds say, and how much of the efficiency's spread follows it.

Points of one greedy (`groups`: one model, backend, thread count, length, policy and commit, greedy decoding, each
point's greedy replayed) run the same greedy, each point in a process of its own. Their greedy tokens/s should
differ only by the machine's slow drift and each point's round-to-round noise. `draw` measures both from the
points themselves: the scatter between points taken in the order they were measured (from second differences,
so a smooth drift cancels), and what the rounds' own spread puts into a point's median (the noise a point would
show with no draw). Where the scatter is larger, each point's greedy drew a speed of its own. On this project's
machine it held for the life of a process far more than it moved inside one, and moved the speculative side less:
on small at 2 threads (`benchmarks/process_spread.py --inside 20`, twice), fresh processes run one after another
scattered greedy by ±12.8-17.7% (95%) and the speculative side by ±3.9-4.9%, while inside one process two engines
sat 2.6-2.7% apart (engine and position mixed in those runs) and over a minute their greedy moved by a CV of
1.7-2.1%. On another machine the machine's moment may weigh more; the same command tells them apart. Paired rounds
cancel the draw only as far as the speculative side shares it; `draw` also fits how far the efficiency follows it
(a slope with its CI, each axis from its own rounds).
"""

from __future__ import annotations

import json
import math
from datetime import datetime

import numpy as np
import pandas as pd

from mtplab.report.selection import batch_one, greedy_decoding, own_engine, ran

MIN_POINTS = 10  # fewer points pin the scatter between them only to a factor of about two either way
DRAWN = 2.0  # the scatter, as a multiple of what the rounds' noise alone gives, from which a point is said to draw
_MEDIAN_ABS_NORMAL = 0.6745  # median |z| of a standard normal: a robust sigma from a median
KEYS = ("model_name", "int4", "backend", "threads", "tokens", "prompt_len", "policy", "commit", "validate")


def _t95(dof: int) -> float:
    """Student's t at 97.5% for dof degrees of freedom, within 0.5% from 5 on (1.96 + 2.4/dof + 2.6/dof^2)."""
    return 1.96 + 2.4 / dof + 2.6 / dof**2


def _measured_at(env) -> float:
    """A point's measurement time (env.measured_at: seconds since the epoch, or ISO text), NaN where absent."""
    try:
        env = json.loads(env) if isinstance(env, str) else env
        value = env.get("measured_at") if isinstance(env, dict) else None
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _rounds(samples, field: str = "greedy_tokens_per_s") -> np.ndarray:
    """A point's per-round values of `field` (round_samples), in round order; NaN where one is missing or not
    finite and positive."""
    try:
        samples = json.loads(samples) if isinstance(samples, str) else samples
        values = np.array([float(r.get(field, math.nan)) for r in samples or [] if isinstance(r, dict)], dtype=float)
    except (TypeError, ValueError, AttributeError):
        return np.array([])
    return np.where(np.isfinite(values) & (values > 0), values, math.nan)


def _greedy_rounds(samples) -> np.ndarray:
    """A point's per-round greedy tokens/s, the finite positive ones."""
    rates = _rounds(samples)
    return rates[np.isfinite(rates)]


def groups(df: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """The sweep's points that run one greedy, each group in the order its points were measured: mtplab's batch-1
    greedy-decoding points that ran with a finite greedy rate and a measurement time, their greedy replayed (not a
    Primary slot that ran eager), by KEYS. Each group's key as {column: value}."""
    own = greedy_decoding(batch_one(own_engine(ran(df))))
    if own.empty or "greedy_tokens_per_s" not in own or "env" not in own:
        return []
    rate = pd.to_numeric(own.greedy_tokens_per_s, errors="coerce")
    at = own["env"].map(_measured_at)
    eager = own["extra"].map(_greedy_ran_eager) if "extra" in own else pd.Series(False, index=own.index)
    own = own.assign(_at=at)[(np.isfinite(rate) & (rate > 0) & at.notna() & ~eager.astype(bool)).to_numpy()]
    keys = [c for c in KEYS if c in own]
    if own.empty:
        return []
    parts = list(own.groupby(keys, dropna=True)) if keys else [((), own)]  # a key unknown: no group to join
    return [(dict(zip(keys, key if isinstance(key, tuple) else (key,))), part.sort_values("_at", kind="stable"))
            for key, part in parts if part["_at"].is_unique]  # tied times: no order to read a scatter in


def _greedy_ran_eager(extra) -> bool:
    """Whether a point's extra says its greedy's Primary slot ran eager in some rounds (not the replayed greedy)."""
    try:
        extra = json.loads(extra) if isinstance(extra, str) else extra
    except ValueError:
        return False
    return isinstance(extra, dict) and "eager" in str(extra.get("greedy_baseline", ""))


def draw(points: pd.DataFrame) -> dict | None:
    """For the points of one greedy (a `groups` part): "points"; "scatter", the 95% half-width of greedy's scatter
    between points as a fraction (1.96 robust sigmas of log tok/s from the second differences of the points in
    measured order: a smooth drift cancels); "noise", the 95% half-width the rounds' own spread puts into a point's
    median (pi / 2n of the median point's variance of log rounds; NaN without round samples); "drawn", whether the
    scatter is more than DRAWN times that noise; over the points with an efficiency and rounds, "slope" of log
    efficiency on log greedy, each from its own rounds (`_disjoint`), with its 95% CI ("slope_ci") and "r", and the
    efficiencies moved along that line to the median greedy ("adjusted": min, median, max; a diagnosis: one line
    across the points' configurations). None under MIN_POINTS."""
    g = pd.to_numeric(points.greedy_tokens_per_s, errors="coerce").to_numpy(dtype=float)
    if len(g) < MIN_POINTS:
        return None
    sigma = float(np.median(np.abs(np.diff(np.log(g), 2)))) / (math.sqrt(6) * _MEDIAN_ABS_NORMAL)
    samples = points["round_samples"] if "round_samples" in points else pd.Series([None] * len(points))
    rounds = [np.log(r) for r in samples.map(_greedy_rounds)]
    spread = [(np.var(r, ddof=1), len(r)) for r in rounds if len(r) >= 2]
    noise = math.nan
    if spread:  # the median point's variance (one slow round moves it little), made a mean again: / the median of
        # chi-square(dof) / dof (Wilson-Hilferty), then the variance of a median of n rounds: pi / 2n of it
        n = int(np.median([k for _, k in spread]))
        dof = n - 1
        variance = float(np.median([v for v, _ in spread])) / (1 - 2 / (9 * dof)) ** 3
        noise = math.sqrt(variance * math.pi / (2 * n))
    out = {"points": len(g), "scatter": math.expm1(1.96 * sigma), "noise": math.expm1(1.96 * noise),
           "drawn": bool(sigma > DRAWN * noise), "slope": math.nan, "slope_ci": [math.nan, math.nan], "r": math.nan}
    fit = _disjoint(points, samples)
    if fit is not None:
        x, y, at_median = fit
        slope, intercept = np.polyfit(x, y, 1)
        residual = y - (intercept + slope * x)
        se = math.sqrt(float(residual @ residual) / (len(x) - 2) / float(((x - x.mean()) ** 2).sum()))
        t = _t95(len(x) - 2)
        adjusted = np.exp(at_median[1] - slope * (at_median[0] - np.median(np.log(g))))
        out |= {"slope": float(slope), "slope_ci": [float(slope - t * se), float(slope + t * se)],
                "r": float(np.corrcoef(x, y)[0, 1]), "with_efficiency": len(x),
                "adjusted": [float(adjusted.min()), float(np.median(adjusted)), float(adjusted.max())]}
    return out


def _disjoint(points: pd.DataFrame, samples: pd.Series) -> tuple | None:
    """Log greedy against log efficiency over the points with both, each from its own rounds: greedy from the odd
    rounds, efficiency from the even ones (the point's efficiency times its even rounds' median speedup over its
    median speedup). Greedy's median sits in a point's efficiency too (its rounds' speedups divide by it), so from
    the same rounds their noise alone tilts the fit (about -0.8 with no draw at all). Also (log greedy, log
    efficiency) of each point as published, for the efficiencies at the median greedy. None under MIN_POINTS."""
    if "efficiency" not in points or "speedup" not in points:
        return None
    e = pd.to_numeric(points.efficiency, errors="coerce").to_numpy(dtype=float)
    speedup = pd.to_numeric(points.speedup, errors="coerce").to_numpy(dtype=float)
    g = pd.to_numeric(points.greedy_tokens_per_s, errors="coerce").to_numpy(dtype=float)
    xs, ys, keep = [], [], []
    for i, raw in enumerate(samples):
        greedy, sp = _rounds(raw), _rounds(raw, "speedup")
        odd, even = greedy[1::2], sp[0::2]
        odd, even = odd[np.isfinite(odd)], even[np.isfinite(even)]
        if not (len(odd) and len(even) and math.isfinite(e[i]) and e[i] > 0 and math.isfinite(speedup[i])
                and speedup[i] > 0):
            continue
        xs.append(math.log(float(np.median(odd))))
        ys.append(math.log(e[i] * float(np.median(even)) / speedup[i]))
        keep.append(i)
    x, y = np.array(xs), np.array(ys)
    if len(x) < MIN_POINTS or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return x, y, (np.log(g[keep]), np.log(e[keep]))


def draws(df: pd.DataFrame):
    """(key, points, draw) of each group of the sweep with enough points for a draw: what the report's lines, its
    finding, its figure and `make bench` read."""
    for key, points in groups(df):
        d = draw(points)
        if d is not None:
            yield key, points, d


def _label(key: dict) -> str:
    """A group's key in words: model, threads, tokens, policy/commit."""
    threads = key.get("threads")
    parts = [f"`{key['model_name']}`" if "model_name" in key else None,
             f"{threads:g} thread{'' if threads == 1 else 's'}" if isinstance(threads, (int, float)) else None,
             f"{key['tokens']:g} tokens" if isinstance(key.get("tokens"), (int, float)) else None,
             f"{key.get('policy')}/{key.get('commit')}" if "policy" in key and "commit" in key else None]
    return " (" + ", ".join(p for p in parts if p) + ")"


def _follows(d: dict) -> str:
    """How far the efficiency follows greedy, in words, or "" where no fit or its CI holds 0."""
    low, high = d["slope_ci"]
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0 <= high:
        return ""
    way = "lower" if d["slope"] < 0 else "higher"
    return (f"efficiency follows the point's greedy (slope {d['slope']:.2f} [{low:.2f}, {high:.2f}] of log efficiency "
            f"on log greedy, each from its own rounds, r = {d['r']:.2f}, {d['with_efficiency']} points): a point whose "
            f"greedy drew 10% faster shows a speedup about {abs(d['slope']) * 10:.0f}% {way}")


def quality_lines(df: pd.DataFrame) -> list[str]:
    """The measurement-quality bullets: each greedy's scatter between points beside its rounds' noise, and how far
    the efficiency follows it."""
    out = []
    for key, _, d in draws(df):
        noise = (f"each point's rounds put ±{d['noise']:.1%} into its median (from their own spread)"
                 if math.isfinite(d["noise"]) else "no round samples say what a point's own noise is")
        text = (f"- Greedy from point to point{_label(key)}: the points, in the order they were measured, scatter by "
                f"±{d['scatter']:.1%} (95%, {d['points']} points; a smooth drift cancels out), where {noise}.")
        if math.isfinite(d["r"]):
            low, mid, high = d["adjusted"]
            text += (f" Efficiency against the point's greedy, each from its own rounds: slope {d['slope']:.2f} "
                     f"[{d['slope_ci'][0]:.2f}, {d['slope_ci'][1]:.2f}], r = {d['r']:.2f} over {d['with_efficiency']} "
                     "points; moved along that "
                     f"line to the median greedy the efficiencies span {low:.2f}-{high:.2f} (median {mid:.2f}; one line "
                     "across the points' configurations: a diagnosis).")
        out.append(text)
    return out


def finding(df: pd.DataFrame) -> list[str]:
    """The warning, before any speedup, where greedy scatters between points by more than DRAWN times what the
    rounds' noise puts into a point: paired rounds inside a point do not hold that draw, and a speedup compared
    across points carries it as far as the efficiency follows it (said where its slope's CI excludes 0)."""
    out = []
    for key, _, d in draws(df):
        if not d["drawn"]:
            continue
        text = (f"- **Points differ by more than their rounds say**{_label(key)}: the same greedy scatters by "
                f"±{d['scatter']:.1%} from point to point, where each point's rounds put ±{d['noise']:.1%} into its "
                "median. Each point's greedy drew a speed of its own (its process, or the machine's state while it ran: "
                "`benchmarks/process_spread.py --inside` tells them apart), which its paired rounds cancel only as far "
                "as the speculative side shares it")
        follows = _follows(d)
        out.append(text + (f"; {follows}. Compare speedups across points with that in mind." if follows else "."))
    return out


def efficiency_against_greedy(df: pd.DataFrame):
    """Each point's efficiency against its greedy tok/s (per greedy with a fit), with the slope `draw` fits on
    disjoint rounds drawn through the cloud's centre: a draw of the baseline the speculative side does not share
    tilts it. None where no greedy has MIN_POINTS points with an efficiency and rounds."""
    drawn = []
    for key, points, d in draws(df):
        if math.isfinite(d["r"]):
            e = pd.to_numeric(points.efficiency, errors="coerce").to_numpy(float)
            has = np.isfinite(e) & (e > 0)
            drawn.append((key, d, points.greedy_tokens_per_s.to_numpy(float)[has], e[has]))
    if not drawn:
        return None
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    for key, d, g, e in drawn:
        ax.scatter(g, e, s=14, label=f"{_label(key).strip(' ()').replace('`', '')}: slope {d['slope']:.2f}")
        x = np.linspace(g.min(), g.max(), 20)  # the fit on disjoint rounds, through the cloud's centre
        ax.plot(x, np.exp(np.log(e).mean() + d["slope"] * (np.log(x) - np.log(g).mean())), lw=1)
    ax.axhline(1.0, color="grey", lw=0.6, ls=":")
    ax.set(xlabel="the point's greedy tok/s", ylabel="efficiency", title="Efficiency against each point's own greedy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
