"""`mtplab compare A B`: two sweeps side by side, points matched by their parameters, as one HTML page."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

from . import store
from .provenance import PARAMETERS, blank_inapplicable, fixed_and_varied, plural
from .result import write_atomic
from .selection import COUNTERS, SLOTS
from .tables import CSS, ci_text

METRICS = ("greedy_tokens_per_s", "tokens_per_s", "speedup")
CHANGED = (0.8, 1.25)  # a tokens/s ratio B/A outside this band marks a point changed (when no CIs are recorded)


def _sweep(folder: Path) -> tuple[dict, pd.DataFrame]:
    if not (folder / "sweep.json").exists() or not (folder / "results.parquet").exists():
        raise ValueError(f"{folder} is not a finished sweep (no sweep.json / results.parquet): run `mtplab sweep` first")
    df = store.load(folder)
    return json.loads((folder / "sweep.json").read_text()), df[df.status != "failed"]


def _counter_columns(df: pd.DataFrame) -> list[str]:
    return [f"slots.{s}.{c}" for s in SLOTS for c in COUNTERS if f"slots.{s}.{c}" in df]


def match(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, list[str], dict]:
    """Points of A and B joined on the parameters both sweeps share (repeats averaged).

    A parameter fixed in each sweep at a different value (backend cpu in A, cuda in B) is left
    out of the key and returned as a difference. Returns (joined table, key, differences).
    """
    fa, _ = fixed_and_varied(a)
    fb, _ = fixed_and_varied(b)
    differ = {p: (fa[p], fb[p]) for p in fa if p in fb and fa[p] != fb[p]}
    key = [p for p in PARAMETERS if p in a and p in b and p not in differ]
    values = [m for m in METRICS if m in a and m in b] + [c for c in _counter_columns(a) if c in b]

    def agg(df: pd.DataFrame) -> pd.DataFrame:
        df = blank_inapplicable(df)[key + values + [c for c in ("speedup_ci", "point_id") if c in df]].copy()
        df[key] = df[key].astype(object).where(df[key].notna(), "")  # NA keys must still match each other
        out = df.groupby(key, dropna=False)[values].mean()
        out["point_id"] = df.groupby(key, dropna=False).point_id.first()
        if "speedup_ci" in df:
            out["speedup_ci"] = df.groupby(key, dropna=False).speedup_ci.first().map(ci_text)
        return out

    joined = agg(a).merge(agg(b), how="outer", left_index=True, right_index=True, suffixes=("_a", "_b")).reset_index()
    joined["only"] = np.where(joined.point_id_a.isna(), "B", np.where(joined.point_id_b.isna(), "A", ""))
    joined["tokens_per_s_ratio"] = joined.tokens_per_s_b / joined.tokens_per_s_a
    joined["speedup_ratio"] = joined.speedup_b / joined.speedup_a
    joined["counters_changed"] = [
        ", ".join(
            f"{c.removeprefix('slots.')} {r[c + '_a']:.0f}&rarr;{r[c + '_b']:.0f}"
            for c in _counter_columns(a)
            if c + "_b" in joined and pd.notna(r[c + "_a"]) and pd.notna(r[c + "_b"]) and r[c + "_a"] != r[c + "_b"]
        )
        for _, r in joined.iterrows()
    ]
    outside = (joined.tokens_per_s_ratio < CHANGED[0]) | (joined.tokens_per_s_ratio > CHANGED[1])
    joined["changed"] = (joined.only == "") & (outside | (joined.counters_changed != ""))
    return joined, key, differ


def _ratio_figure(both: pd.DataFrame, label: pd.Series) -> str:
    """Tokens/s ratio B/A per matched point, as an embedded PNG (horizontal bars; 1 = unchanged)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.32 * len(both) + 1.4))
    colors = ["#d62728" if r < CHANGED[0] else "#2ca02c" if r > CHANGED[1] else "#7f7f7f" for r in both.tokens_per_s_ratio]
    y = np.arange(len(both))
    ax.barh(y, both.tokens_per_s_ratio, color=colors)
    ax.axvline(1.0, color="black", lw=1)
    for lim in CHANGED:
        ax.axvline(lim, color="gray", lw=0.8, ls=":")
    ax.set_yticks(y, label.loc[both.index], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speculative tokens/s, B / A\n(1: unchanged; between the dotted lines: not counted as changed)")
    ax.set_title("What B did to each point's speculative throughput")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return f"<img alt='tokens/s ratio B/A per point' src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'>"


def _label(joined: pd.DataFrame, key: list[str]) -> pd.Series:
    varied = [k for k in key if joined[k].astype(str).nunique() > 1]
    return joined.apply(lambda r: ", ".join(f"{k}={r[k]}" for k in varied if r[k] != "") or "the point", axis=1)


def _num(v, fmt: str) -> str:
    return "" if pd.isna(v) else format(v, fmt)


def _env_line(name: str, folder: Path, sweep: dict) -> str:
    env = sweep.get("env", {})
    return (
        f"<li><b>{name}</b>: <code>{html.escape(str(folder))}</code>, {plural(sweep['points'], 'point')}, "
        f"{html.escape(str(env.get('device')))}, onnxruntime {env.get('onnxruntime')}, mtplab {env.get('mtplab', 'n/a')}, "
        f"git {env.get('git_revision') or 'n/a'}, finished {sweep.get('finished')}, "
        f"load {sweep.get('load_start', 'n/a')} &rarr; {sweep.get('load_end', 'n/a')}</li>"
    )


def compare_html(a_dir: Path, b_dir: Path) -> str:
    """The comparison page: provenance of both, a summary, the ratio figure, matched points, points only in one."""
    sa, a = _sweep(a_dir)
    sb, b = _sweep(b_dir)
    joined, key, differ = match(a, b)
    label = _label(joined, key)
    both = joined[joined.only == ""]
    parts = [
        CSS,
        f"<h1>mtplab compare: <code>{html.escape(b_dir.name)}</code> (B) against "
        f"<code>{html.escape(a_dir.name)}</code> (A)</h1>",
    ]
    parts.append("<ul>" + _env_line("A", a_dir, sa) + _env_line("B", b_dir, sb) + "</ul>")
    if differ:
        parts.append(
            "<p>Fixed parameters that differ (left out of the matching): "
            + html.escape(", ".join(f"{p}: {x} in A, {y} in B" for p, (x, y) in differ.items()))
            + "</p>"
        )
    r = both.tokens_per_s_ratio
    summary = [
        f"{plural(len(both), 'point')} matched by their parameters ({', '.join(key)}); "
        f"{(joined.only == 'A').sum()} only in A, {(joined.only == 'B').sum()} only in B.",
    ]
    if len(both):
        summary.append(
            f"Speculative tokens/s B/A: median {r.median():.2f}x (from {r.min():.2f}x to {r.max():.2f}x); "
            f"speedup over greedy B/A: median {both.speedup_ratio.median():.2f}x."
        )
        summary.append(
            f"{plural(int(both.changed.sum()), 'point')} changed (tokens/s ratio outside "
            f"{CHANGED[0]}-{CHANGED[1]}, or a slot counter differs)."
        )
    parts.append("<p>" + " ".join(summary) + "</p>")
    parts.append(
        "<p><b>How to read this.</b> A point is one parameter combination; repeats are averaged. "
        "<i>ratio</i> is B over A: below 1, B is slower. Each sweep's speedup is over its own greedy baseline, "
        "so a change that slows greedy and speculative alike leaves the speedup ratio near 1 and moves tokens/s. "
        "One run per side is not a measurement of noise: on a shared machine throughput drifts by tens of percent, "
        "so read a ratio near the band's edge as unresolved.</p>"
    )
    if len(both):
        parts.append(_ratio_figure(both, label))
    head = ["point (parameters, A's id)", "changed", "spec tok/s A", "spec tok/s B", "tok/s B/A"]
    head += ["speedup A", "speedup B", "speedup B/A"]
    ci = "speedup_ci_a" in joined or "speedup_ci_b" in joined
    if ci:
        head += ["speedup CI A", "speedup CI B"]
    head.append("counters that changed (A&rarr;B)")
    rows = []
    for i, row in both.sort_values("tokens_per_s_ratio").iterrows():
        cells = [
            f"<td class='id'>{html.escape(label[i])}<br><small>{html.escape(str(row.point_id_a))}</small></td>",
            f"<td class='text'>{'<b>yes</b>' if row.changed else ''}</td>",
            f"<td>{_num(row.tokens_per_s_a, '.1f')}</td><td>{_num(row.tokens_per_s_b, '.1f')}</td>",
            f"<td><b>{_num(row.tokens_per_s_ratio, '.2f')}</b></td>",
            f"<td>{_num(row.speedup_a, '.2f')}</td><td>{_num(row.speedup_b, '.2f')}</td>",
            f"<td><b>{_num(row.speedup_ratio, '.2f')}</b></td>",
        ]
        if ci:
            cells.append(f"<td>{row.get('speedup_ci_a', '') or ''}</td><td>{row.get('speedup_ci_b', '') or ''}</td>")
        cells.append(f"<td class='text'>{row.counters_changed}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("<h2>Matched points</h2><table class='points'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
    parts.append("".join(rows) + "</table>")
    for side in ("A", "B"):
        only = joined[joined.only == side]
        ids = only[f"point_id_{side.lower()}"]
        parts.append(
            f"<h2>Points only in {side}</h2>"
            + ("<ul>" + "".join(f"<li><code>{html.escape(str(p))}</code></li>" for p in ids) + "</ul>" if len(ids) else "<p>none</p>")
        )
    title = f"mtplab compare {html.escape(a_dir.name)} {html.escape(b_dir.name)}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body style='font-family:sans-serif;margin:1.5em;max-width:1240px'>{''.join(parts)}</body></html>"


def make_compare(a: str | Path, b: str | Path, out: str | Path | None = None) -> Path:
    """Write the comparison of sweep B against sweep A (default: <B>/compare-<A's name>.html); returns its path."""
    a_dir, b_dir = Path(a).resolve(), Path(b).resolve()
    page = compare_html(a_dir, b_dir)
    path = Path(out) if out else b_dir / f"compare-{a_dir.name}.html"
    write_atomic(path, page)
    return path
