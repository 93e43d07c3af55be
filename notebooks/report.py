# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: mtplab
#     language: python
#     name: mtplab
# ---

# %% tags=["parameters"]
sweep_dir = "demo"  # a sweep under results/ (`make demo` makes results/demo; missing: the quick form), or a path to one

# %%
import json
from pathlib import Path

from IPython.display import HTML, Markdown, display

from mtplab.report import figures, findings, provenance, selection, tables
from mtplab.sweep import store, workspace

sweep_dir = workspace.sweep_folder(sweep_dir)
sweep = json.loads((Path(sweep_dir) / "sweep.json").read_text())
df = store.load(sweep_dir)
ok = df[df.status.isin(store.LOSSLESS)]  # ok, and suspect (lossless, its timing beyond a band: drawn hollow)
display(HTML(tables.CSS + provenance.header_html(sweep, df)))
display(Markdown(findings.per_model(findings.answer, df)))
display(Markdown(provenance.HOW_TO_READ))

# %% [markdown]
# ## Findings

# %%
display(Markdown(findings.per_model(findings.sweep_findings, df) + "\n" + findings.drift_findings(sweep)))

# %%
for figure in figures.STANDARD:
    figures.show(figure, ok)

# %% [markdown]
# ## All points
# `speedup` is the median of a point's paired rounds' ratios (speculative over greedy, round by round, with its
# CI); the two tokens/s columns are each side's own median over the rounds. Under a load that moves between
# rounds the quotient of those two medians can differ from the speedup: the speedup is the number to read.

# %%
display(HTML(tables.points_html(df)))

# %% [markdown]
# ## Measurement quality
# Every point: an untimed checked pass, then paired timed rounds (greedy and speculative, order
# alternating); speedup = median of the rounds' ratios with a 95% bootstrap CI; a point is stable
# when the CI half-width is at most 5% of the median. Predicted curves come from the sweep's
# calibration (`calibration.json`: forward, head and commit times measured apart from any point),
# never from a point's own times. Efficiency = measured speedup / the speedup the calibration prices
# for the steps the point made (its accepted counts: a short run lands off its alpha by chance, which
# is no part of how it executed); the dashed curves price alpha itself.

# %%
from mtplab.report import quality

calibration = quality.load_calibration(sweep_dir)
display(Markdown(quality.quality_markdown(df, sweep, calibration)))

# %%
fig = figures.per_model(quality.speedup_with_ci, ok, calibration)

# %%
figures.per_model(quality.efficiency_table, ok)

# %% [markdown]
# Where an efficiency off 1 comes from: each phase's time per step in the points' timed rounds over
# what the calibration prices it at, and greedy's time per token over its calibrated cost (how far
# the machine itself moved since the calibration); medians over the points ("—": nothing to divide, as in the
# fused schedule's decode, which it has not). Diagnosis only: no efficiency reads these times.

# %%
figures.per_model(quality.phase_table, ok, calibration)

# %%
fig = figures.per_model(quality.drift, selection.ran(df))

# %%
fig = figures.per_model(figures.greedy_draw, selection.ran(df))
