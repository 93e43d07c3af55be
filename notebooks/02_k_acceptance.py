# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
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
sweep_dir = "../results/demo"

# %%
from mtplab import plots, store

df = store.load(sweep_dir)
df = df[df.status == "ok"]

# %%
fig = plots.speedup_vs_alpha(df)

# %%
fig = plots.tokens_per_s_vs_alpha(df)

# %%
fig = plots.acceptance_vs_theory(df)

# %%
fig = plots.per_position(df)
