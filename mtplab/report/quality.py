"""The report's measurement-quality view: CIs, the calibrated prediction, efficiency, drift and load."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mtplab.experiment.config import defaults
from mtplab.measure import theory
from mtplab.measure.stats import STABLE_HALF_WIDTH
from mtplab.report import baseline
from mtplab.report.plots import _k_color
from mtplab.report.provenance import threads_text
from mtplab.report.selection import parse_json, ran, set_acceptance
from mtplab.report.tables import ci_pair


def _format_table(calib: dict) -> str:
    import warnings

    with warnings.catch_warnings():  # a dependency imports tqdm.auto, which warns inside notebooks
        warnings.simplefilter("ignore")
        from mtplab.experiment.calibration_text import format_table
    return format_table(calib)


def _ci(col: pd.Series) -> np.ndarray:
    """A column of [lo, hi] (lists or JSON text) as an n x 2 float array (NaN where missing)."""
    return np.array([ci_pair(v) for v in col], dtype=float).reshape(-1, 2)


def load_calibration(sweep_dir: str | Path) -> dict:
    """calibration.json beside the sweep: {model name: calibration}; {} when the sweep has none."""
    path = Path(sweep_dir) / "calibration.json"
    return json.loads(path.read_text()) if path.exists() else {}


def speedup_with_ci(df: pd.DataFrame, calibration: dict):
    """Oracle points: measured median speedup with 95% CI bars; predicted curves from the calibration alone (None
    where the sweep has no oracle point: no empty panel)."""
    policy, commit = defaults()["policy"], defaults()["commit"]
    o = set_acceptance(df[(df.policy == policy) & (df.commit == commit)])
    if o.empty:
        return None
    schedules = sorted(o.schedule.unique())
    fig, axes = plt.subplots(1, len(schedules), figsize=(6 * len(schedules), 4), squeeze=False)
    alphas = np.linspace(0.0, 1.0, 51)
    for ax, schedule in zip(axes[0], schedules):
        s = o[o.schedule == schedule]
        for k in sorted(s.k.unique()):
            color = _k_color(k)
            p = s[s.k == k].sort_values("alpha")
            ci = _ci(p.speedup_ci)
            err = np.abs(np.vstack([p.speedup - ci[:, 0], ci[:, 1] - p.speedup]))
            ax.errorbar(p.alpha, p.speedup, yerr=np.nan_to_num(err), fmt="o", color=color, capsize=3, label=f"k={k}")
            calib = calibration.get(p.model_name.iloc[0]) if len(p) else None
            if calib and theory.covers(calib, int(k), commit):
                n = int(p.tokens.iloc[0]) if "tokens" in p else None
                pred = [theory.predict(a, int(k), schedule, commit, calib, tokens=n)["speedup"] for a in alphas]
                ax.plot(alphas, pred, "--", color=color)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=f"{schedule}: measured (95% CI) and predicted (dashed)", xlabel="alpha", ylabel="speedup")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return fig


def efficiency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Efficiency (measured speedup / the calibration's price of the steps each point made) per policy and commit:
    median, range over the points, and the median of the points' own 95% CI bounds; 1 where the cost model accounts
    for everything the run did."""
    m = df[(df.engine == "mtplab") & df.efficiency.notna()]
    if m.empty:
        return pd.DataFrame()
    ci = _ci(m.efficiency_ci)
    m = m.assign(ci_lo=ci[:, 0], ci_hi=ci[:, 1])
    # a batch point's efficiency is priced at its alpha, a batch-1 point's for its steps: never one row
    by = ["policy", "commit"] + (["batch"] if "batch" in m and m.batch.nunique() > 1 else [])
    table = (
        m.groupby(by)
        .agg(points=("efficiency", "size"), median=("efficiency", "median"), lowest=("efficiency", "min"),
             highest=("efficiency", "max"), ci_low=("ci_lo", "median"), ci_high=("ci_hi", "median"))
        .round(3)
    )
    table.columns = ["points", "efficiency (median)", "lowest point", "highest point", "95% CI low (median)",
                     "95% CI high (median)"]
    return table


