"""The report's batch section: speedup against the batch B for each k, and the break-even batch where MTP stops
beating greedy, measured and predicted (mtplab.measure.theory.predict_batch, from the calibration at each B)."""

from __future__ import annotations

import json
import math

import matplotlib.pyplot as plt
import pandas as pd

from mtplab.report.plots import _ci_err, _k_color
from mtplab.report.selection import batch_rows
from mtplab.report.selection import batches as selection_batches
from mtplab.sweep import store

SERIES = ["setting", "k", "schedule", "commit"]  # one line per series, drawn against B
PANEL = ["setting", "schedule", "commit"]
MERGED = {"batch", "drafter", "alpha", "seed"}  # B is the axis, the drafter is the setting, seeds are repeats
TABLE_COLUMNS = ("batches", "speedups", "measured break-even", "predicted break-even")  # break_even_table's own


def series_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The batch rows, one per series and B (points repeated at one B: their median), and the series key: SERIES
    plus every other run field that varies among them (policy, tokens, threads, ...), so a line never mixes
    settings. Series with fewer than two batch sizes are left out (nothing to draw against B)."""
    from mtplab.experiment.config import dimensions

    rows = batch_rows(df)
    extra = [d for d in dimensions() if d in rows and d not in MERGED and d not in SERIES and rows[d].nunique() > 1]
    key = SERIES + extra
    if rows.empty:
        return rows, key
    rows = rows.assign(**{c: rows[c].fillna("-") for c in extra})
    sizes = rows.groupby(key).batch.transform("nunique")
    rows = rows[sizes >= 2]
    agg = {"speedup": "median", "speedup_ci": "first", "n": "size"}
    if "predicted.speedup" in rows:  # at alpha: a batch-1 point's own speedup is the price of its steps
        rows = rows.assign(**{"predicted.speedup": rows["predicted.at_alpha"].fillna(rows["predicted.speedup"])}) if (
            "predicted.at_alpha" in rows) else rows
        agg["predicted.speedup"] = "median"
    merged = rows.assign(n=1).groupby(key + ["batch"], as_index=False).agg(
        {c: f for c, f in agg.items() if c in rows or c == "n"})
    if "speedup_ci" in merged:  # one point's interval; none for a median of several
        merged["speedup_ci"] = merged.speedup_ci.where(merged.n == 1, None)
    return merged, key


def _label(r, key: list[str]) -> str:
    return ", ".join(f"{c}={r[c]}" for c in key if c not in SERIES)


def break_even(batch: list[int], speedup: list[float]) -> tuple[float | None, str]:
    """(B where the speedup falls through 1, in words): interpolated in log2 B between the last B at or above 1
    and the first below it; None when it is below greedy from the first B or never falls below 1."""
    pairs = [(b, s) for b, s in sorted(zip(batch, speedup)) if s == s]
    if not pairs:
        return None, "no points"
    if pairs[0][1] < 1.0:
        return None, f"below greedy from B={pairs[0][0]}"
    for (b0, s0), (b1, s1) in zip(pairs, pairs[1:]):
        if s1 < 1.0:
            x = math.log2(b0) + (s0 - 1.0) / (s0 - s1) * (math.log2(b1) - math.log2(b0))
            return 2**x, f"B ~ {2**x:.1f}"
    return None, f"still ahead at B={pairs[-1][0]}"


def break_even_interval(batch: list[int], ci: list) -> str:
    """The break-even batch's 95% interval in words: where the speedup CI's low end falls through 1 (the earliest
    plausible break-even) and where its high end does (the latest); "" where a point has no interval."""
    if not ci or any(not isinstance(c, (list, tuple)) or len(c) != 2 for c in ci):
        return ""
    ends = []
    for side in (0, 1):
        at, text = break_even(batch, [float(c[side]) for c in ci])
        first, last = min(batch), max(batch)
        ends.append(f"{at:.1f}" if at is not None else (f"<= {first}" if text.startswith("below") else f"> {last}"))
    return f" [95% CI {ends[0]}, {ends[1]}]"


def break_even_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per series (drafter setting, k, schedule, commit): the measured and predicted break-even batch."""
    rows, key_cols = series_rows(df)
    out = []
    for key, s in rows.groupby(key_cols):
        s = s.sort_values("batch")
        _, measured = break_even(s.batch.tolist(), s.speedup.tolist())
        if "speedup_ci" in s:
            measured += break_even_interval(s.batch.tolist(), s.speedup_ci.tolist())
        predicted = "no prediction"
        if "predicted.speedup" in s and s["predicted.speedup"].notna().all():
            _, predicted = break_even(s.batch.tolist(), s["predicted.speedup"].tolist())
        out.append(dict(zip(key_cols, key)) | {
            "batches": ", ".join(str(b) for b in s.batch),
            "speedups": ", ".join(f"{v:.2f}" for v in s.speedup),
            "measured break-even": measured, "predicted break-even": predicted})
    return pd.DataFrame(out)


