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
# # One sweep point
# Greedy baseline and speculative run in one process; writes `result.json` and `point.png` into
# `run_dir` (a sweep passes the point's folder; run by hand, results/run_point/<point id>/).

# %% tags=["parameters"]
preset = "tiny"
k = 3
alpha = 0.8
drafter = "oracle"
policy = "sibling-pinned"
commit = "select"
schedule = "decode-verify"
tokens = 64
backend = "cpu"
seed = 0
engine = "mtplab"
prompt_len = 8
oracle_free_drafts = False
validate = True
retain_decode_graph_across_spec = True
max_recaptures = 3
int4 = False
rounds = 3
run_dir = ""  # empty: results/run_point/<point id>/

# %%
from pathlib import Path

from mtplab import plots, workspace
from mtplab.config import RunConfig
from mtplab.experiment import result_text, run_point
from mtplab.grid import Point

run = RunConfig(
    preset=preset, k=k, alpha=alpha, drafter=drafter, policy=policy, commit=commit, schedule=schedule,
    tokens=tokens, backend=backend, seed=seed, engine=engine, prompt_len=prompt_len,
    oracle_free_drafts=oracle_free_drafts, validate=validate,
    retain_decode_graph_across_spec=retain_decode_graph_across_spec, max_recaptures=max_recaptures, int4=int4,
    rounds=rounds,
)
run_dir = Path(run_dir) if run_dir else workspace.output_folder(f"run_point/{Point(run).id}")
result = run_point(run)
result.save(run_dir / "result.json")
print(result_text(result))

# %%
fig = plots.point_figure(result.to_dict())
fig.savefig(run_dir / "point.png", dpi=110, bbox_inches="tight")
