"""Findings computed from a sweep's data, for the report: no number is written by hand."""

from __future__ import annotations

import math

import pandas as pd

from mtplab.base.threads import SETTLE_LIMIT
from mtplab.measure import rounds as measure
from mtplab.report import baseline, selection
from mtplab.report.provenance import plural
from mtplab.report.selection import alpha_grid, counters_long, own_head, peer_rows
from mtplab.report.tables import ci_pair as _interval
from mtplab.report.tables import count_text
from mtplab.sweep import store


def per_model(findings, df: pd.DataFrame) -> str:
    """Findings of each model of the sweep under its name (one model: the findings alone)."""
    # the batch figure states its own findings; a batch point that failed or mismatched is counted here still
    df = df[(selection.batches(df) == 1) | ~df.status.isin(store.LOSSLESS)] if "status" in df else selection.batch_one(df)
    names = selection.models(df)
    if len(names) <= 1:
        return findings(df)
    return "\n\n".join(f"#### Model `{name}`\n\n" + findings(df[df.model_name == name]) for name in names)


def _point_text(r) -> str:
    lo, hi = _interval(r.get("speedup_ci"))
    stable = "stable" if bool(r.get("stable")) else "unstable"
    return f"**{r.speedup:.2f}x** [{lo:.2f}, {hi:.2f}] ({stable}) at k={r.k}, {r.schedule}, {r.policy}, {r.commit}"


def stability_findings(df: pd.DataFrame) -> list[str]:
    """How sure the sweep's numbers are: stable points, CI widths, greedy drift and load, before any headline."""
    own = selection.own_engine(selection.ran(df))
    if own.empty:
        return []
    ci = [_interval(v) for v in own.speedup_ci] if "speedup_ci" in own else []
    half = pd.Series([(hi - lo) / 2 / abs(m) for (lo, hi), m in zip(ci, own.speedup)], dtype=float)
    stable = int(own.stable.fillna(False).astype(bool).sum()) if "stable" in own else 0
    g = own.greedy_tokens_per_s.dropna()
    width = (f"median half-width {half.median():.1%}" if half.notna().any()
             else "no point has a CI (a CI needs at least two paired rounds)")
    text = f"- **How sure**: {stable} of {plural(len(own), 'mtplab point')} stable (speedup CI half-width at most 5%); {width}"
    if len(g):
        text += (f"; mtplab's greedy ran {g.min():.1f}-{g.max():.1f} tok/s across the sweep's points (a spread of "
                 f"{g.max() / g.min() - 1:.0%}: why every figure is a ratio from paired rounds, which cancel the drift "
                 "both sides of a point share)")
    return [text + "."] + floor_findings(own) + suspect_findings(own) + baseline.finding(df)


def floor_findings(df: pd.DataFrame) -> list[str]:
    """How close each side came to its timing floor's band (mtplab.measure.floor), over the points that timed one."""
    from mtplab.measure.floor import held as held_to_band

    extra = selection.parse_json(df["extra"]) if "extra" in df else []
    floors = [e.get("floor") or {} for e in extra if isinstance(e, dict)]
    parts = []
    for side in ("greedy", "speculative"):
        timed = [f[side] for f in floors if f.get(side)]
        held = [f for f in timed if held_to_band(f)]
        if not timed:
            continue
        worst = max((f["host_per_unit"] / f["allowed_per_unit"] for f in held), default=None)
        parts.append(f"{side} held to its band at {len(held)} of {len(timed)} points"
                     + (f" (its host time at most {worst:.0%} of the band)" if worst is not None else "")
                     + (f", priced in part at the other {len(timed) - len(held)}" if len(held) < len(timed) else ""))
    if not parts:
        return []
    return ["- **Timing floors** (each side against the bare replays of its own plans, timed right after it): "
            + "; ".join(parts) + "."]


