"""Each standard figure's recipe, once: whether the sweep can fill it, its caption, and the drawing.

The report notebook and the notebooks that show part of it (02_k_acceptance, 03_arena_and_commit)
call these, so a figure reads the same wherever it appears. Each takes the sweep's points that ran
(status ok), shows its caption in the notebook and returns the figure; when the sweep's points cannot fill it
(mtplab.report.selection.figures_for) it returns None, saying in one line what it needs where a notebook asked for
it (the report shows only the figures it can fill: `show` asks quietly). STANDARD lists the report's figures in
order: a new figure is a drawing in plots.py and a recipe here, added to STANDARD.
"""

from __future__ import annotations

import pandas as pd

from mtplab.report import (
    baseline,
    batches,
    findings,
    plots,
    plots_head,
    plots_k,
    plots_points,
    plots_sampling,
    provenance,
    selection,
    tables,
)
from mtplab.report.drawable import batch_one, fills, markdown, not_drawn, quiet


def _captioned(ok: pd.DataFrame, figure: str, caption: str, draw):
    """The recipe of a figure under a caption of its own: nothing when the sweep cannot fill it."""
    if not fills(ok, figure):
        return None
    markdown(caption)
    return draw(ok)


def per_model(figure, ok: pd.DataFrame, *args):
    """A figure for each model of the sweep, each under its model's name (one model: the figure alone).

    Figures of different models never share axes: their forwards cost differently. A figure sees the batch-1
    rows only unless it draws batches itself (`all_batches`): a batch row's speedup is over greedy at its own B.
    """
    if not getattr(figure, "all_batches", False):
        ok = selection.batch_one(ok)
    names = selection.models(ok)
    if len(names) <= 1:
        return figure(ok, *args)
    from IPython.utils.capture import capture_output

    for name in names:
        with capture_output(stdout=False, stderr=False) as shown:  # the recipe's caption, if it draws at all
            fig = figure(ok[ok.model_name == name], *args)
        empty = _empty(fig)
        if empty and not shown.outputs:
            continue
        markdown(f"**Model `{name}`**")
        shown.show()
        if not empty:
            _display(fig)
    return None


def _empty(fig) -> bool:
    """A recipe drew nothing: no figure, or an empty table."""
    return fig is None or (isinstance(fig, pd.DataFrame) and fig.empty)


def _display(fig) -> None:
    """Show a figure or a table in the notebook's output, now (a figure is closed after)."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    display(fig)
    if hasattr(fig, "savefig"):
        plt.close(fig)


@batch_one
def speedup_vs_alpha(ok: pd.DataFrame):
    """Speedup against the oracle's alpha, one line per k, the prediction dashed."""
    if not fills(ok, "alpha_grid"):
        return None
    markdown(
        "## Speedup against acceptance\n"
        "Oracle drafter (controlled per-position acceptance alpha; performance only, never accuracy). "
        "Solid: measured. Dashed: predicted from alpha and the calibration's cost ratios (measured apart from any point)."
    )
    return plots.speedup_vs_alpha(ok)


@batch_one
def head_by_k(ok: pd.DataFrame):
    """The MTP head's speedup by k at its own acceptance, per schedule."""
    return _captioned(ok, "head_by_k", "## The MTP head at its own acceptance\n"
                      "Speedup over greedy by k (95% CI), the model's own head drafting; each point labelled with the "
                      "share of its drafts the verify kept.", plots.speedup_by_k)


@batch_one
def every_point(ok: pd.DataFrame):
    """Each point's speedup with its interval, a row each, fastest first."""
    return _captioned(ok, "every_point", "## Every point\n"
                      "Each point's speedup over greedy (the median of its paired rounds, 95% CI), fastest on top, "
                      "named by what varies between the points; hollow: not stable (CI half-width above 5%).",
                      plots_points.every_point)


@batch_one
def tokens_per_s_vs_alpha(ok: pd.DataFrame):
    """Speculative tokens/s against the oracle's alpha, greedy dotted."""
    return plots.tokens_per_s_vs_alpha(ok) if fills(ok, "alpha_grid") else None


@batch_one
def acceptance(ok: pd.DataFrame):
    """Acceptance length against Leviathan's formula."""
    if not fills(ok, "acceptance"):
        return None
    markdown(
        "## Acceptance\n"
        "Acceptance length = 1 + accepted/steps (vLLM's definition); per-position acceptance = P(accepted >= i)."
    )
    return plots.acceptance_vs_theory(ok)


@batch_one
def per_position(ok: pd.DataFrame):
    """P(accepted >= i) by draft position at the largest k."""
    return plots.per_position(ok) if fills(ok, "per_position") else None


