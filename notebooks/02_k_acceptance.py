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

# %% [markdown]
# # k and acceptance
# Speedup and tokens/s against the oracle's per-position acceptance alpha, one line per k, theory
# dashed; acceptance length against Leviathan's formula; per-position acceptance.

# %% tags=["parameters"]
results = "demo"  # a sweep under results/ (`make demo` makes results/demo; missing: the quick form), or a path to one
quick = False  # True: use the smoke sweep results/smoke instead, running it first if missing (seconds)

# %%
from mtplab.report import figures
from mtplab.sweep import store, workspace

sweep_dir = workspace.sweep_folder(results, quick)
df = store.load(sweep_dir)
df = df[df.status.isin(store.LOSSLESS)]  # ok, and suspect (lossless, its timing beyond a band: drawn hollow)
print(f"{sweep_dir}: {len(df)} points")

# %%
fig = figures.speedup_vs_alpha(df)

# %%
fig = figures.tokens_per_s_vs_alpha(df)

# %%
fig = figures.acceptance(df)

# %%
fig = figures.per_position(df)