def suspect_findings(df: pd.DataFrame) -> list[str]:
    """The points whose timing is suspect (mtplab.measure.floor), each with why: their speedups are no finding."""
    if "status" not in df or not (df.status == "suspect").any():
        return []
    rows = df[df.status == "suspect"]
    why = selection.parse_json(rows["suspect"]) if "suspect" in rows else [[]] * len(rows)
    named = "; ".join(f"`{p}`: {w[0] if w else 'a side beyond its band'}" for p, w in zip(rows.point_id, why))
    return [f"- **Suspect timing**: {plural(len(rows), 'point')} had a timed side beyond its timing floor's band (its "
            f"own plans replayed bare, timed right after it): drawn as not stable, no finding - {named}."]



DRIFT_TOLD = 0.10  # greedy's cost moving more than this between the calibration and the sweep's end is a finding
RATIO_DRIFT_TOLD = 0.05  # a T(M)/T(1) moving more than this: every efficiency of the sweep moves about as much


def drift_findings(sweep: dict) -> str:
    """Markdown: each model whose greedy cost per token moved more than DRIFT_TOLD between the calibration measured at
    the sweep's start and its re-check at the end (sweep.json's calibration_check): the predictions and efficiencies
    lean on the start's costs; the paired speedups do not. Also each model whose forward cost ratio T(M)/T(1) moved
    more than RATIO_DRIFT_TOLD: a verify's price relative to greedy's, so every efficiency moves with it. Empty where
    nothing moved that much."""
    out = []
    for name, c in (sweep.get("calibration_check") or {}).items():
        if c and abs(c.get("drift", 0.0)) > DRIFT_TOLD:
            out.append(f"- **The machine moved during the sweep**: greedy on `{name}` took {1e3 * c['greedy_token_start']:.2f} "
                       f"ms a token when the calibration was measured at its start and {1e3 * c['greedy_token_end']:.2f} "
                       f"ms at its end ({c['drift']:+.0%}; load at the end {c.get('load_end')}). Every prediction and "
                       "efficiency uses the start's costs; the speedups, paired round by round, do not.")
        if c and abs(c.get("ratio_drift", 0.0)) > RATIO_DRIFT_TOLD:
            m = c["ratio_drift_m"]
            a, b = c["ratios"][str(m)]
            out.append(f"- **The forward cost ratios moved during the sweep**: T({m})/T(1) on `{name}` was {a:.3f} at the "
                       f"calibration and {b:.3f} at the re-check ({c['ratio_drift']:+.0%}). The predictions and "
                       "efficiencies price a verify against greedy at the start's ratios: read the efficiencies as "
                       "uncertain by about that much.")
    return "\n".join(out)


def headline_findings(ok: pd.DataFrame) -> list[str]:
    """Where MTP beats greedy, the real head first: each best point with its CI and stability; every count
    with its denominator; 'beats' means the speedup CI lies above 1, 'within noise' that it holds 1."""
    out = []
    own = selection.own_engine(ok)
    for label, part, note in (
        ("Real MTP head", selection.measured_acceptance(own), ""),
        ("Oracle drafter", selection.set_acceptance(own),
         " (a performance-only setting: its acceptance is set by alpha, not earned by a head)"),
    ):
        if part.empty:
            continue
        ci = [_interval(v) for v in part.speedup_ci] if "speedup_ci" in part else [(float("nan"),) * 2] * len(part)
        above = sum(lo > 1 for lo, _ in ci)
        below = sum(hi < 1 for _, hi in ci)
        # the best stable point where there is one: an unstable point's median is the least sure number
        stable = part[part.stable.fillna(False).astype(bool)] if "stable" in part else part.iloc[:0]
        pool = stable if len(stable) else part
        best, top = pool.loc[pool.speedup.idxmax()], part.loc[part.speedup.idxmax()]
        higher = (f" (an unstable point reads higher: {top.speedup:.2f}x at k={top.k}, {top.schedule})"
                  if top.speedup > best.speedup else "")
        out.append(
            f"- {label}{note}: speculative decoding beats greedy (CI above 1) at {above} of "
            f"{plural(len(part), 'point')}, loses "
            f"(CI below 1) at {below}, within noise at {len(part) - above - below}. Best"
            f"{' stable' if len(stable) else ''}: {_point_text(best)}"
            + (f", alpha={best.alpha:g}" if selection.acceptance_source(best.drafter) == "setting" else "")
            + f"; {best.tokens_per_s:.0f} vs {best.greedy_tokens_per_s:.0f} tok/s{higher}."
        )
    peer = peer_rows(ok)
    head = selection.measured_acceptance(selection.greedy_decoding(own))
    if len(peer) and len(head):
        fastest = head.loc[head.speedup.idxmax()]
        g = peer_greedy_ratio(peer)
        read_caveat = " **Read the side-by-side's caveat first.**" if peer_caveat(peer) else ""
        if g is None:  # a sweep from before the peer points timed mtplab's greedy beside genai's
            genai_greedy, mine = peer.greedy_tokens_per_s.median(), head.greedy_tokens_per_s.median()
            out.append(f"- Against onnxruntime-genai on the same model: its greedy {genai_greedy:.1f} tok/s, mtplab's "
                       f"{mine:.1f} ({mine / genai_greedy:.2f}x, medians over the sweep: absolute tokens/s from "
                       f"different moments, read with the spread above).{read_caveat}")
        else:
            versus = fastest.speedup * g["median"]
            out.append(
                f"- Against onnxruntime-genai on the same model: mtplab's greedy runs {_ratio_text(g)} genai's "
                f"({plural(g['rounds'], 'paired round')} of its peer points). The best real-head speedup over mtplab's own "
                f"greedy is {_point_text(fastest)}: that point runs about **{versus:.2f}x genai's plain greedy** "
                f"({'faster' if versus > 1 else 'slower'}; the product of the two paired ratios).{read_caveat}"
            )
    return out


