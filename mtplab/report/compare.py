"""`mtplab compare A B`: two sweeps side by side, points matched by their parameters, as one HTML page."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

from mtplab.base.files import write_atomic
from mtplab.measure import stats
from mtplab.report import selection
from mtplab.report.provenance import PARAMETERS, blank_inapplicable, fixed_and_varied, plural
from mtplab.report.selection import COUNTERS, SLOTS
from mtplab.report.tables import CSS, ci_pair, ci_text
from mtplab.sweep import store

METRICS = ("greedy_tokens_per_s", "tokens_per_s", "speedup")
CHANGED = (0.8, 1.25)  # without CIs (one-round points, older sweeps): a speedup ratio B/A outside this band
# Two independent 95% CIs of equal width miss each other by chance with probability P(|Z| > 1.96 * sqrt(2)):
INTERVAL_FALSE_ALARM = 0.0056


def _interval(value) -> tuple[float, float] | None:
    """A stored CI as (low, high), or None where it is absent or not finite."""
    lo, hi = ci_pair(value)
    return (lo, hi) if np.isfinite(lo) and np.isfinite(hi) else None


def rounds_interval(samples) -> tuple[float, float] | None:
    """A 95% t interval of a point's speedup (the geometric mean of its paired rounds' ratios), or None.

    The rounds' log ratios are averaged, and the interval's width comes from their spread with the t
    quantile of n - 1 degrees of freedom: with 3-5 rounds it is honest where a bootstrap of the median
    is too narrow (two runs of identical code: 2 of 39 bootstrap CIs missed each other, 0 of these).
    """
    if isinstance(samples, str):
        try:
            samples = json.loads(samples)
        except ValueError:
            return None
    if not isinstance(samples, list):  # absent (NaN in an outer join), or not rounds
        return None
    return stats.ratio_interval([s.get("speedup") for s in samples if isinstance(s, dict) and s.get("speedup")])


def speedup_changed(ci_a, ci_b, ratio: float, rounds_a=None, rounds_b=None) -> tuple[bool, str]:
    """Whether a point's speedup changed from A to B, and by which test.

    The speedup is each sweep's paired ratio over its own greedy (it survives the machine's drift that
    moves absolute tokens/s between two sweeps); it changed where the two 95% intervals do not overlap:
    t intervals from the rounds where both sides kept them (`rounds_interval`), else the stored CIs. A
    point with neither on both sides falls back to its ratio leaving CHANGED.
    """
    a, b = rounds_interval(rounds_a), rounds_interval(rounds_b)
    test = "rounds"
    if a is None or b is None:
        a, b, test = _interval(ci_a), _interval(ci_b), "CIs"
    if a is not None and b is not None:
        return (a[1] < b[0] or b[1] < a[0]), test
    return bool(ratio < CHANGED[0] or ratio > CHANGED[1]), "band"


def _sweep(folder: Path) -> tuple[dict, pd.DataFrame]:
    summary = store.read_summary(folder)
    return summary, selection.ran(store.load(folder))


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
        df = blank_inapplicable(df)[key + values + [c for c in ("speedup_ci", "round_samples", "point_id") if c in df]].copy()
        df[key] = df[key].astype(object).where(df[key].notna(), "")  # NA keys must still match each other
        out = df.groupby(key, dropna=False)[values].mean()
        out["point_id"] = df.groupby(key, dropna=False).point_id.first()
        for extra in ("speedup_ci", "round_samples"):
            if extra in df:
                out[extra] = df.groupby(key, dropna=False)[extra].first()
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
    tests = [
        speedup_changed(r.get("speedup_ci_a"), r.get("speedup_ci_b"), r.speedup_ratio, r.get("round_samples_a"),
                        r.get("round_samples_b"))
        for _, r in joined.iterrows()
    ]
    joined["speedup_changed"] = [t[0] for t in tests]
    joined["test"] = [t[1] for t in tests]
    joined["changed"] = (joined.only == "") & (joined.speedup_changed | (joined.counters_changed != ""))
    return joined, key, differ


def _ratio_figure(both: pd.DataFrame, label: pd.Series) -> str:
    """Each matched point's speedup in A and B with their 95% CIs, as an embedded PNG (red: the CIs miss each other)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.36 * len(both) + 1.6))  # the labels come on top: the page holds ~12.5 in
    y = np.arange(len(both))
    for side, dy, color in (("a", -0.15, "#1f77b4"), ("b", 0.15, "#ff7f0e")):
        values = both[f"speedup_{side}"].to_numpy(float)
        none = pd.Series([None] * len(both), index=both.index)
        cis = [rounds_interval(r) or _interval(c)
               for r, c in zip(both.get(f"round_samples_{side}", none), both.get(f"speedup_ci_{side}", none))]
        # the rounds' t interval is centred on their mean: a median outside it draws no bar on that side
        lo = [max(0.0, v - c[0]) if c else 0.0 for v, c in zip(values, cis)]
        hi = [max(0.0, c[1] - v) if c else 0.0 for v, c in zip(values, cis)]
        ax.errorbar(values, y + dy, xerr=[lo, hi], fmt="o", color=color, ms=4, capsize=2, label=side.upper())
    for i, changed in enumerate(both.speedup_changed):
        if changed:
            ax.axhspan(i - 0.45, i + 0.45, color="#d62728", alpha=0.12, lw=0)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(y, label.loc[both.index], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over its own greedy with its 95% interval (shaded rows: the intervals do not overlap)")
    ax.set_title("Each point's speedup in A and B")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return f"<img style='max-width:100%' alt='each point speedup in A and B' src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'>"


def _deciding(row, side: str) -> str:
    """The interval the change test used for one side (the rounds' t interval, else the stored CI), as text."""
    got = rounds_interval(row.get(f"round_samples_{side}"))
    return f"{got[0]:.2f}-{got[1]:.2f}" if got else ci_text(row.get(f"speedup_ci_{side}"))


def _label(joined: pd.DataFrame, key: list[str]) -> pd.Series:
    # varied: more than one value where the parameter applies (a blank, e.g. mtplab's policy on a peer row, is none)
    varied = [k for k in key if joined[k].astype(str).loc[lambda v: v != ""].nunique() > 1]
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
    """The comparison page: provenance of both, a summary, the ratio figure, matched points, points only in one.
    a_dir, b_dir: finished sweeps' folders, as store.finished_sweep finds them (make_compare's)."""
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
        with_ci = int((both.test != "band").sum())
        summary.append(
            f"<b>{plural(int(both.changed.sum()), 'point')} changed</b>: "
            f"{int(both.speedup_changed.sum())} whose 95% speedup intervals do not overlap (of {with_ci} with "
            f"intervals on both sides, t intervals from the paired rounds where kept; "
            f"noise alone flags about {with_ci * INTERVAL_FALSE_ALARM:.2f} of them, {INTERVAL_FALSE_ALARM:.1%} each"
            + (f"; {len(both) - with_ci} without CIs judged by a speedup ratio outside {CHANGED[0]}-{CHANGED[1]}"
               if with_ci < len(both) else "")
            + f"), {int((both.counters_changed != '').sum())} whose slot counters differ."
        )
    parts.append("<p>" + " ".join(summary) + "</p>")
    parts.append(
        "<p><b>How to read this.</b> A point is one parameter combination; repeats are averaged. "
        "<i>ratio</i> is B over A: below 1, B is slower. Each sweep's speedup is over its own greedy baseline, "
        "measured in paired rounds, so the machine's drift between the two sweeps (tens of percent on a shared "
        "machine) moves tokens/s but not the speedup: a point counts as changed only where its speedup CIs "
        "do not overlap, or its slot counters (deterministic) differ. Tokens/s ratios are shown, never used "
        "to call a change.</p>"
    )
    if len(both):
        parts.append(_ratio_figure(both, label))
    head = ["point (parameters, A's id)", "changed", "spec tok/s A", "spec tok/s B", "tok/s B/A"]
    head += ["speedup A", "speedup B", "speedup B/A"]
    ci = "speedup_ci_a" in joined or "speedup_ci_b" in joined
    if ci:
        head += ["speedup 95% A", "speedup 95% B"]
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
            cells += [f"<td>{_deciding(row, side)}</td>" for side in ("a", "b")]
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
    a_dir, b_dir = store.finished_sweep(a), store.finished_sweep(b)
    page = compare_html(a_dir, b_dir)
    path = Path(out) if out else b_dir / f"compare-{a_dir.name}.html"
    write_atomic(path, page)
    return path
