"""Tables of a sweep for reports: the points (HTML readable at 1280 px, and CSV) and the slot counters."""

from __future__ import annotations

import base64
import html
import json

import numpy as np
import pandas as pd

from mtplab.report.provenance import blank_inapplicable, fixed_and_varied
from mtplab.report.selection import COUNTERS, measured_acceptance, timed_points

METRICS = {
    "greedy_tokens_per_s": "greedy tok/s",
    "tokens_per_s": "spec tok/s",
    "speedup": "speedup",
    "theory.speedup": "theory",
    "acceptance_length": "accept. length",
    "draft_acceptance": "draft accept.",
    "lossless": "lossless",
}
CSS = """<style>
table.points, table.provenance, table.counters {border-collapse: collapse; font-size: 12px; width: auto !important;
  max-width: 1220px; margin: 0.5em 0 !important; table-layout: auto}
table.points td, table.points th, table.counters td, table.counters th, table.provenance td, table.provenance th
  {padding: 2px 6px !important; border-bottom: 1px solid #ddd; text-align: right !important; vertical-align: top}
table.provenance th, table.provenance td, table.points td.text, table.counters td.text,
  table.points th, table.counters th {text-align: left !important}
table.provenance th, table.points td.text, table.counters td.text {white-space: nowrap}
table.points th {white-space: normal; max-width: 90px}
table.points td.id {text-align: left !important; word-break: break-all; min-width: 280px; max-width: 330px; font-family: monospace;
  font-size: 11px}
</style>"""


def count_text(v: float) -> str:
    """A counter as an integer; a mean over repeats keeps one decimal."""
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def ci_pair(value) -> tuple[float, float]:
    """A confidence interval [low, high] (a list, JSON text or dict with low/high) as two floats; NaN where absent.

    The one reader of a stored CI: tables, findings, figures and compare all take theirs from here.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if isinstance(value, dict):
        value = [value.get("low"), value.get("high")]
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) == 2:
        return tuple(float("nan") if v is None else float(v) for v in value)
    return float("nan"), float("nan")


def ci_text(value) -> str:
    """A confidence interval as text ('0.95-1.05'); '' when absent."""
    lo, hi = ci_pair(value)
    return f"{lo:.2f}-{hi:.2f}" if np.isfinite(lo) and np.isfinite(hi) else ""


def points_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Every point with its varied parameters and its metrics (inapplicable cells empty), sorted by id."""
    _, varied = fixed_and_varied(df)
    # the verdict and the answer beside the status, on the first screen however many parameters varied
    first = [m for m in ("lossless", "speedup") if m in METRICS and m in df]
    cols = ["point_id", "status", *first, *varied, *[m for m in METRICS if m in df and m not in first]]
    t = blank_inapplicable(df)[[c for c in cols if c in df]].copy()
    if "speedup_ci" in df:
        t.insert(t.columns.get_loc("speedup") + 1, "speedup_ci", df["speedup_ci"].map(ci_text))
    return t.sort_values("point_id").reset_index(drop=True)


def _cell(column: str, value) -> str:
    if value is None or (not isinstance(value, (list, str, dict)) and pd.isna(value)):
        return "<td></td>"
    if column == "point_id":
        return f"<td class='id'>{html.escape(value)}</td>"
    if isinstance(value, (bool, np.bool_)):
        return f"<td class='text'>{'yes' if value else '<b>NO</b>'}</td>"
    if isinstance(value, (int, np.integer)):
        return f"<td>{value}</td>"
    if isinstance(value, (float, np.floating)):
        text = f"{value:.0%}" if column == "draft_acceptance" else f"{value:.2f}"
        return f"<td>{text}</td>"
    return f"<td class='text'>{html.escape(str(value))}</td>"