def peer_greedy_ratio(peer: pd.DataFrame) -> dict | None:
    """mtplab's greedy over onnxruntime-genai's from the peer points' own rounds, where each round times genai's greedy
    and MTP and then mtplab's greedy: the median and CI of the per-round ratios and their count (None: no round has
    both). Absolute rates from the sweep's other points are taken at other moments, under other load."""
    mine, genai = [], []
    for samples in selection.parse_json(peer.round_samples) if "round_samples" in peer else []:
        for s in samples if isinstance(samples, list) else []:
            pair = (s.get("mtplab_greedy_tokens_per_s"), s.get("greedy_tokens_per_s")) if isinstance(s, dict) else ()
            if len(pair) == 2 and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in pair):
                mine.append(pair[0])
                genai.append(pair[1])
    return measure.paired_ratio(mine, genai) | {"rounds": len(mine)} if mine else None


def _peer_extras(peer: pd.DataFrame) -> list:
    return list(selection.parse_json(peer.extra)) if "extra" in peer else [None] * len(peer)


def unsettled_peer_points(peer: pd.DataFrame) -> int:
    """Peer points on more than one thread measured before each timed side waited for the threads of the side
    before it to go idle, and before genai's MTP head ran on one thread (their results lack extra.settle_max_ms):
    where the threads filled the cores, one side ran inside another pool's spin. A point on one thread has no
    pool workers to spin."""
    threads = peer.threads if "threads" in peer else [0] * len(peer)
    return sum(not (isinstance(e, dict) and "settle_max_ms" in e) and t != 1 for e, t in zip(_peer_extras(peer), threads))


def limited_peer_sides(peer: pd.DataFrame) -> int:
    """Timed sides of the peer points that began at settle's limit, the process's threads still busy."""
    return sum(int(e.get("settle_limited") or 0) for e in _peer_extras(peer) if isinstance(e, dict))


def peer_caveat(peer: pd.DataFrame) -> str:
    """Why the peer's numbers may be off ("" when nothing says so): points timed inside another pool's spin, or
    sides that began with the threads still busy."""
    notes = []
    if unsettled := unsettled_peer_points(peer):
        notes.append(f"**{plural(unsettled, 'peer point')} timed each side at once after the one before**, inside its "
                     "pool's spin (onnxruntime's workers spin about 50 ms after a run), and ran genai's MTP head on a "
                     "pool the target's size, spinning beside it. Where the threads filled the cores, each moved a "
                     "side by up to 2x (on 2 threads and 2 cores: the builder fixture's greedy; small's genai MTP, "
                     "0.59x its greedy where its head on one thread makes 1.01x): run them again with this mtplab, "
                     "in a new sweep (a resumed sweep keeps its finished points).")
    if limited := limited_peer_sides(peer):
        notes.append(f"**{plural(limited, 'timed side')} of the peer points began with this process's threads still "
                     f"busy** after settle's wait of {SETTLE_LIMIT:g} s (another thread of the process kept running): those sides "
                     "may have shared the cores.")
    return " ".join(notes)


