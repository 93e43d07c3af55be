"""The sampling figures: acceptance and speedup against temperature, and rejection sampling's expected
acceptance against the measured one (plots.py holds the others and the shared look)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mtplab.report.plots import _ci_err, _k_color
from mtplab.report.plots_head import wilson
from mtplab.report.selection import SAMPLED, one_series, sampled_rows, temperature_rows, temperatures


def vs_temperature(df: pd.DataFrame):
    """Draft acceptance and speedup against the sampling temperature, a line per k: mtplab's MTP head solid,
    onnxruntime-genai's MtpGenerator dashed (temperature 0 is greedy decoding)."""
    rows, shown = one_series(temperature_rows(df))
    rows = rows.assign(temperature=temperatures(rows))
    engine = rows.engine if "engine" in rows else pd.Series("mtplab", index=rows.index)
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.8))
    panels = (("draft_acceptance", "draft acceptance (accepted / drafted)"),
              ("speedup", "speedup over the same engine's greedy (x)\nmedian of paired rounds, 95% CI"))
    for ax, (metric, ylabel) in zip(axes, panels):
        for who, style in (("mtplab", "o-"), ("ort-genai", "s--")):
            mine = rows[engine == who]
            for k in sorted(mine.k.unique()):
                s = mine[mine.k == k].sort_values("temperature")
                label = f"k={k}" + (" onnxruntime-genai" if who == "ort-genai" else "")
                if metric == "speedup" and "speedup_ci" in s:
                    err = _ci_err(s[metric], s.speedup_ci)
                elif {"accepted", "drafted"} <= set(s):  # 95% Wilson interval over the drafts judged
                    err = np.abs(wilson(s.accepted.to_numpy(float), s.drafted.to_numpy(float)) - s[metric].to_numpy())
                else:
                    err = None
                ax.errorbar(s.temperature, s[metric], yerr=None if err is None else np.nan_to_num(err), fmt=style,
                            ms=4, color=_k_color(k), capsize=2, label=label)
        if metric == "speedup":
            ax.axhline(1.0, color="gray", lw=1)
        ax.set_xlabel("temperature (0: greedy; > 0: rejection sampling)")
        ax.set_ylabel(ylabel)
    axes[0].set_title("Draft acceptance against temperature" + (f"\n({shown})" if shown else ""))
    axes[1].set_title("Speedup against temperature")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return fig


def expected_vs_measured(df: pd.DataFrame):
    """Rejection sampling's measured acceptance (kept / judged drafts of each sampled point's checked run) against
    its expectation sum(min(p, q)) over the same drafts: on the diagonal when drafts are kept at the rule's rate.
    Bars: 95% binomial intervals around the expectation (a judged draft is kept with probability e_j)."""
    rows = sampled_rows(df)
    rows = rows.assign(temperature=temperatures(rows))
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    markers = {"mtp": ("*", "MTP head"), "oracle": ("o", "oracle mixture")}
    temps = sorted(rows.temperature.unique())
    colors = {t: plt.cm.viridis(0.8 * i / max(len(temps) - 1, 1)) for i, t in enumerate(temps)}  # no pale yellow
    for (drafter, t), s in rows.groupby(["drafter", "temperature"]):
        e, m, j = (s[SAMPLED + c].to_numpy(float) for c in ("expected", "measured", "judged"))
        marker, name = markers.get(drafter, ("s", drafter))
        ax.errorbar(e, m, yerr=1.96 * np.sqrt(e * (1 - e) / np.maximum(j, 1)), fmt=marker, ms=7 if marker == "*" else 5,
                    color=colors[t], capsize=2, label=f"{name}, T={t:g}")
    ax.plot([0, 1], [0, 1], color="gray", lw=1, ls="--")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("expected acceptance: mean sum(min(p, q)) over judged drafts")
    ax.set_ylabel("measured: kept / judged drafts")
    ax.set_title("Rejection sampling keeps drafts at the rate it should")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
