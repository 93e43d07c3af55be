"""The study (notebooks/04_when_mtp_pays.ipynb): why MTP loses to greedy at batch 1 on a hybrid model, and what
it takes to win. Three parts, each a table and a figure from a study sweep (`mtplab sweep --grid study`):
the seed's path reproduced stage by stage, the break-even acceptance per commit and schedule with the
measured points on the predicted curves, and the same prediction for someone else's costs.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mtplab.engine.strategies import COMMITS, SCHEDULES
from mtplab.measure import breakeven, theory
from mtplab.report.plots import POLICY_COLORS, _ci_err, _k_color
from mtplab.report.selection import PINNED, policy_grid, set_acceptance
from mtplab.report.tables import ci_pair

PATH_POLICIES = ("shared-jit", "sibling", "sibling-pinned")  # the seed's executor fixes, in order
PATH_COMMITS = ("readvance-batched", "readvance-m1", "select")  # the seed's commit fixes, in order
COUNTED = ("fallbacks", "invalidations", "hazards")  # what a fix removes, per speculative step
# and the Primary slot's replays: the M=1 forwards a step makes (a re-advance's, one per consumed token at readvance-m1)
PER_STEP = {"primary": ("replays", *COUNTED), "verify": COUNTED}
SEED_FORM = ("captures", "replays", "fallbacks", "invalidations")  # `cuda_graph: captures=4 replays=504 ...`


def _stage(r) -> str:
    return f"{r.policy}{'' if r.validate else ' (validation off)'}, {r.commit}"


def path_point(r) -> str:
    """Which point a stage of the seed's path is: its k, alpha, schedule, model and length."""
    model = f", {r.get('model_name')}" if pd.notna(r.get("model_name")) else ""
    tokens = f", {r.get('tokens')} tokens" if pd.notna(r.get("tokens")) else ""
    return f"k={r.k}, oracle alpha={r.alpha:g}, {r.schedule}{model}{tokens}"


def seed_path(df: pd.DataFrame) -> pd.DataFrame:
    """The seed's path: one row per (policy, commit) of the sweep's policy grid, in the order the seed fixed them
    (validation off after its policy): speedup with its CI, tokens/s, and each slot's fallbacks, invalidations and
    hazards per speculative step (the checked run's counters)."""
    g = policy_grid(df)
    if g.empty or "policy" not in g:
        return pd.DataFrame()
    order = {p: i for i, p in enumerate(PATH_POLICIES)}
    corder = {c: i for i, c in enumerate(PATH_COMMITS)}
    g = g.assign(_p=g.policy.map(order).fillna(len(order)), _c=g.commit.map(corder).fillna(len(corder)),
                 _v=~g.validate.astype(bool)).sort_values(["_c", "_p", "_v"])
    rows = []
    for _, r in g.iterrows():
        steps = max(int(r.steps), 1) if pd.notna(r.steps) else 1
        lo, hi = ci_pair(r.speedup_ci)
        row = {"stage": _stage(r), "point": path_point(r), "policy": r.policy, "commit": r.commit,
               "validate": bool(r.validate),
               "speedup": r.speedup, "ci_low": lo, "ci_high": hi, "tokens/s": r.tokens_per_s,
               "greedy tokens/s": r.greedy_tokens_per_s, "status": r.status}
        for slot, counted in PER_STEP.items():
            for c in counted:
                col = f"slots.{slot}.{c}"
                row[f"{slot} {c}/step"] = (r[col] / steps) if col in r and pd.notna(r[col]) else np.nan
        row["seed form"] = "\n".join(
            f"    {slot}: " + " ".join(f"{c}={int(r[f'slots.{slot}.{c}'])}" for c in SEED_FORM
                                       if f"slots.{slot}.{c}" in r and pd.notna(r[f"slots.{slot}.{c}"]))
            for slot in ("primary", "verify"))
        rows.append(row)
    return pd.DataFrame(rows)


def path_table(path: pd.DataFrame) -> pd.DataFrame:
    """The seed's path as shown: a row per stage, the speedup with its CI, tokens/s, and the per-step counters
    that are not zero anywhere on the path."""
    counters = [c for c in path.columns if c.endswith("/step") and path[c].fillna(0).abs().sum() > 0]
    shown = pd.DataFrame({
        "speedup [95% CI]": [f"{s:.2f}x [{lo:.2f}, {hi:.2f}]" for s, lo, hi in zip(path.speedup, path.ci_low, path.ci_high)],
        "tok/s": path["tokens/s"].round(1).to_numpy(),
        "greedy tok/s": path["greedy tokens/s"].round(1).to_numpy(),
        "status": path.status.to_numpy(),
    }, index=pd.Index(path.stage, name="stage"))
    for c in counters:
        shown[c] = path[c].round(2).to_numpy()
    return shown