def _ratio_text(r: dict) -> str:
    lo, hi = r["ci"]
    interval = f"[{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) and math.isfinite(hi) else "(no CI from one round)"
    return f"**{r['median']:.2f}x** {interval}"


def answer(df: pd.DataFrame) -> str:
    """The report's first line: where speculative decoding beats greedy (the real head first) with its best point and
    interval, and whether every point was token-identical to greedy; the findings and their caveats follow."""
    ok = selection.ran(df)
    heads = headline_findings(ok) if len(ok) else []
    if not heads:
        return "**No speculative point of mtplab's own engine ran in this sweep**: the findings below say what did."
    lossy = int((~ok.lossless.astype(bool)).sum())
    identity = ("every point token-identical to greedy" if not lossy else
                f"**{lossy} of {len(ok)} points NOT identical to greedy**")
    return f"**The answer.** {heads[0][2:]} ({identity}; caveats under Findings.)"


def sweep_findings(df: pd.DataFrame) -> str:
    """A sweep's findings as a markdown bullet list: where MTP beats greedy (real head first), identity, how sure,
    warnings, best k per alpha, policies, theory fit."""
    ok = selection.ran(df)
    out = headline_findings(ok) if len(ok) else []
    out += stability_findings(df)
    failed = df[df.status == "failed"]
    if len(failed):
        errors = failed.error if "error" in failed else pd.Series("", index=failed.index)
        out.append(f"- **{len(failed)} point(s) failed to run** (nothing measured, left out of every figure): "
                   + "; ".join(f"`{p}` ({store.error_summary(e)})" for p, e in zip(failed.point_id, errors)))
    if not len(ok):
        out.append("- **No point ran**: this sweep measured nothing.")
        return "\n".join(out)
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
            f"- Recurrent state and KV checked after every commit at {checked.sum()} of {plural(len(ok), 'point')}"
            f" ({state_ok.sum()} matching the reference)"
            + (f"; not checked at {(~checked).sum()} (peer engine rows)." if (~checked).any() else ".")
        )
    out.extend(warning_findings(ok))
    g = alpha_grid(ok)
    for sched, s in g.groupby("schedule"):
        parts = []
        for alpha, a in s.groupby("alpha"):
            m = a.groupby("k").speedup.mean()
            best = a[a.k == m.idxmax()].iloc[0]
            lo, hi = _interval(best.get("speedup_ci"))
            ties = [int(k) for k, r in a.groupby("k") if k != m.idxmax() and _interval(r.iloc[0].get("speedup_ci"))[1] >= lo]
            parts.append(f"alpha={alpha:g}: k={m.idxmax()} ({m.max():.2f}x [{lo:.2f}, {hi:.2f}]"
                         + (f"; k={', '.join(map(str, ties))} within its CI" if ties else "") + ")")
        out.append(f"- Best k per alpha, schedule `{sched}`: " + "; ".join(parts) + ".")
    mtp = own_head(ok)
    if len(mtp):
        for sched, s in mtp.groupby("schedule"):
            b = s.loc[s.speedup.idxmax()]
            out.append(
                f"- The model's MTP head, `{sched}`: draft acceptance {s.draft_acceptance.mean():.0%} "
                f"(fitted alpha {s['theory.alpha'].mean():.2f}); best k={b.k} at {b.speedup:.2f}x."
            )
    out.extend(policy_findings(counters_long(ok)))
    if len(ok) and "efficiency" in ok and ok.efficiency.notna().any():
        e = ok.efficiency.dropna()
        ci = [_interval(v) for v in ok.loc[e.index, "efficiency_ci"]] if "efficiency_ci" in ok else []
        holds_one = sum(lo <= 1 <= hi for lo, hi in ci)
        out.append(
            f"- Efficiency (measured speedup / the speedup the sweep's calibration prices for the steps each point "
            f"made: its accepted counts, none of its times; a batch point's, for its alpha): median "
            f"{e.median():.2f}, {e.min():.2f}-{e.max():.2f} over {plural(len(e), 'point')}; {(e > 1).sum()} above 1, "
            f"{(e < 1).sum()} below; the CI holds 1 at {holds_one}. Per policy and commit under Measurement quality."
        )
        if "predicted.at_alpha" in ok and ok["predicted.at_alpha"].notna().any():
            luck = (ok["predicted.speedup"] / ok["predicted.at_alpha"] - 1).dropna()
            out.append(
                f"- The acceptance the timed steps realized, against the alpha each point was set or calibrated to, moved "
                f"the calibration's price by {luck.min():+.0%} to {luck.max():+.0%} (median {luck.median():+.0%}): a run "
                f"of a few dozen steps lands off its alpha by chance. The efficiency prices the steps made; the "
                f"dashed prediction curves price alpha."
            )
        vr = ok["theory.verify_cost_ratio"].median()
        out.append(
            f"- A verify forward costs {vr:.2f}x a greedy decode here (median over points), a draft {ok['theory.draft_cost_ratio'].median():.3f}x."
        )
    return "\n".join(out)