PHASES = ("decode", "draft", "verify", "commit")


def phase_table(df: pd.DataFrame, calibration: dict) -> pd.DataFrame:
    """Where an efficiency off 1 comes from: each phase's time per step in a point's timed rounds over what the
    calibration prices it at (decode: T(1) per decode; draft: the draft phase of k; verify: T(k+1); commit: the
    commits of the counts the steps kept; each slot's forwards at its replay/fallback mix), and greedy's time per
    token over its calibrated cost, per policy, commit and schedule: medians over the batch-1 points. 1 where a
    phase ran as calibrated; greedy's column is how far the machine itself moved. The prices are the ones the
    point's efficiency used (`predicted.phases`); an older result's are made again from the calibration, at plans
    alone. Diagnosis only: the efficiency reads no time of the point's own. A phase none of the points has (the
    fused schedule's decode) has no column; a cell with nothing to divide (a phase its schedule lacks, a rate not
    measured) reads "—"."""
    if "engine" not in df or "time_split" not in df:
        return pd.DataFrame()
    rows = []
    for _, r in df[df.engine == "mtplab"].iterrows():
        split, prices = _parsed(r.get("time_split")), _stored_prices(r)
        steps = r.get("steps")
        if not isinstance(split, dict) or not steps or steps != steps or int(r.get("batch", 1) or 1) > 1:
            continue
        if prices is None and (prices := _calibrated_prices(r, calibration.get(r.get("model_name")))) is None:
            continue
        greedy_tps = r.get("greedy_tokens_per_s")
        rows.append({"policy": r.policy, "commit": r.commit, "schedule": r.schedule}
                    | {f"{p} / calibrated": _ratio(split.get(p), steps, prices.get(p)) for p in PHASES}
                    | {"greedy / calibrated": _ratio(1.0, greedy_tps, prices.get("greedy"))})
    if not rows:
        return pd.DataFrame()
    t = pd.DataFrame(rows)
    by = ["policy", "commit", "schedule"]
    table = t.groupby(by)[[c for c in t.columns if c.endswith(" / calibrated")]].median().round(2)
    table.insert(0, "points", t.groupby(by).size())
    table = table.dropna(axis=1, how="all")  # a phase no point's schedule has (the fused schedule's decode)
    return table.astype(object).where(table.notna(), "—")


def _parsed(value):
    return json.loads(value) if isinstance(value, str) else value


def _ratio(seconds, per, price) -> float:
    """(seconds / per) / price, NaN where any is missing or zero."""
    try:
        return float(seconds) / float(per) / float(price) if seconds is not None and per and price else np.nan
    except (TypeError, ValueError, ZeroDivisionError):
        return np.nan


def _stored_prices(r) -> dict | None:
    """The phase prices the point's efficiency used (predicted.phases.*, seconds per step), or None (an older result)."""
    names = [f"predicted.phases.{p}" for p in PHASES]
    if not all(n in r and r[n] == r[n] and r[n] is not None for n in names):
        return None
    return {p: r[f"predicted.phases.{p}"] for p in PHASES} | {"greedy": r.get("predicted.greedy_seconds_per_token")}


def _calibrated_prices(r, calib: dict | None) -> dict | None:
    """An older result's phase prices, made again from the calibration at plans alone; None where it cannot."""
    accepted = _parsed(r.get("accepted_per_step"))
    if not calib or not isinstance(accepted, (list, tuple)) or not accepted:
        return None
    try:
        k = int(r.k)
        return theory.step_prices(accepted, k, r.schedule, r.commit, calib) if theory.covers(calib, k, r.commit) else None
    except (KeyError, ValueError, TypeError):  # a schedule not registered here, a calibration without commits
        return None