def path_changes(path: pd.DataFrame) -> list[str]:
    """What each fix changed, stage to stage along one commit (the executor's fixes) and along the pinned policy
    (the commit's fixes): the speedup, and every per-step counter that moved."""
    out = []

    def line(a, b) -> str:
        moved = [f"{c} {a[c]:.2f} -> {b[c]:.2f}" for c in path.columns if c.endswith("/step")
                 and pd.notna(a[c]) and pd.notna(b[c]) and abs(a[c] - b[c]) >= 0.005]
        return (f"- {a.stage} -> {b.stage}: speedup {a.speedup:.2f}x -> {b.speedup:.2f}x"
                + (f"; per step: {', '.join(moved)}" if moved else "; no slot counter moved"))

    def steps(stages: pd.DataFrame) -> list[str]:  # each stage against the one before it
        rows = [r for _, r in stages.iterrows()]
        return [line(a, b) for a, b in zip(rows, rows[1:])]

    validated = path[path.validate]
    for _, part in validated.groupby("commit", sort=False):
        out += steps(part)
    out += steps(validated[validated.policy == PINNED])
    for _, r in path[~path.validate].iterrows():
        hazards = r["primary hazards/step"] + r["verify hazards/step"]
        out.append(f"- {r.stage}: {hazards:.2f} hazards per step (a replay whose bound buffers moved), status "
                   f"{r.status}: the negative control for pinning")
    return out


def seed_path_figure(path: pd.DataFrame):
    """Speedup (95% CI) at each stage of the seed's path, a bar per stage, grouped by commit strategy."""
    fig, ax = plt.subplots(figsize=(10, 3.8))
    x = np.arange(len(path))
    err = np.nan_to_num(np.abs(np.vstack([path.speedup - path.ci_low, path.ci_high - path.speedup])))
    ax.bar(x, path.speedup, yerr=err, capsize=3,
           color=[POLICY_COLORS.get(p, "#888888") if v else "#bbbbbb" for p, v in zip(path.policy, path.validate)])
    for xi, s in zip(x, path.speedup):
        ax.text(xi, s + 0.02, f"{s:.2f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xticks(x, [s.replace(" (validation off)", "\n(no validation)").replace(", ", "\n").replace("readvance-", "readv.-")
                      for s in path.stage], fontsize=7)
    ax.set_ylabel("speedup over greedy (x)\nmedian of paired rounds, 95% CI")
    ax.set_title("The seed's path: executor fixes within each commit strategy, then the commit fixes")
    fig.tight_layout()
    return fig


def break_even_table(calibration: dict, ks=(1, 2, 3, 4), tokens: int | None = None) -> pd.DataFrame:
    """The break-even alpha and the speedup ceiling (alpha = 1) per commit, schedule and k, with the cost ratios
    that decide them ("never" where no alpha wins)."""
    rows = breakeven.table(calibration, ks, SCHEDULES.names(), COMMITS.names(), tokens)
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    t["break-even alpha"] = [("never" if pd.isna(a) else f"{a:.2f}") for a in t.break_even_alpha]
    t = t.rename(columns={"ceiling": "speedup at alpha=1", "verify_ratio": "T(k+1)/T(1)", "head_ratio": "head/T(1)",
                          "commit_ratio": "commit(k+1)/T(1)", "greedy_ratio": "greedy/T(1)"})
    cols = ["commit", "schedule", "k", "break-even alpha", "speedup at alpha=1", "T(k+1)/T(1)", "head/T(1)",
            "commit(k+1)/T(1)", "greedy/T(1)"]
    return t[cols].round(3)


def break_even_wide(calibration: dict, ks=(1, 2, 3, 4), tokens: int | None = None) -> pd.DataFrame:
    """The break-even table as a grid: a row per commit and schedule, a column per k, each cell the break-even
    alpha and, in brackets, the speedup at alpha = 1 (the ceiling no drafter passes)."""
    t = break_even_table(calibration, ks, tokens)
    if t.empty:
        return t
    t = t.assign(cell=[f"{a} ({c:.2f}x)" for a, c in zip(t["break-even alpha"], t["speedup at alpha=1"])])
    wide = t.pivot(index=["commit", "schedule"], columns="k", values="cell")
    wide.columns = [f"k={k}" for k in wide.columns]
    return wide


def cost_ratios(calibration: dict, ks=(1, 2, 3, 4)) -> pd.DataFrame:
    """What decides the break-even: per k, T(k+1)/T(1), the head step and each commit of k+1 tokens over T(1),
    and greedy's cost per token over T(1)."""
    rows = {}
    for k in ks:
        covered = sorted(c for c in COMMITS.names() if theory.covers(calibration, k, c))
        if covered:
            r = breakeven.ratios(calibration, k, covered[0])
            rows[k] = {"T(k+1)/T(1)": r["verify_ratio"], "head/T(1)": r["head_ratio"], "greedy/T(1)": r["greedy_ratio"]}
            rows[k] |= {f"{c}(k+1)/T(1)": breakeven.ratios(calibration, k, c)["commit_ratio"] for c in covered}
    out = pd.DataFrame.from_dict(rows, orient="index").round(3)
    out.index.name = "k"
    return out


