"""Findings computed from a sweep's data, for the report: no number is written by hand."""

from __future__ import annotations

import pandas as pd

from .plots import alpha_grid, policy_grid


def header(sweep: dict) -> str:
    env = sweep.get("env", {})
    return (
        f"# mtplab sweep `{sweep['name']}`\n\n"
        f"{sweep['ok']} points ok, {sweep.get('mismatch', 0)} mismatch, {sweep['failed']} failed, of {sweep['points']}; finished {sweep['finished']} "
        f"in {sweep['wall_seconds']} s with {sweep['workers']} worker(s) x {sweep['threads_per_point']} thread(s).\n\n"
        f"Environment: {env.get('device')}, onnxruntime {env.get('onnxruntime')} ({env.get('provider')}), "
        f"Python {env.get('python')}, git {env.get('git_revision') or 'n/a'}."
    )


def summary(df: pd.DataFrame) -> str:
    """Markdown bullet list: identity, where MTP beats greedy, best k per alpha, policies, theory fit."""
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
        out.append(
            f"- **Every one of the {len(ok)} points is token-identical to greedy**, with the recurrent state checked too."
        )
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
    mtp = ok[(ok.drafter == "mtp") & (ok.get("engine", "mtplab") == "mtplab")]
    if len(mtp):
        for sched, s in mtp.groupby("schedule"):
            b = s.loc[s.speedup.idxmax()]
            out.append(
                f"- Built-in MTP head, `{sched}`: draft acceptance {s.draft_acceptance.mean():.0%} "
                f"(fitted alpha {s['theory.alpha'].mean():.2f}); best k={b.k} at {b.speedup:.2f}x."
            )
    pol = (
        policy_grid(ok)
        .groupby("policy")[[f"slots.verify.{c}" for c in ("replays", "fallbacks", "invalidations", "hazards")]]
        .mean()
    )
    for policy, r in pol.iterrows():
        out.append(
            f"- `{policy}`: verify slot replays {r['slots.verify.replays']:.1f}, fallbacks {r['slots.verify.fallbacks']:.1f}, "
            f"invalidations {r['slots.verify.invalidations']:.1f}, hazards {r['slots.verify.hazards']:.1f} per run "
            f"(mean over the policy x commit grid)."
        )
    if len(ok):
        err = (ok.speedup / ok["theory.speedup"] - 1).abs()
        out.append(
            f"- Measured speedup vs prediction from measured cost ratios: median error {err.median():.1%}, worst {err.max():.1%} "
            "(the cost ratios come from the same run, so this error is the sampled acceptance against alpha's expectation)."
        )
        vr = ok["theory.verify_cost_ratio"].median()
        out.append(
            f"- A verify forward costs {vr:.2f}x a greedy decode here (median over points), a draft {ok['theory.draft_cost_ratio'].median():.3f}x."
        )
    return "\n".join(out)


def peer(df: pd.DataFrame) -> str:
    """Markdown: mtplab next to onnxruntime-genai, where the sweep has peer rows."""
    ok = df[df.status == "ok"]
    if "engine" not in ok or not (ok.engine == "ort-genai").any():
        return "_This sweep has no onnxruntime-genai rows (add `engine: [ort-genai]` to a grid)._"
    peer_rows = ok[ok.engine == "ort-genai"]
    own = ok[(ok.engine == "mtplab") & (ok.drafter == "mtp")]
    out = [
        f"- Greedy: mtplab {own.greedy_tokens_per_s.median():.1f} tok/s vs onnxruntime-genai "
        f"{peer_rows.greedy_tokens_per_s.median():.1f} tok/s (medians; "
        f"{own.greedy_tokens_per_s.median() / peer_rows.greedy_tokens_per_s.median():.2f}x)."
    ]
    for k, p in peer_rows.groupby("k"):
        mine = own[own.k == k]
        best = mine.loc[mine.tokens_per_s.idxmax()] if len(mine) else None
        text = f"- k={k}: genai MTP {p.tokens_per_s.mean():.1f} tok/s ({p.speedup.mean():.2f}x its greedy, draft acceptance {p.draft_acceptance.mean():.0%})"
        if best is not None:
            text += f"; mtplab best {best.tokens_per_s:.1f} tok/s ({best.schedule}, {best.speedup:.2f}x)"
        out.append(text + ("; identical to greedy." if p.lossless.all() else "; **NOT identical to greedy**."))
    return "\n".join(out)


def table(df: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "point_id",
        "status",
        "k",
        "drafter",
        "alpha",
        "policy",
        "commit",
        "schedule",
        "greedy_tokens_per_s",
        "tokens_per_s",
        "speedup",
        "theory.speedup",
        "tokens_per_step",
        "acceptance_length",
        "draft_acceptance",
        "lossless",
    ]
    t = df[[c for c in cols if c in df.columns]].copy()
    return t.round(3).sort_values("point_id").reset_index(drop=True)