def quality_markdown(df: pd.DataFrame, sweep: dict, calibration: dict) -> str:
    """Per-point CI width, unstable points, greedy drift over the sweep, load, threads and the calibration (over the
    points that ran: a failed one measured nothing)."""
    df = ran(df)
    ci = _ci(df.speedup_ci)
    width = (ci[:, 1] - ci[:, 0]) / 2 / df.speedup.abs()
    unstable = df[~df.stable.fillna(False).astype(bool)]
    peer = " (the onnxruntime-genai rows included)" if "engine" in df and (df.engine == "ort-genai").any() else ""
    lines = [
        f"- Speedup CI half-width over all {len(df)} points{peer}: median "
        f"{np.nanmedian(width):.1%}, worst {np.nanmax(width):.1%} (stable: at most {STABLE_HALF_WIDTH:.0%}); "
        f"{len(df) - len(unstable)} of {len(df)} stable."
        if len(df) and not np.all(np.isnan(width))
        else "- No speedup CIs in this sweep.",
    ]
    lines += auto_rounds_lines(df)
    if len(unstable):
        shown = ", ".join(f"`{p}`" for p in unstable.point_id[:8])
        more = f" and {len(unstable) - 8} more (the points table has every CI)" if len(unstable) > 8 else ""
        lines.append(f"- Unstable points ({len(unstable)}): {shown}{more}")
    keys = [c for c in ("model_name", "engine", "batch") if c in df and (c != "batch" or df[c].nunique() > 1)]
    groups = list(df.groupby(keys)) if keys else [((), df)]
    for key, part in groups:  # one model on one engine: the same greedy each point (its spread: drift and draws)
        g = part.greedy_tokens_per_s.dropna()
        if len(g):
            values = key if isinstance(key, tuple) else (key,)
            named = [f"batch {v}" if c == "batch" else str(v) for c, v in zip(keys, values)]
            label = f" ({', '.join(named)})" if len(groups) > 1 else ""
            lines.append(
                f"- Greedy tok/s over the sweep's points{label}: min {g.min():.1f}, median {g.median():.1f}, max "
                f"{g.max():.1f} (a spread of {g.max() / g.min() - 1:.0%}; the figure below shows it against time)."
            )
    lines += baseline.quality_lines(df)
    load = [sweep.get("load_start"), sweep.get("load_end")]
    if None not in load:
        lines.append(f"- 1-minute load average at the start {load[0]}, at the end {load[1]}.")
    per_point = sweep.get("threads_per_point")
    lines.append(f"- Threads per point: {'unknown' if per_point is None else threads_text(per_point)}.")
    checks = sweep.get("calibration_check") or {}
    for name, calib in calibration.items():
        lines.extend(calibration_lines(name, calib, checks.get(name)))
        lines.append("\n```\n" + _format_table(calib) + "\n```")
    return "\n".join(lines)


def rounds_outcomes(df: pd.DataFrame) -> pd.DataFrame:
    """Per point with rounds 'auto': how its rounds ended (stopped, rounds, half_width, target, budget_s, seconds)
    and its point_id; empty when no point sized its rounds."""
    if "extra" not in df or df.empty:
        return pd.DataFrame()
    plans = [(e.get("rounds") or {}) if isinstance(e, dict) else {} for e in parse_json(df.extra)]
    rows = [p | {"point_id": i} for p, i in zip(plans, df.point_id) if p.get("mode") == "auto"]
    return pd.DataFrame(rows)


def auto_rounds_lines(df: pd.DataFrame) -> list[str]:
    """How the points with rounds 'auto' ended: within their CI target, or at their time budget (named)."""
    auto = rounds_outcomes(df)
    if auto.empty:
        return []
    within = auto[auto.stopped == "within target"]
    line = f"- Rounds sized automatically on {len(auto)} points: {len(within)} reached the speedup CI target " \
           f"({auto.target.median():.0%} half-width)"
    if len(within):
        line += f" in a median {within.rounds.median():.0f} rounds"
    line += f"; their timed rounds took {auto.seconds.sum():.0f} s in all (budget {auto.budget_s.median():.0f} s a point)."
    out = [line]
    missed = auto[auto.stopped != "within target"]
    if len(missed):
        shown = ", ".join(f"`{p}` ({w:.1%}, {why})" for p, w, why in
                          zip(missed.point_id[:8], missed.half_width, missed.stopped))
        more = f" and {len(missed) - 8} more" if len(missed) > 8 else ""
        out.append(f"- Points that stopped short of the target ({len(missed)}; the half-width reached, and why): "
                   f"{shown}{more}")
    return out


