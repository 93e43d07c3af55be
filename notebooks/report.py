# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: mtplab
#     language: python
#     name: mtplab
# ---

# %% tags=["parameters"]
sweep_dir = "../results/demo"

# %%
import json
from pathlib import Path

from IPython.display import HTML, Markdown, display

from mtplab import findings, plots, provenance, store, tables

sweep = json.loads((Path(sweep_dir) / "sweep.json").read_text())
df = store.load(sweep_dir)
ok = df[df.status == "ok"]
show = plots.figures_for(ok)
display(HTML(tables.CSS + provenance.header_html(sweep, df)))
display(Markdown(provenance.HOW_TO_READ))

# %% [markdown]
# ## Findings

# %%
display(Markdown(findings.summary(df)))

# %%
if show["alpha_grid"]:
    display(Markdown(
        "## Speedup against acceptance\n"
        "Oracle drafter (controlled per-position acceptance alpha; performance only, never accuracy). "
        "Solid: measured. Dashed: predicted from alpha and the calibration's cost ratios (measured apart from any point)."
    ))
    fig = plots.speedup_vs_alpha(ok)

# %%
if show["alpha_grid"]:
    fig = plots.tokens_per_s_vs_alpha(ok)

# %%
if show["acceptance"]:
    display(Markdown(
        "## Acceptance\n"
        "Acceptance length = 1 + accepted/steps (vLLM's definition); per-position acceptance = P(accepted >= i)."
    ))
    fig = plots.acceptance_vs_theory(ok)

# %%
if show["per_position"]:
    fig = plots.per_position(ok)

# %%
if show["counters"]:
    long, grid = plots.counters_long(ok), plots.policy_grid(ok)
    display(Markdown(
        "## The two slots under each arena policy\n"
        "Counts per run, one panel per slot and commit strategy (nothing averaged across strategies), "
        f"for the {provenance.plural(len(grid), 'point')} at k={grid.k.iloc[0]}"
        + (f", alpha={grid.alpha.iloc[0]:g}" if (grid.drafter == "oracle").all() else "") + "."
    ))
    fig = plots.slot_counters(long)

# %%
if show["counters"]:
    display(HTML(tables.counters_html(long)))

# %%
if show["time_split"]:
    display(Markdown("## Where a speculative step's time goes, by commit strategy"))
    fig = plots.time_split(ok)

# %%
if show["memory"]:
    fig = plots.memory_by_policy(ok)

# %%
if show["peer"]:
    display(Markdown(
        "## Side by side with onnxruntime-genai\n"
        "The same model exported in genai's form; og.Generator for greedy, og.MtpGenerator with the real head."
    ))
    display(Markdown(findings.peer(df)))
    fig = plots.peer_comparison(ok)

# %% [markdown]
# ## All points

# %%
display(HTML(tables.points_html(df)))

# %% [markdown]
# ## Measurement quality
# Every point: an untimed checked pass, then paired timed rounds (greedy and speculative, order
# alternating); speedup = median of the rounds' ratios with a 95% bootstrap CI; a point is stable
# when the CI half-width is at most 5% of the median. Predicted curves come from the sweep's
# calibration (`calibration.json`: forward, head and commit times measured apart from any point),
# never from a point's own times; efficiency = measured / predicted speedup.

# %%
from mtplab import quality

calibration = quality.load_calibration(sweep_dir)
display(Markdown(quality.quality_markdown(df, sweep, calibration)))

# %%
fig = quality.speedup_with_ci(ok, calibration)

# %%
display(quality.efficiency_table(ok))

# %%
fig = quality.drift(df)
