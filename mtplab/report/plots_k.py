"""Draft-length policies side by side: each policy's speedup (95% CI) against the best fixed K found in hindsight on
the same prompts and temperature, and the K each chose per step (a histogram)."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mtplab.report.plots import _ci_err, _k_color
from mtplab.report.selection import k_policy_rows, temperatures


def k_chosen(row) -> list[int]:
    """The drafts each step of a point made: its k_per_step, or k every step (the fixed policy stores none)."""
    ks = row.get("k_per_step")
    ks = json.loads(ks) if isinstance(ks, str) else ks
    if ks is None or (not isinstance(ks, list) and pd.isna(ks)) or not len(ks):
        return [int(row["k"])] * len(json.loads(row["accepted_per_step"]) if isinstance(row["accepted_per_step"], str)
                                     else row["accepted_per_step"])
    return [int(j) for j in ks]


def label(row) -> str:
    """A point's policy in words: 'fixed K=3', 'probe (K<=4)', 'confidence 0.5 (K<=4, padded)' (a padded Verify
    plan)."""
    if row["k_policy"] == "fixed":
        return f"fixed K={int(row['k'])}"
    extra = f" {row['k_confidence']:g}" if row["k_policy"] == "confidence" else ""
    padded = ", padded" if row.get("verify_plans") == "padded" else ""
    return f"{row['k_policy']}{extra} (K<={int(row['k'])}{padded})"


def _groups(rows: pd.DataFrame) -> list:
    """The points by text and temperature, and by commit where the sweep has more than one (each group has its own
    best fixed K): [((text, T, commit or None), points)]."""
    commits = rows.commit if "commit" in rows and rows.commit.nunique() > 1 else pd.Series("", index=rows.index)
    return [((text, t, commit or None), g) for (text, t, commit), g in
            rows.groupby([rows.prompts.fillna(""), "T", commits])]


def policy_table(df: pd.DataFrame) -> pd.DataFrame:
    """A row per point: text, temperature, policy (and commit, where the sweep has several), speedup [CI], tokens/s,
    mean K, and the best fixed K of the same text, temperature and commit (in hindsight: the fastest fixed-K point
    of the sweep) with its speedup."""
    rows = k_policy_rows(df).assign(T=lambda d: temperatures(d))
    out = []
    for (text, t, commit), g in _groups(rows):
        fixed = g[g.k_policy == "fixed"]
        best = fixed.loc[fixed.speedup.idxmax()] if len(fixed) else None
        for _, r in g.sort_values(["k_policy", "k"]).iterrows():
            ks = k_chosen(r)
            lo, hi = (json.loads(r.speedup_ci) if isinstance(r.speedup_ci, str) else r.speedup_ci) or (np.nan, np.nan)
            out.append({"text": text or "random", "T": f"{t:g}", **({"commit": commit} if commit else {}),
                        "policy": label(r),
                        "speedup [95% CI]": f"{r.speedup:.2f} [{lo:.2f}, {hi:.2f}]",
                        "tok/s": f"{r.tokens_per_s:.0f}", "mean K": f"{np.mean(ks):.2f}",
                        "best fixed K (hindsight)": "" if best is None else
                        f"K={int(best.k)}: {best.speedup:.2f}x"})
    return pd.DataFrame(out)


def policies(df: pd.DataFrame):
    """Per text and temperature: each policy's speedup with its interval, the best fixed K dashed; beside it the
    share of steps at each K."""
    rows = k_policy_rows(df).assign(T=lambda d: temperatures(d))
    groups = _groups(rows)
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 2.2 + 0.32 * max(len(g) for _, g in groups) * len(groups)),
                             squeeze=False)
    kmax = int(rows.k.max())
    for (key, g), (left, right) in zip(groups, axes):
        g = g.sort_values(["k_policy", "k"]).reset_index(drop=True)
        names = [label(r) for _, r in g.iterrows()]
        y = np.arange(len(g))
        left.errorbar(g.speedup, y, xerr=_ci_err(g.speedup, g.speedup_ci), fmt="o", capsize=3, color="black")
        fixed = g[g.k_policy == "fixed"]
        if len(fixed):
            best = fixed.speedup.max()
            left.axvline(best, color="tab:blue", ls="--", lw=1)
            left.text(best, -0.45, " best fixed K", color="tab:blue", fontsize=8, va="bottom")
        left.axvline(1.0, color="grey", lw=0.8, ls=":")
        left.set_yticks(y, names, fontsize=8)
        left.set_xlabel("speedup over greedy (median of paired rounds, 95% CI)")
        left.set_title(f"{key[0] or 'random prompts'}, T={key[1]:g}" + (f", commit={key[2]}" if key[2] else ""),
                       fontsize=9)
        share = np.zeros((len(g), kmax))
        for i, (_, r) in enumerate(g.iterrows()):
            ks = k_chosen(r)
            for j in range(1, kmax + 1):
                share[i, j - 1] = ks.count(j) / max(len(ks), 1)
        base = np.zeros(len(g))
        for j in range(kmax):
            right.barh(y, share[:, j], left=base, color=_k_color(j + 1), label=f"K={j + 1}")
            base += share[:, j]
        right.set_yticks(y, [""] * len(g))
        right.set_xlim(0, 1)
        right.set_xlabel("share of steps at each K (the last timed run)")
    axes[0][1].legend(ncol=kmax, fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.08), frameon=False)
    fig.tight_layout()
    return fig
