"""The standard figures, drawn from the rows mtplab.report.selection picks out of a sweep DataFrame (see store.load)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from mtplab.experiment.config import model_name, upgrade
from mtplab.experiment.result_text import drafter_text
from mtplab.measure.result import engine_steps
from mtplab.report.selection import (
    SCHEDULE,
    alpha_grid,
    measured_acceptance,
    one_of,
    own_head,
    own_head_beside_peer,
    parse_json,
    peak_arena_mib,
    peer_rows,
    policy_grid,
    set_acceptance,
    split_points,
)
from mtplab.report.tables import ci_pair, count_text

POLICY_COLORS = {"shared-jit": "#d62728", "shared-max": "#1f77b4", "sibling": "#ff7f0e", "sibling-pinned": "#2ca02c"}
PHASE_COLORS = {"decode": "#4c72b0", "draft": "#dd8452", "verify": "#55a868", "commit": "#c44e52"}

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "font.size": 10,
        "legend.fontsize": 9,
    }
)


def _k_color(k: int, ks=None) -> tuple:
    """One colour per k, the same in every panel and figure (a qualitative palette: neighbours stay apart)."""
    return plt.cm.tab10((int(k) - 1) % 10)


def _ci_err(values: pd.Series, cis: pd.Series) -> np.ndarray:
    """Asymmetric error bars (2 x n) from a column of [lo, hi] CIs (JSON text or lists); 0 where missing."""
    ci = np.array([ci_pair(v) for v in cis], dtype=float).reshape(-1, 2)
    return np.nan_to_num(np.abs(np.vstack([values.to_numpy(float) - ci[:, 0], ci[:, 1] - values.to_numpy(float)])))


def _policy_order(policies) -> list[str]:
    known = [p for p in POLICY_COLORS if p in set(policies)]
    return known + sorted(set(policies) - set(known))


def predicted_curve(s: pd.DataFrame, k: int, schedule: str, alphas: np.ndarray) -> np.ndarray:
    """Leviathan speedup over alphas with the calibration's cost ratios recorded on these points (greedy = 1)."""
    from mtplab.measure.theory import predicted_speedup

    c = {n: float(s[f"theory.{n}_cost_ratio"].median()) for n in ("decode", "draft", "verify", "commit")}
    return np.array(
        [predicted_speedup(a, k, 1.0, c["decode"], c["draft"], c["verify"], c["commit"], schedule) for a in alphas]
    )