def warning_findings(ok: pd.DataFrame) -> list[str]:
    """One bullet naming the points' warnings (mtplab.check.flags) by kind, with the first message of each kind."""
    import json

    if "warnings" not in ok or ok.empty:
        return []
    kinds: dict[str, list[tuple[str, str]]] = {}
    for _, row in ok.iterrows():
        for w in json.loads(row["warnings"]) if isinstance(row["warnings"], str) else []:
            kinds.setdefault(w["name"], []).append((row.point_id, w["message"]))
    if not kinds:
        return [f"- No named warnings at any of the {plural(len(ok), 'point')} (efficiency, accounting, head "
                "and oracle acceptance, greedy's drift from its calibration, timed-round audit)."]
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
    own = own_head(selection.greedy_decoding(ok))
    g = peer_greedy_ratio(peer)
    absolute = (f"mtplab {own.greedy_tokens_per_s.median():.1f} tok/s (median over its "
                f"{plural(len(own), 'real-head point')}), onnxruntime-genai {peer.greedy_tokens_per_s.median():.1f} "
                f"(median over its {plural(len(peer), 'row')}), taken at different moments")
    caveat = peer_caveat(peer)
    settled = "" if caveat else ", each once the threads of the one before were idle"
    out = [f"- Greedy: mtplab / genai {_ratio_text(g)} over {plural(g['rounds'], 'paired round')} (each peer point times genai's "
           f"greedy and MTP, then mtplab's greedy, round by round{settled}). Absolute: {absolute}." if g is not None
           else f"- Greedy: {absolute}: their ratio, "
                f"{own.greedy_tokens_per_s.median() / peer.greedy_tokens_per_s.median():.2f}x, moves with the load."]
    for k, p in peer.groupby("k"):
        mine = own[own.k == k]
        best = mine.loc[mine.speedup.idxmax()] if len(mine) else None
        text = (f"- k={k}: genai MTP {p.speedup.median():.2f}x its own greedy (paired; {p.tokens_per_s.median():.1f} "
                f"tok/s, draft acceptance {p.draft_acceptance.mean():.0%})")
        if best is not None:
            text += f"; mtplab's best {best.speedup:.2f}x its own ({best.schedule}, {best.tokens_per_s:.1f} tok/s)"
            if g is not None and p.speedup.median() > 0:
                text += (f": mtplab's MTP about {best.speedup * g['median'] / p.speedup.median():.2f}x genai's MTP "
                         "(the speedups and the greedy ratio, each paired, multiplied)")
        out.append(text + ("; identical to greedy." if p.lossless.all() else "; **NOT identical to greedy**."))
    if caveat:
        out.append(f"- {caveat}")
    return "\n".join(out)
