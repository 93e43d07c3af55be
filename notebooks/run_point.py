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
# `point` holds RunConfig fields by name (`mtplab.experiment.config.RunConfig`: each field's help and allowed
# values); a sweep passes every field. Run by hand, a missing field takes `BY_HAND`'s value (the tiny
# model, the oracle drafter, 64 tokens), else RunConfig's default.

# %% tags=["parameters"]
point = {}
run_dir = ""  # empty: results/run_point/<point id>/
calibration_file = ""  # a sweep's calibration.json (empty: this machine's cached calibration)

# %%
from pathlib import Path

from mtplab.experiment.calibrate import sweep_calibration
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import dedicate_process, run_point
from mtplab.experiment.result_text import result_text
from mtplab.report import plots
from mtplab.sweep import workspace
from mtplab.sweep.grid import Point

BY_HAND = {"model": "tiny", "drafter": "oracle", "tokens": 64}
run = RunConfig.from_dict(BY_HAND | point)
dedicate_process(run)  # this kernel runs this point only: its sessions share one thread pool
run_dir = Path(run_dir) if run_dir else workspace.output_folder(f"run_point/{Point(run).id}")
result = run_point(run, calibration=sweep_calibration(calibration_file, run))
result.save(run_dir / "result.json")
print(result_text(result))

# %%
fig = plots.point_figure(result.to_dict())
fig.savefig(run_dir / "point.png", dpi=110, bbox_inches="tight")
