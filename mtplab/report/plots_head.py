"""The MTP head's acceptance where it varies with the text: by context length (with the model's training rows
marked) and by prompt kind, per draft position, each with its interval; and its speedup against the cost model's
price at that acceptance (plots.py holds the shared look)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mtplab.measure.stats import CONFIDENCE, RESAMPLES
from mtplab.report.plots import _ci_err, _k_color
from mtplab.report.selection import context_rows, head_prediction_rows, kind_rows, parse_json


def position_counts(accepted_per_step, k: int) -> np.ndarray:
    """[steps with accepted >= i for i = 1..k, steps]: one run's per-position acceptance as counts."""
    acc = np.asarray(accepted_per_step, dtype=int)
    return np.array([*(int((acc >= i).sum()) for i in range(1, k + 1)), len(acc)])


def pooled_by_prompt(counts: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-position acceptance pooled over runs (rows of `counts`, one prompt each: position_counts), and its 95%
    interval from resampling the prompts (the unit that varies: steps of one text are not independent).
    Returns (k,) estimates and (2, k) bounds; one prompt gives no interval (NaN)."""
    est = counts[:, :-1].sum(0) / max(counts[:, -1].sum(), 1)
    if len(counts) < 2:
        return est, np.full((2, len(est)), np.nan)
    pick = np.random.default_rng(seed).integers(0, len(counts), (RESAMPLES, len(counts)))
    drawn = counts[pick].sum(1)                                   # [resamples, k + 1]
    ratios = drawn[:, :-1] / np.maximum(drawn[:, -1:], 1)
    tail = (1 - CONFIDENCE) / 2 * 100
    return est, np.percentile(ratios, [tail, 100 - tail], axis=0)


def wilson(hits: np.ndarray, n: np.ndarray, z: float = 1.96) -> np.ndarray:
    """95% Wilson score bounds (2, len) of hits / n."""
    n = np.maximum(n, 1)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return np.clip(np.vstack([centre - half, centre + half]), 0.0, 1.0)


def training_context(model: str) -> int | None:
    """The token length of the rows the model was trained on, from its folder's model_card.json (None if unknown)."""
    card = Path(model) / "model_card.json"
    if not card.is_file():
        return None
    return json.loads(card.read_text()).get("training", {}).get("context_tokens")


def _counts(rows: pd.DataFrame, k: int) -> np.ndarray:
    return np.stack([position_counts(a, k) for a in parse_json(rows.accepted_per_step)])


def by_context(df: pd.DataFrame):
    """P(accepted >= i) against the prompt's context length, a line per draft position i, pooled over the prompts at
    each length (95% interval over prompts); the model's training row length dashed."""
    rows = context_rows(df)
    k = int(rows.k.max())
    rows = rows[rows.k == k]
    lengths = sorted(rows.context.unique())
    table = {c: pooled_by_prompt(_counts(rows[rows.context == c], k)) for c in lengths}
    fig, ax = plt.subplots(figsize=(7.0, 3.9))
    x = np.array(lengths, dtype=float)
    for i in range(k):
        est = np.array([table[c][0][i] for c in lengths])
        lo_hi = np.array([table[c][1][:, i] for c in lengths]).T
        err = np.nan_to_num(np.abs(lo_hi - est))
        ax.errorbar(x * (1 + 0.03 * (i - (k - 1) / 2)), est, yerr=err, fmt="o-", ms=4, capsize=2,
                    color=_k_color(i + 1), label=f"position {i + 1}")
    trained = training_context(rows.model.iloc[0])
    if trained:
        ax.axvline(trained, color="grey", ls="--", lw=1)
        ax.text(trained, 0.02, f" trained on {trained}-token rows", fontsize=8, color="grey", va="bottom")
    prompts = rows.groupby("context").size()
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [str(int(c)) for c in lengths])
    ax.set_ylim(0, 1.05)
    ax.set(xlabel="context: prompt tokens before the text the run continues",
           ylabel="P(accepted >= i)",
           title=f"Acceptance by context length, k={k} ("
                 + (f"{prompts.min()}" if prompts.min() == prompts.max() else f"{prompts.min()}-{prompts.max()}")
                 + " prompts a length)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def by_kind(df: pd.DataFrame):
    """P(accepted >= i) by draft position, a line per prompt kind, at the largest k each kind was run at (the kinds'
    steps pooled over their points; 95% Wilson interval over verify steps)."""
    rows = kind_rows(df)
    fig, ax = plt.subplots(figsize=(7.0, 3.9))
    for n, (kind, s) in enumerate(sorted(rows.groupby("prompts"))):
        k = int(s.k.max())
        c = _counts(s[s.k == k], k).sum(0)
        pos = np.arange(1, k + 1)
        est = c[:-1] / max(c[-1], 1)
        err = np.abs(wilson(c[:-1], np.full(k, c[-1])) - est)
        ax.errorbar(pos + 0.04 * (n - 1.5), est, yerr=err, fmt="o-", ms=4, capsize=2, label=f"{kind} ({c[-1]} steps)")
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.set(xlabel="draft position i", ylabel="P(accepted >= i)", title="Acceptance by draft position and prompt kind")
    ax.legend(fontsize=8, title="prompt set", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    fig.tight_layout()
    return fig


COMMIT_MARKERS = ("o", "s", "^", "D", "v", "P")


def against_prediction(df: pd.DataFrame):
    """Each MTP-head point's measured speedup (95% CI) against what the calibrated cost model prices for the steps it
    made at the acceptance the head gave it: a marker per commit, a colour per k; on the diagonal, efficiency 1."""
    from matplotlib.lines import Line2D

    rows = head_prediction_rows(df)
    fig, ax = plt.subplots(figsize=(7.6, 4.6))
    commits, ks = sorted(rows.commit.unique()), sorted(rows.k.unique())
    for m, commit in zip(COMMIT_MARKERS, commits):
        for k, s in rows[rows.commit == commit].groupby("k"):
            ax.errorbar(s["predicted.speedup"], s.speedup, yerr=_ci_err(s.speedup, s.speedup_ci), fmt=m, ms=6,
                        capsize=2, color=_k_color(k), mec="black", mew=0.5)
    lo = min(rows["predicted.speedup"].min(), rows.speedup.min()) * 0.9
    hi = max(rows["predicted.speedup"].max(), rows.speedup.max(), 1.0) * 1.08
    ax.plot([lo, hi], [lo, hi], ":", color="grey", lw=1)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="predicted speedup (calibrated costs, the steps the head's acceptance "
           "made)", ylabel="measured speedup (median of paired rounds)")
    ax.set_title("The head at its own acceptance against the cost model (dotted: measured = predicted)", fontsize=10)
    by_commit = [Line2D([], [], ls="", marker=m, color="grey", mec="black", label=c) for m, c in zip(COMMIT_MARKERS,
                                                                                                     commits)]
    by_k = [Line2D([], [], ls="", marker="o", color=_k_color(k), label=f"k={k}") for k in ks]
    first = ax.legend(handles=by_commit, title="commit", fontsize=8, title_fontsize=8, loc="upper left",
                      bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.add_artist(first)
    ax.legend(handles=by_k, title="drafts per step", fontsize=8, title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 0.55), frameon=False)
    fig.tight_layout()
    return fig
