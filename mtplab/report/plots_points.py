"""Every point's speedup over greedy with its 95% CI, a row each, fastest first: what a sweep shows whose points
form no grid (a figure over alpha draws one slice of them), and the demo's points at a glance."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mtplab.report.plots import _ci_err
from mtplab.report.provenance import blank_inapplicable, fixed_and_varied
from mtplab.report.selection import timed_points


def labels(df: pd.DataFrame) -> list[str]:
    """Each row by the parameters that vary among the rows (`k=3, alpha=0.7, commit=select`)."""
    _, varied = fixed_and_varied(df)
    shown = blank_inapplicable(df)
    return [", ".join(f"{'model' if p == 'model_name' else p}={row[p]}" for p in varied if pd.notna(row[p]))
            or "the point" for _, row in shown.iterrows()]


def every_point(df: pd.DataFrame):
    """Horizontal: each point's median speedup and its 95% CI; hollow where not stable (half-width above 5%)."""
    rows = timed_points(df)
    rows = rows.assign(label=labels(rows)).sort_values("speedup")
    n = len(rows)
    fig, ax = plt.subplots(figsize=(10.0, 0.3 * n + 1.6))
    centre = rows.speedup.to_numpy(float)
    err = _ci_err(rows.speedup, rows.speedup_ci)  # 0 where a point has no interval
    stable = rows.stable.fillna(False).astype(bool).to_numpy() if "stable" in rows else np.zeros(n, dtype=bool)
    y = np.arange(n)
    for mask, face, name in ((stable, "C0", "stable (CI half-width at most 5%)"), (~stable, "white", "not stable")):
        if mask.any():
            ax.errorbar(centre[mask], y[mask], xerr=err[:, mask], fmt="o", color="C0", mfc=face, capsize=2, label=name)
    ax.axvline(1.0, color="gray", lw=1)
    ax.annotate(" greedy", xy=(1.0, 1.0), xycoords=("data", "axes fraction"), va="bottom", color="gray", fontsize=8)
    ax.set_yticks(y, rows.label)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel("speedup over greedy (x), median of paired rounds, 95% CI")
    lo, hi = min(1.0, float(np.min(centre - err[0]))), max(1.0, float(np.max(centre + err[1])))
    pad = 0.05 * (hi - lo or 1.0)
    ax.set_xlim(lo - pad, hi + pad)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False, fontsize=8)  # above: covers no row
    fig.tight_layout()
    return fig