def calibration_lines(name: str, calib: dict, check: dict | None) -> list[str]:
    """Which calibration the predictions used, when and under what load, how the machine moved by the sweep's
    end, and what a fallback costs here."""
    load = calib.get("load")
    out = [
        f"- Calibration of `{name}` (every prediction and efficiency): {calib.get('source', 'cached (an older sweep)')}, "
        f"at {calib.get('measured_at', 'an unrecorded time')}"
        + (f", 1-minute load {load[0]} before and {load[1]} after" if load else ", load not recorded") + "."
    ]
    if check:
        out.append(
            f"- Re-checked at the sweep's end: greedy {1e3 * check['greedy_token_start']:.3f} ms per token at the "
            f"start, {1e3 * check['greedy_token_end']:.3f} ms at the end ({check['drift']:+.1%}, load "
            f"{check.get('load_end')}): predictions are as good as this stability."
            + (" T(M)/T(1) at the start and the end: "
               + ", ".join(f"M={m} {a:.3f} -> {b:.3f}" for m, (a, b) in check["ratios"].items())
               + f" (at most {check['ratio_drift']:+.1%}, at M={check['ratio_drift_m']})." if check.get("ratios") else "")
        )
    eager, target = calib.get("eager") or {}, calib.get("target") or {}
    ms = sorted(target, key=int)
    dips = [(a, b) for a, b in zip(ms, ms[1:]) if target[b] < target[a]]
    if dips:
        ci = calib.get("ci") or {}
        a, b = dips[0]

        def interval(m):
            lo, hi = ci.get(f"target/{m}", [None, None])
            return f"[{1e3 * lo:.3f}, {1e3 * hi:.3f}] ms" if lo is not None and hi is not None else "(no CI)"

        out.append(
            f"- T({b}) < T({a}) in the calibration ({1e3 * target[b]:.3f} vs {1e3 * target[a]:.3f} ms; CIs {interval(b)} "
            f"and {interval(a)}): a wider forward is not slower here where the CIs overlap (noise, or a kernel "
            "that blocks the wider product better); predictions use the medians as measured."
        )
    if eager:
        ratios = [eager[m] / target[m] for m in sorted(eager, key=int) if m in target]
        out.append(
            f"- What a fallback costs on this backend: an eager forward (outside a plan) takes {min(ratios):.2f}-"
            f"{max(ratios):.2f}x a replayed one at M = 1..{len(ratios)} (on the CPU a plan saves only the binding; "
            "on a GPU it saves the kernel launches); predictions price each point's own replay/fallback mix."
        )
    return out


def drift(df: pd.DataFrame):
    """Greedy tok/s of each point against when it was measured: the machine's drift over the sweep."""
    fig, ax = plt.subplots(figsize=(6, 3))
    env = df["env"] if "env" in df else pd.Series(dtype=object)
    t = pd.to_numeric(env.map(lambda e: (json.loads(e) if isinstance(e, str) else e or {}).get("measured_at")))
    ok = t.notna() & df.greedy_tokens_per_s.notna()
    if ok.any():
        ci = _ci(df.greedy_tokens_per_s_ci[ok])
        x = (t[ok] - t[ok].min()) / 60
        y = df.greedy_tokens_per_s[ok]
        err = np.abs(np.vstack([y - ci[:, 0], ci[:, 1] - y]))
        ax.errorbar(x, y, yerr=np.nan_to_num(err), fmt="o", capsize=2)
    ax.set(xlabel="minutes into the sweep", ylabel="greedy tok/s (95% CI)", title="Greedy throughput over the sweep")
    fig.tight_layout()
    return fig