def findings(df: pd.DataFrame) -> str:
    """The break-even batches in words, a line per drafter setting and schedule."""
    table = break_even_table(df)
    if table.empty:
        return ""
    lines = []
    panel_cols = PANEL + [c for c in table.columns if c not in SERIES and c not in TABLE_COLUMNS]
    for panel, t in table.groupby(panel_cols):
        parts = [f"k={r.k}: {r['measured break-even']} (predicted {r['predicted break-even']})" for _, r in t.iterrows()]
        more = "".join(f", {c}={v}" for c, v in zip(panel_cols[3:], panel[3:]))
        lines.append(f"- **{panel[0]}**, {panel[1]}, {panel[2]}{more}: MTP stops beating greedy at " + "; ".join(parts))
    failed = df[(selection_batches(df) > 1) & ~df.status.isin(store.LOSSLESS)] if "status" in df else df.iloc[:0]
    if len(failed):
        lines.append(f"- **{len(failed)} batch point(s) did not pass** (left out of the figure): "
                     + ", ".join(f"`{p}` ({st})" for p, st in zip(failed.point_id, failed.status)))
    return "\n".join(lines)


def speedup_vs_batch(df: pd.DataFrame):
    """Speedup over greedy at the same B against B (log2 axis), a panel per drafter setting and schedule, a line per
    k with its 95% CI; the prediction from the calibration at each B dashed."""
    rows, key_cols = series_rows(df)
    panel_cols = PANEL + [c for c in key_cols if c not in SERIES]
    panels = sorted(rows.groupby(panel_cols).groups)
    cols = min(3, len(panels))
    fig, axes = plt.subplots(math.ceil(len(panels) / cols), cols, figsize=(4.4 * cols, 3.6 * math.ceil(len(panels) / cols)),
                             squeeze=False)
    ks = sorted(rows.k.unique())
    for ax, panel in zip(axes.flat, panels):
        part = rows[(rows[panel_cols] == pd.Series(panel, index=panel_cols)).all(axis=1)]
        setting, schedule, commit = panel[:3]
        for k in ks:
            s = part[part.k == k].sort_values("batch")
            if s.empty:
                continue
            color = _k_color(k, ks)
            yerr = _ci_err(s.speedup, s.speedup_ci) if "speedup_ci" in s else None
            ax.errorbar(s.batch, s.speedup, yerr=yerr, fmt="o-", ms=4, color=color, capsize=2, label=f"k={k}")
            if "predicted.speedup" in s and s["predicted.speedup"].notna().any():
                ax.plot(s.batch, s["predicted.speedup"], "--", color=color, alpha=0.7)
        ax.axhline(1.0, color="gray", lw=1)
        ax.set_xscale("log", base=2)
        bs = sorted(part.batch.unique())
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("batch B (rows decoded together)")
        ax.set_ylabel("speedup over greedy at the same B (x)")
        more = ", ".join(f"{c}={v}" for c, v in zip(panel_cols[3:], panel[3:]))
        ax.set_title(f"{setting}\n{schedule}, {commit}" + (f"\n{more}" if more else ""), fontsize=9)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Where MTP stops paying as the batch grows (solid: measured, dashed: predicted)", fontsize=10)
    fig.tight_layout()
    return fig


def per_row_spread(df: pd.DataFrame) -> pd.DataFrame:
    """Per batch point: the rows' acceptance lengths and tokens/s, lowest to highest (rows accept on their own)."""
    rows = batch_rows(df)
    rows = rows[rows.batch > 1]
    out = []
    for _, r in rows.iterrows():
        extra = r.get("extra")
        detail = ((json.loads(extra) if isinstance(extra, str) else extra or {}).get("batch")) or {}
        acc = [p["acceptance_length"] for p in detail.get("per_row", []) if p.get("acceptance_length") is not None]
        tps = [p["tokens_per_s"] for p in detail.get("per_row", []) if p.get("tokens_per_s") is not None]
        step = detail.get("step_seconds")
        out.append({"point": r.get("point_id", ""), "B": r.batch, "k": r.k, "setting": r.setting,
                    "acceptance length per row": f"{min(acc):.2f}-{max(acc):.2f}" if acc else "-",
                    "tokens/s per row": f"{min(tps):.0f}-{max(tps):.0f}" if tps else "-",
                    "step (ms)": f"{step * 1e3:.2f}" if step is not None else "-"})
    return pd.DataFrame(out)