def peer_comparison(df: pd.DataFrame):
    """Tokens/s with the real MTP head per k: mtplab (each schedule) next to onnxruntime-genai; greedy dotted."""
    fig, ax = plt.subplots(figsize=(7.2, 3.8))
    peer = peer_rows(df)
    if peer.empty:
        _empty(ax, "onnxruntime-genai rows")
        return fig
    own = own_head_beside_peer(df)
    peer, pick = one_of(peer, "prompts")  # the prompt set the peer ran most
    if pick is not None:
        own = own[own.prompts.fillna("") == pick]
    series = [(f"mtplab {s}", own[own.schedule == s]) for s in sorted(own.schedule.unique())]
    series.append(("onnxruntime-genai MtpGenerator", peer))
    ks = sorted(set(peer.k))
    w = 0.8 / len(series)
    for j, (label, s) in enumerate(series):
        m = s.groupby("k").tokens_per_s.mean().reindex(ks)
        x = np.arange(len(ks)) + (j - (len(series) - 1) / 2) * w
        err = None
        if "tokens_per_s_ci" in s and len(s):  # the first point of each k: its 95% CI
            firsts = s.groupby("k").head(1).set_index("k").reindex(ks)
            err = _ci_err(firsts.tokens_per_s, firsts.tokens_per_s_ci)
        ax.bar(x, m.values, w, label=label, yerr=err, capsize=2, error_kw={"lw": 0.8})
    for label, s, style in (("mtplab greedy", own, ":"), ("genai greedy", peer, "--")):
        if len(s):
            ax.axhline(s.greedy_tokens_per_s.median(), color="gray", ls=style, lw=1, label=f"{label} (median)")
    ax.set_xticks(np.arange(len(ks)), [f"k={k}" for k in ks])
    ax.set_xlabel("drafts per step (real MTP head)")
    ax.set_ylabel("tokens/s")
    ax.set_title("Side by side with onnxruntime-genai (same model, same prompt; 95% CIs)\nabsolute tokens/s, each point "
                 "at its own moment: the paired ratios are in the text above", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this sweep", ha="center", va="center", transform=ax.transAxes, color="gray")


def _per_schedule(df: pd.DataFrame, metric: str, scale, ylabel: str, title: str, baseline=None):
    """One panel per schedule: metric against alpha, a line per k; dashed: theory times scale(the panel's points),
    one scale for every k of a panel (a rate's: its greedy median over the panel, not each k's own)."""
    g = alpha_grid(df)
    schedules = sorted(g.schedule.unique()) if not g.empty else [SCHEDULE]
    fig, axes = plt.subplots(1, len(schedules), figsize=(5.2 * len(schedules), 3.8), sharey=True, squeeze=False)
    for ax, sched in zip(axes[0], schedules):
        s = g[g.schedule == sched]
        if s.empty:
            _empty(ax, "oracle k x alpha grid")
            continue
        alphas = np.linspace(s.alpha.min(), min(1.0, s.alpha.max() + 0.05), 50)
        ks = sorted(s.k.unique())
        for i, k in enumerate(ks):
            sk = s[s.k == k]
            m = sk.groupby("alpha")[metric].mean()
            c = _k_color(k)
            ax.plot(m.index, m.values, "-", color=c, lw=1)
            if f"{metric}_ci" in sk:  # each point's 95% CI (nudged apart so that k's bars do not cover each other)
                dx = (i - (len(ks) - 1) / 2) * 0.006
                ax.errorbar(sk.alpha + dx, sk[metric], yerr=_ci_err(sk[metric], sk[f"{metric}_ci"]), fmt="o", ms=4,
                            color=c, capsize=2, label=f"k={k}")
            else:
                ax.plot(m.index, m.values, "o", color=c, label=f"k={k}")
            ax.plot(alphas, predicted_curve(sk, k, sched, alphas) * scale(s), "--", color=c, alpha=0.8)
        if baseline is not None:
            baseline(ax, s)
        ax.set_title(f"{title}, schedule={sched}\npolicy={s.policy.iloc[0]}, commit={s.commit.iloc[0]}", fontsize=10)
        ax.set_xlabel("per-position acceptance alpha (oracle drafter)")
        ax.set_ylabel(ylabel + "\nmedian of paired rounds, 95% CI")
    drawn = {}  # every panel's k, once each (a panel may hold fewer k than another)
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            drawn.setdefault(label, h)
    labels = sorted(drawn, key=lambda label: int(label.removeprefix("k=")))
    fig.legend([drawn[label] for label in labels], labels, title="drafts per step (dashed: theory)", loc="center left",
               bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return fig


def speedup_vs_alpha(df: pd.DataFrame):
    """Speedup over greedy against alpha, one line per k; theory dashed (Leviathan with the calibration's cost ratios)."""

    def greedy_line(ax, s):
        ax.axhline(1.0, color="gray", lw=1)
        ax.annotate("greedy ", xy=(1.0, 1.0), xycoords=("axes fraction", "data"), ha="right", va="bottom",
                    color="gray", fontsize=8)

    return _per_schedule(df, "speedup", lambda s: 1.0, "speedup over greedy (x)", "Speculative speedup", greedy_line)


def tokens_per_s_vs_alpha(df: pd.DataFrame):
    """Speculative tokens/s against alpha, one line per k, theory dashed; greedy tokens/s dotted."""

    def greedy_band(ax, s):
        g = s.greedy_tokens_per_s
        ax.axhspan(g.quantile(0.1), g.quantile(0.9), color="gray", alpha=0.12, lw=0)
        ax.axhline(g.median(), color="gray", lw=1, ls=":")
        ax.annotate("greedy (median, 10-90% band) ", xy=(1.0, g.median()), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", color="gray", fontsize=8)

    return _per_schedule(
        df, "tokens_per_s", lambda s: s.greedy_tokens_per_s.median(), "tokens/s", "Speculative throughput", greedy_band
    )


def acceptance_vs_theory(df: pd.DataFrame):
    """Measured acceptance length against Leviathan's (1-a^(k+1))/(1-a); MTP-head points at their fitted alpha."""
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    g = alpha_grid(df)
    ks = sorted(set(df.k.unique()))
    grid = np.linspace(0, 1, 101)[:-1]
    for k in ks:
        c = _k_color(k, ks)
        ax.plot(grid, (1 - grid ** (k + 1)) / (1 - grid), "--", color=c, alpha=0.7)
        m = g[g.k == k].groupby("alpha")["acceptance_length"].mean()
        if len(m):
            ax.plot(m.index, m.values, "o", color=c, label=f"k={k} oracle")
        mtp = measured_acceptance(df[df.k == k])
        if len(mtp):
            ax.plot(
                mtp["theory.alpha"], mtp.acceptance_length, "*", ms=12, color=c, mec="black", label=f"k={k} MTP head"
            )
    ax.set_xlabel("per-position acceptance alpha (oracle: set; MTP head: fitted)")
    ax.set_ylabel("acceptance length (1 + accepted/step)")
    ax.set_title("Acceptance length vs theory (dashed)")
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    return fig


def per_position(df: pd.DataFrame):
    """P(accepted >= i) by draft position: oracle alphas against alpha^i (dashed), and the MTP head."""
    k = int(df.k.max()) if len(df) else 1
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    g = alpha_grid(df)
    g = g[g.k == k]
    pos = np.arange(1, k + 1)
    for alpha, s in g.groupby("alpha"):
        measured = np.mean(np.stack(parse_json(s.acceptance_per_position).map(np.asarray).values), axis=0)
        line = ax.plot(pos, measured, "o-", label=f"oracle alpha={alpha:g}")[0]
        ax.plot(pos, alpha**pos, "--", color=line.get_color(), alpha=0.7)
    mtp = own_head(df)
    mtp = mtp[mtp.k == k]
    if len(mtp):
        measured = np.mean(np.stack(parse_json(mtp.acceptance_per_position).map(np.asarray).values), axis=0)
        ax.plot(pos, measured, "*-", color="black", ms=10, label="the model's MTP head")
    ax.set_xticks(pos)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(accepted >= i)")
    ax.set_title(f"Per-position acceptance at k={k} (dashed: alpha^i)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def speedup_by_k(df: pd.DataFrame):
    """The MTP head at its own acceptance: speedup over greedy (95% CI) by k, a line per schedule, each point
    labelled with its draft acceptance; greedy is the line at 1."""
    mtp = own_head(df)
    mtp = mtp.assign(prompts=mtp.prompts.fillna("") if "prompts" in mtp else "")
    by = ["schedule", "prompts"] if mtp.prompts.nunique() > 1 else ["schedule"]
    by += ["commit"] if "commit" in mtp and mtp.commit.nunique() > 1 else []
    fig, ax = plt.subplots(figsize=(7.4, 3.8))
    for key, s in mtp.groupby(by):
        label = ", ".join(v or "random prompts" for v in (key if isinstance(key, tuple) else (key,)))
        s = s.groupby("k", as_index=False).first().sort_values("k")
        line = ax.errorbar(s.k, s.speedup, yerr=_ci_err(s.speedup, s.speedup_ci), fmt="o-", capsize=3, label=label)
        for k, y, a in zip(s.k, s.speedup, s.draft_acceptance):
            ax.annotate(f"{a:.0%}", (k, y), textcoords="offset points", xytext=(6, -12), fontsize=7,
                        color=line[0].get_color())
    ax.axhline(1.0, color="grey", lw=1, ls=":")
    ax.text(ax.get_xlim()[0], 1.0, " greedy", va="bottom", fontsize=8, color="grey")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="k (drafts per step)", ylabel="speedup over greedy",
           title="MTP head at its own acceptance (labels: draft acceptance)")
    ax.legend(fontsize=8, title=" / ".join(by).replace("prompts", "prompt set"), title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside the axes: it covers no point
    fig.tight_layout()
    return fig


def slot_counters(long: pd.DataFrame):
    """Replays, fallbacks, invalidations and hazards per point: a row per slot, a column per commit strategy.

    Each panel holds one commit strategy's points (no averaging across strategies), bars labelled
    with their counts; the legend sits above the panels, clear of the bars.
    """
    shown = ("replays", "fallbacks", "invalidations", "hazards")
    colors = {"replays": "#2ca02c", "fallbacks": "#d62728", "invalidations": "#ff7f0e", "hazards": "#000000"}
    commits = sorted(long.commit.unique()) if "commit" in long else [None]
    slots = [s for s in ("primary", "verify") if s in set(long.slot)]
    policies = _policy_order(long.policy.unique())
    width = max(3.6, 0.9 * len(policies) + 1.2)
    fig, axes = plt.subplots(
        len(slots), len(commits), figsize=(width * len(commits), 2.9 * len(slots) + 0.6), squeeze=False, sharey="row"
    )
    for i, slot in enumerate(slots):
        for j, commit in enumerate(commits):
            ax = axes[i][j]
            s = long[(long.slot == slot) & ((long.commit == commit) if commit else True)]
            s = s.groupby("policy")[list(shown)].mean()
            s = s.loc[[p for p in policies if p in s.index]]
            x = np.arange(len(s))
            w = 0.8 / len(shown)
            for n, c in enumerate(shown):
                bars = ax.bar(x + (n - 1.5) * w, s[c], w, label=c, color=colors[c])
                ax.bar_label(bars, labels=[count_text(v) for v in s[c]], fontsize=7, padding=1)
            ax.set_xticks(x, s.index, rotation=15 if len(s) > 2 else 0, fontsize=8)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.margins(y=0.15)
            ax.set_title(f"{slot} slot" + (f", commit={commit}" if commit else ""), fontsize=10)
            if j == 0:
                ax.set_ylabel("count per run")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(shown), title="counter", frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / fig.get_figheight()))
    return fig


def time_split(df: pd.DataFrame):
    """Milliseconds per speculative step in decode, draft, verify and commit, stacked, by commit strategy."""
    s = split_points(df)
    k = int(s.k.iloc[0]) if len(s) else 0
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    if s.empty:
        _empty(ax, "points")
        return fig
    splits = parse_json(s.time_split)
    per_step = pd.DataFrame([{p: v / r * 1e3 for p, v in sp.items()} for sp, r in zip(splits, s.steps)], index=s.index)
    table = per_step.groupby(s.commit).mean()
    bottom = np.zeros(len(table))
    for phase in ("decode", "draft", "verify", "commit"):
        ax.bar(table.index, table[phase], bottom=bottom, label=phase, color=PHASE_COLORS[phase])
        bottom += table[phase].values
    ax.set_ylabel("ms per speculative step")
    counts = s.groupby("commit").size()
    alphas = ", ".join(f"{a:g}" for a in sorted(s.alpha.unique()))
    ax.set_xticks(range(len(table)), [f"{c}\n({counts[c]} point{'s' if counts[c] > 1 else ''})" for c in table.index])
    ax.set_xlabel(f"commit strategy (each bar: the mean over its points, alpha {alphas})")
    ax.set_title(f"Step time split (k={k}, policy={s.policy.iloc[0]}, {SCHEDULE})")
    ax.legend(title="phase", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def memory_by_policy(df: pd.DataFrame):
    """Peak bytes held by all mtplab arenas (named buffers, pool blocks, persistent state) per policy, over the commit
    strategies every policy ran (a mean over unlike sets of commits would compare the commits, not the policies)."""
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    g = policy_grid(df)
    ran = [set(c.commit) for _, c in g.groupby("policy")]
    shared = set.intersection(*ran) if ran else set()
    g = g[g.commit.isin(shared)] if shared else g
    peak = peak_arena_mib(g)
    m = peak.groupby(g.policy).mean()
    m = m.loc[_policy_order(m.index)]
    ax.bar(m.index, m.values, color=[POLICY_COLORS.get(p, "gray") for p in m.index])
    ax.set_ylabel("peak MiB held by mtplab arenas\n(state, buffers, pool blocks)")
    ax.set_xlabel("arena policy")
    where = f"k={g.k.iloc[0]}" + (f", alpha={g.alpha.iloc[0]:g}" if len(set_acceptance(g)) == len(g) else "")
    commits = sorted(g.commit.unique())
    over = f"commit={commits[0]}" if len(commits) == 1 else f"mean over {len(commits)} commit strategies"
    ax.set_title(f"Peak arena memory per policy\n({where}, {over})")
    fig.tight_layout()
    return fig


def point_title(config: dict) -> str:
    """The point's parameters in one line (what a figure of it is titled with)."""
    c = upgrade(config)
    model = model_name(c["model"], bool(c.get("int4")))
    if c.get("engine", "mtplab") != "mtplab":
        return f"{c['engine']}: k={c['k']}, {model}, {c['tokens']} tokens, seed {c['seed']}"
    return (
        f"k={c['k']}, {drafter_text(c)}, {c['policy']}, {c['commit']}, {c['schedule']}, "
        f"{model}, {c['tokens']} tokens, seed {c['seed']}" + ("" if c.get("validate", True) else ", validation off")
        + (f", batch {c['batch']} (seeds {c['seed']}..{c['seed'] + c['batch'] - 1})" if c.get("batch", 1) > 1 else "")
    )


def point_figure(result: dict):
    """One point, titled with its parameters: the step's time split and per-position acceptance against theory."""
    if not result["theory"]:  # a peer run: no step split or per-position acceptance to show
        fig, a = plt.subplots(figsize=(4.8, 3.2))
        a.bar(
            ["greedy", f"MTP k={result['config']['k']}"],
            [result["greedy_tokens_per_s"], result["tokens_per_s"]],
            color=["gray", "#2ca02c"],
        )
        a.set_ylabel("tokens/s")
        a.set_title(f"speedup {result['speedup']:.2f}x, draft acceptance {result['draft_acceptance']:.0%}")
        fig.suptitle(point_title(result["config"]), fontsize=9)
        fig.tight_layout()
        return fig
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    steps = max(1, engine_steps(result))
    split = {p: v / steps * 1e3 for p, v in result["time_split"].items()}
    a.bar(list(split), list(split.values()), color=[PHASE_COLORS[p] for p in split])
    a.set_ylabel("ms per step")
    theory = result["theory"]
    a.set_title(f"speedup {result['speedup']:.2f}x" + (f" (theory {theory['speedup']:.2f}x)" if "speedup" in theory
                                                       else " (no prediction: the drafter's acceptance is unknown)"))
    k = result["config"]["k"]
    pos = np.arange(1, k + 1)
    b.plot(pos, result["acceptance_per_position"], "o-", label="measured")
    if "acceptance_per_position" in theory:
        b.plot(pos, theory["acceptance_per_position"], "--", label="alpha^i" + (f", alpha={theory['alpha']:.2f}" if "alpha" in theory else ""))
    b.set_xticks(pos)
    b.set_ylim(0, 1.05)
    b.set_xlabel("draft position i")
    b.set_ylabel("P(accepted >= i)")
    b.legend()
    fig.suptitle(point_title(result["config"]), fontsize=10)
    fig.tight_layout()
    return fig
