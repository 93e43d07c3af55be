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
results = "demo"  # a sweep under results/ (`make demo` makes results/demo), or a path to one
quick = False  # True: use the smoke sweep results/smoke instead, running it first if missing (seconds)

# %%
from mtplab import plots, store, workspace

sweep_dir = workspace.sweep_folder(results, quick)
df = store.load(sweep_dir)
df = df[df.status == "ok"]
show = plots.figures_for(df)
print(f"{sweep_dir}: {len(df)} points")

# %%
if show["alpha_grid"]:
    fig = plots.speedup_vs_alpha(df)

# %%
if show["alpha_grid"]:
    fig = plots.tokens_per_s_vs_alpha(df)

# %%
if show["acceptance"]:
    fig = plots.acceptance_vs_theory(df)

# %%
if show["per_position"]:
    fig = plots.per_position(df)
