"""Findings computed from a sweep's data, for the report: no number is written by hand."""

from __future__ import annotations

import pandas as pd

from . import selection
from .provenance import plural
from .selection import alpha_grid, counters_long, own_head, peer_rows
from .tables import count_text


def per_model(findings, df: pd.DataFrame) -> str:
    """Findings of each model of the sweep under its name (one model: the findings alone)."""
    names = selection.models(df)
    if len(names) <= 1:
        return findings(df)
    return "\n\n".join(f"#### Model `{name}`\n\n" + findings(df[df.model_name == name]) for name in names)


def sweep_findings(df: pd.DataFrame) -> str:
    """A sweep's findings as a markdown bullet list: identity, where MTP beats greedy, best k per alpha, policies, theory fit."""
    out = []
    ok = df[df.status != "failed"]  # every point that ran: ok, or mismatch (its lossless check failed)
    failed = df[df.status == "failed"]
    if len(failed):
        out.append(f"- **{len(failed)} point(s) failed to run**: " + ", ".join(failed.point_id))
    lossy = ok[~ok.lossless.astype(bool)]
    if len(lossy):
        items = ", ".join(f"`{r.point_id}` (token {r['identity.first_divergence']})" for _, r in lossy.iterrows())
        expected = lossy["validate"].eq(False).all() if "validate" in lossy else False
        out.append(
            f"- **Lossless check FAILED at {len(lossy)} of {len(ok)} points**: {items}"
            + (" (all are negative controls with validation off)" if expected else "")
        )
    else:
        out.append(f"- **Every one of the {plural(len(ok), 'point')} is token-identical to greedy.**")
    if len(ok):
        checked = ok.get("identity.state_commits_checked", pd.Series(0, index=ok.index)).fillna(0) > 0
        state_ok = checked & ok.lossless.astype(bool)
        out.append(
            f"- Recurrent state checked after every commit at {checked.sum()} of {plural(len(ok), 'point')}"
            f" ({state_ok.sum()} matching the reference)"
            + (f"; not checked at {(~checked).sum()} (peer engine rows)." if (~checked).any() else ".")
        )
    out.extend(warning_findings(ok))
    if len(ok):
        beats = ok[ok.speedup > 1.0]
        best = ok.loc[ok.speedup.idxmax()]
        out.append(
            f"- MTP beats greedy at {len(beats)} of {len(ok)} points. Best: **{best.speedup:.2f}x** "
            f"({best.tokens_per_s:.0f} vs {best.greedy_tokens_per_s:.0f} tok/s) at k={best.k}, "
            f"{best.drafter}"
            + (f" alpha={best.alpha:g}" if best.drafter == "oracle" else "")
            + f", schedule={best.schedule}, policy={best.policy}, commit={best.commit}."
        )
    g = alpha_grid(ok)
    for sched, s in g.groupby("schedule"):
        parts = []
        for alpha, a in s.groupby("alpha"):
            m = a.groupby("k").speedup.mean()
            parts.append(f"alpha={alpha:g}: k={m.idxmax()} ({m.max():.2f}x)")
        out.append(f"- Best k per alpha, schedule `{sched}`: " + "; ".join(parts) + ".")
    mtp = own_head(ok)
    if len(mtp):
        for sched, s in mtp.groupby("schedule"):
            b = s.loc[s.speedup.idxmax()]
            out.append(
                f"- Built-in MTP head, `{sched}`: draft acceptance {s.draft_acceptance.mean():.0%} "
                f"(fitted alpha {s['theory.alpha'].mean():.2f}); best k={b.k} at {b.speedup:.2f}x."
            )
    out.extend(policy_findings(counters_long(ok)))
    if len(ok):
        err = (ok.speedup / ok["theory.speedup"] - 1).abs()
        out.append(
            f"- Measured speedup vs the prediction from the sweep's calibration (costs measured apart from every point): "
            f"median |error| {err.median():.1%}, worst {err.max():.1%}; efficiency with CIs under Measurement quality."
        )
        vr = ok["theory.verify_cost_ratio"].median()
        out.append(
            f"- A verify forward costs {vr:.2f}x a greedy decode here (median over points), a draft {ok['theory.draft_cost_ratio'].median():.3f}x."
        )
    return "\n".join(out)