@batch_one
def slot_counters(ok: pd.DataFrame):
    """Both slots' counters under each arena policy, a panel per slot and commit strategy."""
    if not fills(ok, "counters"):
        return None
    grid = selection.own_engine(selection.policy_grid(ok))  # the peer counts no slots
    ks = sorted(grid.k.unique())
    markdown(
        "## The two slots under each arena policy\n"
        "Counts per run, one panel per slot and commit strategy (nothing averaged across strategies), "
        f"for the {provenance.plural(len(grid), 'point')} "
        + (f"at k={ks[0]}" if len(ks) == 1 else f"at k={', '.join(map(str, ks))} (means per run over them)")
        + (f", alpha={grid.alpha.iloc[0]:g}" if len(selection.set_acceptance(grid)) == len(grid) else "")
        + ". The counts are the checked speculative run's: the greedy reference before it captured the Primary plan, "
        "so Primary's captures count its recaptures only (0 where the plan held)."
    )
    return plots.slot_counters(selection.counters_long(ok))


@batch_one
def counters_table(ok: pd.DataFrame) -> None:
    """The slot counters of the figure above as a table."""
    if fills(ok, "counters"):
        from IPython.display import HTML, display

        display(HTML(tables.counters_html(selection.counters_long(ok))))


@batch_one
def time_split(ok: pd.DataFrame):
    """Where a speculative step's time goes, by commit strategy."""
    return _captioned(ok, "time_split", "## Where a speculative step's time goes, by commit strategy", plots.time_split)


@batch_one
def memory(ok: pd.DataFrame):
    """Peak memory held by mtplab's arenas per policy."""
    return plots.memory_by_policy(ok) if fills(ok, "memory") else None


@batch_one
def peer(ok: pd.DataFrame):
    """mtplab next to onnxruntime-genai: the findings, then tokens/s per k."""
    if not fills(ok, "peer"):
        return None
    markdown(
        "## Side by side with onnxruntime-genai\n"
        "The same model exported in genai's form; og.Generator for greedy, og.MtpGenerator with the real head."
    )
    markdown(findings.peer(ok))
    return plots.peer_comparison(ok)


@batch_one
def greedy_draw(ok: pd.DataFrame):
    """Each point's efficiency against its own greedy (mtplab.report.baseline), under its caption; nothing where no
    greedy has enough points with an efficiency."""
    fig = baseline.efficiency_against_greedy(ok)
    if fig is None and not quiet[0]:
        not_drawn("greedy_draw", len(ok))
    if fig is not None:
        markdown(
            "Each point's efficiency against its own greedy tok/s. The points of one greedy run the same greedy, each "
            "in a process of its own; where the line tilts, a point's greedy drew a speed of its own that its "
            "speculative side did not share, and its speedup moved with it. The line's slope is fitted with greedy "
            "and efficiency from separate rounds of each point, so round noise in both does not tilt it (Measurement "
            "quality above gives it with its CI; `benchmarks/process_spread.py` runs one point in fresh processes to "
            "show the draw)."
        )
    return fig


@batch_one
def by_context(ok: pd.DataFrame):
    """The head's per-position acceptance against the context length before the text it continues."""
    return _captioned(
        ok, "by_context",
        "## The head against context length\n"
        "Each prompt is the last n tokens before the same cut in a held-out file, so every length continues the same "
        "text; P(accepted >= i) pooled over the prompts at each length, 95% interval from resampling the prompts. "
        "Dashed: the length of the rows the model was trained on (its card's), past which its attention layer meets "
        "positions it never saw.",
        plots_head.by_context,
    )


@batch_one
def by_kind(ok: pd.DataFrame):
    """The head's per-position acceptance on each kind of held-out text."""
    return _captioned(
        ok, "by_kind",
        "## The head on each kind of text\n"
        "P(accepted >= i) by draft position on each prompt set (held-out text cut where a kind of text begins), "
        "each kind's verify steps pooled at its largest k; 95% Wilson interval over steps (steps of one text are "
        "not independent: the interval is a lower bound on the uncertainty).",
        plots_head.by_kind,
    )


@batch_one
def head_prediction(ok: pd.DataFrame):
    """The head's measured speedups against the cost model's price at the acceptance it gave, per commit."""
    return _captioned(
        ok, "head_prediction",
        "## The head at its own acceptance, against the cost model\n"
        "Predicted: the calibration's costs (measured apart from any point) priced for the steps each run made, so "
        "the head's acceptance as it fell; measured: the median of the paired rounds (95% CI). Below the diagonal "
        "a point ran slower than its parts cost (efficiency < 1).",
        plots_head.against_prediction,
    )


@batch_one
def head_points(ok: pd.DataFrame) -> None:
    """Every MTP-head point as a table row, the peer's under mtplab's."""
    if not fills(ok, "head_table"):
        return
    from IPython.display import HTML, display

    markdown("**Every MTP-head point** (mtplab's and onnxruntime-genai's, each speedup over its own engine's greedy or "
              "plain sampling). The peer reports no per-position acceptance and no efficiency, and its draft "
              "acceptance is genai's accepted / evaluated (the kept drafts and the first rejected one), not accepted / "
              "drafted: set the engines side by side by tokens/step. At T > 0 mtplab's sampled distribution is tested "
              "apart (`docs/sampling.md`).")
    display(HTML(tables.head_table(ok).to_html(index=False, classes="counters")))