def closed_forms(calibration: dict) -> list[str]:
    """The k = 1 closed form per commit and schedule, beside the bisection (they agree to rounding)."""
    out = []
    for commit in COMMITS.names():
        if not theory.covers(calibration, 1, commit):
            continue
        for schedule in SCHEDULES.names():
            a = breakeven.closed_form_k1(schedule, commit, calibration)
            text = ("no solution: c(2) - c(1) >= greedy's cost per token (a kept draft costs a re-advance as dear "
                    "as decoding it)" if a is None else f"{a:.3f}" + (" (above 1: never)" if a > 1 else
                                                                      " (below 0: at any alpha)" if a < 0 else ""))
            out.append(f"- {commit}, {schedule}, k=1, an infinitely long run: alpha* = {text}")
    return out


def priced(calibration: dict, ks=(1, 2, 3, 4)) -> tuple[list[str], list[str]]:
    """(the commits the calibration prices at some k of ks, those it prices at none): a cost model from someone's
    own measurements (breakeven.hardware_calibration) has no per-position verify, for one."""
    names = COMMITS.names()
    covered = [c for c in names if any(theory.covers(calibration, k, c) for k in ks)]
    return covered, [c for c in names if c not in covered]


def curves(calibration: dict, measured: pd.DataFrame | None = None, ks=(1, 3), tokens: int | None = None):
    """Predicted speedup against alpha (dashed) per k, a panel per schedule (rows) and commit the calibration prices
    (columns), the break-even alpha marked; the measured points (95% CI) of the pinned policy on top when given."""
    commits, schedules = priced(calibration, ks)[0], SCHEDULES.names()
    fig, axes = plt.subplots(len(schedules), len(commits), figsize=(4.2 * len(commits), 3.2 * len(schedules)),
                             sharey=True, squeeze=False)
    alphas = np.linspace(0, 1, 41)
    m = set_acceptance(measured) if measured is not None else None
    if m is not None and len(m):
        m = m[m.policy == PINNED] if PINNED in set(m.policy) else m
    for i, schedule in enumerate(schedules):
        for j, commit in enumerate(commits):
            ax = axes[i][j]
            for k in ks:
                if not theory.covers(calibration, k, commit):
                    continue
                color = _k_color(k)
                ax.plot(alphas, [breakeven.speedup(a, k, schedule, commit, calibration, tokens) for a in alphas], "--",
                        color=color, label=f"k={k} predicted")
                star = breakeven.break_even_alpha(k, schedule, commit, calibration, tokens)
                if star is not None and 0 < star < 1:
                    ax.axvline(star, color=color, lw=0.8, ls=":")
                if m is not None and len(m):
                    p = m[(m.schedule == schedule) & (m.commit == commit) & (m.k == k)].sort_values("alpha")
                    if len(p):
                        ax.errorbar(p.alpha, p.speedup, yerr=_ci_err(p.speedup, p.speedup_ci), fmt="o", color=color,
                                    capsize=3, label=f"k={k} measured")
            ax.axhline(1.0, color="gray", lw=1)
            ax.set_title(f"{commit}, {schedule}", fontsize=9)
            if i == len(schedules) - 1:
                ax.set_xlabel("alpha (per-position acceptance)")
            if j == 0:
                ax.set_ylabel("speedup over greedy (x)")
    shown = {}  # each label once, from whichever panel drew it first
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            shown.setdefault(lab, h)
    fig.legend(list(shown.values()), list(shown), loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle("Predicted speedup against alpha (dotted: the break-even alpha)", y=1.0)
    fig.tight_layout()
    return fig


def at_alpha(calibration: dict, alpha: float, ks=(1, 2, 3, 4)) -> pd.DataFrame:
    """The predicted speedup at one alpha: a row per commit and schedule, a column per k."""
    rows = {(c, s): {f"k={k}": round(breakeven.speedup(alpha, k, s, c, calibration), 3) for k in ks
                     if theory.covers(calibration, k, c)} for c in priced(calibration, ks)[0] for s in SCHEDULES.names()}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.names = ["commit", "schedule"]
    return out


def seed_form(path: pd.DataFrame) -> str:
    """Each stage's slot counters of its checked run in the seed's form (`verify: captures=4 replays=184 ...`)."""
    return "\n".join(f"{stage}\n{form}" for stage, form in zip(path.stage, path["seed form"]))
