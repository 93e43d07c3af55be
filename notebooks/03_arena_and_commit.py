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
# # Arena policies and commit strategies
# Replays, fallbacks and invalidations per slot by policy; the time of a speculative step split
# into decode, draft, verify and commit, by commit strategy; memory held per policy.

# %% tags=["parameters"]
sweep_dir = "../results/demo"

# %%
from mtplab import plots, store

df = store.load(sweep_dir)
df = df[df.status == "ok"]

# %%
fig = plots.slot_counters(plots.counters_long(df))

# %%
fig = plots.time_split(df)

# %%
fig = plots.memory_by_policy(df)