@batch_one
def k_policies(ok: pd.DataFrame):
    """Draft-length policies against the best fixed K, and the K each chose."""
    if not fills(ok, "k_policies"):
        return None
    from IPython.display import HTML, display

    markdown("## Choosing K\n"
              "Each draft-length policy (mtplab.engine.k_policies: probe, onnxruntime-genai's adaptive K; goodput, the "
              "K of the most expected tokens per second; confidence, drafting until the head's top probability falls "
              "below a threshold) against the fixed K of the same sweep, the best of them (found in hindsight, on the "
              "same prompts and temperature) dashed; right, the share of steps the policy drafted K tokens. One "
              "Verify plan per M: K changing from step to step replays plans captured once (the slot counters).")
    fig = plots_k.policies(ok)
    display(HTML(plots_k.policy_table(ok).to_html(index=False, classes="counters")))
    return fig


@batch_one
def temperature(ok: pd.DataFrame):
    """Acceptance and speedup against the sampling temperature, per k (the MTP head; the peer dashed)."""
    return _captioned(
        ok, "temperature",
        "## Sampling: acceptance and speedup against temperature\n"
        "Temperature 0 is greedy decoding (drafts kept while they equal the target's argmax); above it, rejection "
        "sampling (a draft x ~ q kept with probability min(1, p(x)/q(x))), lossless in distribution. Each point's "
        "speedup is over the same engine's own greedy or plain sampling at that temperature.",
        plots_sampling.vs_temperature,
    )


@batch_one
def sampled_acceptance(ok: pd.DataFrame):
    """Rejection sampling's measured acceptance against its expectation sum(min(p, q)), per sampled point."""
    return _captioned(
        ok, "sampled_acceptance",
        "## Sampling: drafts kept at the rate the rule sets\n"
        "A draft x ~ q is kept with probability min(1, p(x)/q(x)), so with probability sum(min(p, q)) at its "
        "position. Each point: the kept share of the drafts its checked run judged, against the mean of "
        "sum(min(p, q)) over the same drafts (the verify's p, the drafter's q). The oracle at temperature > 0 drafts "
        "from alpha * p + (1 - alpha) * a fixed token, so its expectation is alpha plus what p gives that token.",
        plots_sampling.expected_vs_measured,
    )


def batch(ok: pd.DataFrame):
    """Speedup against the batch B per k, and the break-even batch per k, measured and predicted."""
    return _captioned(
        ok, "batch",
        "## Batches: where MTP stops paying\n"
        "B prompts (seeds seed..seed+B-1) decoded together: greedy at [B, 1]; a speculative step verifies [B, k+1] in "
        "one forward, each row with its own acceptance and commit, and the batch steps until its slowest row is done. "
        "Speedup = greedy's seconds over speculative's at the same B (paired rounds, 95% CI). Dashed: predicted from "
        "the calibration at each B (T(B, M), the draft phase and the commit at B) and the expected steps of the "
        "slowest row. Break-even: where the speedup falls through 1, interpolated in log2 B.\n\n"
        + batches.findings(ok),
        _batch_section,
    )


def _batch_section(ok: pd.DataFrame) -> None:
    """The batch figure, then its break-even table and the rows within each point (folded)."""
    from IPython.display import HTML, display

    _display(batches.speedup_vs_batch(ok))
    markdown("**Break-even batch per series** (the speedups at each B, in order):")
    display(HTML(batches.break_even_table(ok).to_html(index=False, classes="counters")))
    spread = batches.per_row_spread(ok)
    if len(spread):
        display(HTML(f"<details><summary>Rows within each batch point ({len(spread)} points: each row's acceptance "
                     "length and tokens/s until it had its tokens, lowest to highest; the step's latency)</summary>"
                     + spread.to_html(index=False, classes="counters") + "</details>"))


batch.all_batches = True


# The report's figures, in the order it shows them (notebooks/report.ipynb shows each for every model).
STANDARD = (head_by_k, by_kind, by_context, head_prediction, head_points, k_policies, speedup_vs_alpha, every_point, tokens_per_s_vs_alpha, acceptance, per_position,
            temperature, sampled_acceptance,
            slot_counters, counters_table, time_split, memory, peer, batch)


def show(figure, ok: pd.DataFrame, *args) -> None:
    """Show one figure for every model of the sweep (per_model), in the notebook's output, in order; a figure the
    points cannot fill is left out without a word (the report shows what it has)."""
    quiet[0] = True
    try:
        fig = per_model(figure, ok, *args)
    finally:
        quiet[0] = False
    if not _empty(fig):
        _display(fig)