def points_html(df: pd.DataFrame) -> str:
    """The points table as HTML (full ids wrapped, parameters fixed for the sweep left to the header) and a CSV link."""
    t = points_frame(df)
    names = {"point_id": "point", "speedup_ci": "speedup CI", **METRICS}
    head = "".join(f"<th>{html.escape(names.get(c, c))}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(_cell(c, v) for c, v in r.items()) + "</tr>" for _, r in t.iterrows())
    csv = base64.b64encode(csv_text(df).encode()).decode()
    link = (
        f"<p><a download='points.csv' href='data:text/csv;base64,{csv}'>Download every point as CSV</a> "
        "(all parameters and metrics, one row per point). Parameters the same for every point are in the header, "
        "not repeated here; an empty cell does not apply to that row.</p>"
    )
    return CSS + link + f"<table class='points'><tr>{head}</tr>{body}</table>"


def csv_text(df: pd.DataFrame) -> str:
    """Every point, every flat column (JSON detail left out), inapplicable cells empty."""
    keep = [c for c in df.columns if df[c].map(lambda v: not (isinstance(v, str) and v[:1] in "[{")).all()]
    return blank_inapplicable(df[keep]).sort_values("point_id").to_csv(index=False)


def counters_html(long: pd.DataFrame) -> str:
    """Slot counters per policy x commit as integers (a mean over repeats keeps one decimal)."""
    if long.empty:
        return ""
    idx = ["policy", "commit"] if "commit" in long else ["policy"]
    wide = long.pivot_table(index=idx, columns="slot", values=list(COUNTERS), aggfunc="mean")
    slots = [s for s in ("primary", "verify", "mtp") if s in set(long.slot)]
    wide = wide.swaplevel(0, 1, axis=1)[[(s, c) for s in slots for c in COUNTERS]]
    head = "".join(f"<th>{h}</th>" for h in idx) + "".join(f"<th>{s} {c}</th>" for s, c in wide.columns)
    rows = []
    for key, r in wide.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        cells = "".join(f"<td class='text'>{html.escape(str(k))}</td>" for k in key)
        cells += "".join(f"<td>{'' if pd.isna(v) else count_text(v)}</td>" for v in r)
        rows.append(f"<tr>{cells}</tr>")
    return CSS + f"<table class='counters'><tr>{head}</tr>{''.join(rows)}</table>"


def head_table(df: pd.DataFrame) -> pd.DataFrame:
    """The MTP head's points, mtplab's and the onnxruntime-genai peer's, a row each: prompt set, temperature, k,
    engine, commit; acceptance per position, tokens/step, draft acceptance, speedup [95% CI], efficiency, and what
    the tokens were checked against. Sorted so that a peer row sits under mtplab's at the same text, T and k."""
    rows = timed_points(measured_acceptance(df))
    if not len(rows):
        return pd.DataFrame()
    engine = rows.engine if "engine" in rows else pd.Series("mtplab", index=rows.index)
    temperature = rows.temperature.fillna(0.0) if "temperature" in rows else pd.Series(0.0, index=rows.index)
    prompts = rows.prompts.fillna("") if "prompts" in rows else pd.Series("", index=rows.index)
    peer = engine != "mtplab"
    positions = rows.acceptance_per_position.map(lambda v: json.loads(v) if isinstance(v, str) else v)
    drafted = [_deepest(ks, k) for ks, k in zip(rows.get("k_per_step", pd.Series(None, index=rows.index)), rows.k)]
    out = pd.DataFrame({
        "text": prompts.replace("", "random"),
        "T": temperature.map(lambda t: f"{t:g}"),
        "k": rows.k.astype(int),
        "engine": engine,
        "commit": rows.commit.where(~peer, "(genai's)"),
        "P(acc >= i), i = 1..k": [" ".join(f"{v:.2f}" if i < deepest else "-" for i, v in enumerate(p)) if len(p)
                                  else "n/a" for p, deepest in zip(positions, drafted)],
        "tokens/step": rows.tokens_per_step.map(lambda v: f"{v:.2f}"),
        "draft accept.": rows.draft_acceptance.map(lambda v: f"{v:.0%}"),
        "speedup [95% CI]": [f"{s:.2f} [{lo:.2f}, {hi:.2f}]" for s, (lo, hi) in
                             zip(rows.speedup, map(ci_pair, rows.speedup_ci))],
        "efficiency": [f"{e:.2f}" if np.isfinite(e) else "n/a" for e in pd.to_numeric(rows.efficiency, errors="coerce")
                       .astype(float)] if "efficiency" in rows else "n/a",
        "tokens": [_tokens_text(t, ok, p) for t, ok, p in zip(temperature, rows.lossless.fillna(False).astype(bool),
                                                               peer)],
    })
    if "schedule" in rows and rows.schedule[~peer].nunique() > 1:  # the peer runs genai's own step
        out.insert(4, "schedule", rows.schedule.where(~peer, "-").to_numpy())
    if "k_policy" in rows and (rows.k_policy.fillna("fixed") != "fixed").any():  # K chosen per step: say by whom
        named = [f"{kp} {c:g}" if kp == "confidence" else kp for kp, c in
                 zip(rows.k_policy.fillna("fixed"), rows.get("k_confidence", pd.Series(0.0, index=rows.index)))]
        out.insert(3, "k_policy", pd.Series(named, index=rows.index).where(~peer, "-").to_numpy())
    order = [c for c in ("text", "T", "k", "engine", "schedule", "commit") if c in out]
    return out.sort_values(order, kind="stable").reset_index(drop=True)


def _deepest(ks, k: int) -> int:
    """The deepest draft position a point's steps reached (its k_per_step's largest; k where it stores none)."""
    ks = json.loads(ks) if isinstance(ks, str) else ks
    return max(ks) if isinstance(ks, list) and ks else int(k)


def _tokens_text(temperature: float, lossless: bool, peer: bool) -> str:
    if temperature > 0:
        return "sampled: not compared (genai's sampler)" if peer else "sampled: state and KV follow them"
    return "identical to greedy" if lossless else "DIFFER from greedy"