def warning_findings(ok: pd.DataFrame) -> list[str]:
    """One bullet naming the points' warnings (mtplab.flags) by kind, with the first message of each kind."""
    import json

    if "warnings" not in ok or ok.empty:
        return []
    kinds: dict[str, list[tuple[str, str]]] = {}
    for _, row in ok.iterrows():
        for w in json.loads(row["warnings"]) if isinstance(row["warnings"], str) else []:
            kinds.setdefault(w["name"], []).append((row.point_id, w["message"]))
    if not kinds:
        return [f"- No named warnings at any of the {plural(len(ok), 'point')} (efficiency, accounting, head "
                "acceptance, timed-round audit)."]
    flagged = len({p for items in kinds.values() for p, _ in items})
    parts = [f"`{name}` at {len(items)} (e.g. `{items[0][0]}`: {items[0][1]})" for name, items in sorted(kinds.items())]
    return [f"- **Warnings at {flagged} of {plural(len(ok), 'point')}**: " + "; ".join(parts) + "."]


def policy_findings(long: pd.DataFrame) -> list[str]:
    """Per policy: under which commit strategies both slots replayed with no fallback or invalidation, and the rest."""
    out = []
    if long.empty:
        return out
    for policy in long.policy.unique():
        clean, other = [], []
        for commit, c in long[long.policy == policy].groupby("commit"):
            bad = []
            for slot, r in c.groupby("slot")[["replays", "fallbacks", "invalidations", "hazards"]].mean().iterrows():
                trouble = [f"{count_text(r[n])} {n}" for n in ("fallbacks", "invalidations", "hazards") if r[n]]
                if trouble or not r.replays:
                    bad.append(f"{slot} " + (", ".join(trouble) or "never replays"))
            (other.append(f"`{commit}`: " + "; ".join(bad)) if bad else clean.append(f"`{commit}`"))
        text = f"- `{policy}` (per run): "
        if clean:
            text += "both slots replay with 0 fallbacks, 0 invalidations, 0 hazards under " + ", ".join(clean)
        if other:
            text += ("; under " if clean else "under ") + "; ".join(other)
        out.append(text + ".")
    return out


def peer(df: pd.DataFrame) -> str:
    """Markdown: mtplab next to onnxruntime-genai, where the sweep has peer rows."""
    ok = df[df.status == "ok"]
    peer = peer_rows(ok)
    if peer.empty:
        return "_This sweep has no onnxruntime-genai rows (add `engine: [ort-genai]` to a grid)._"
    own = own_head(ok)
    out = [
        f"- Greedy: mtplab {own.greedy_tokens_per_s.median():.1f} tok/s vs onnxruntime-genai "
        f"{peer.greedy_tokens_per_s.median():.1f} tok/s (medians; "
        f"{own.greedy_tokens_per_s.median() / peer.greedy_tokens_per_s.median():.2f}x)."
    ]
    for k, p in peer.groupby("k"):
        mine = own[own.k == k]
        best = mine.loc[mine.tokens_per_s.idxmax()] if len(mine) else None
        text = f"- k={k}: genai MTP {p.tokens_per_s.mean():.1f} tok/s ({p.speedup.mean():.2f}x its greedy, draft acceptance {p.draft_acceptance.mean():.0%})"
        if best is not None:
            text += f"; mtplab best {best.tokens_per_s:.1f} tok/s ({best.schedule}, {best.speedup:.2f}x)"
        out.append(text + ("; identical to greedy." if p.lossless.all() else "; **NOT identical to greedy**."))
    return "\n".join(out)
