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

# %% [markdown]
# # When MTP pays: why it loses to greedy on a hybrid model at batch 1, and what it takes to win
# Everyone who has tried MTP on a hybrid model at batch 1 reports it losing (the seed's engine on an H200:
# greedy ~56 tok/s, MTP 10.6 -> 34.3 tok/s over its fixes, never ahead). This notebook reads a study sweep
# (`mtplab sweep --grid study`) and its calibration: (1) the seed's path reproduced stage by stage, with the
# slot counters each fix moved; (2) the break-even acceptance of each commit strategy and schedule, predicted
# by the calibrated cost model with the measured points on top; (3) the same prediction for your hardware's
# costs, set in the parameters below; (4) the same questions at the acceptance a trained head gives, on the
# shipped `pycode` model (its own sweeps, `mtplab sweep --grid pycode` and `--grid pycode-context`).

# %% tags=["parameters"]
results = "study"  # a study sweep under results/ (`mtplab sweep --grid study` makes it; missing: the quick form), or a path
quick = False  # True: use the smoke sweep instead (seconds): it holds a little of parts 1 and 2
# Part 3, your hardware, in milliseconds. The defaults are the seed's H200 figures where it states them
# (27B int4 hybrid, k=1: greedy ~56 tok/s -> T(1) ~17.9 ms; its 83.3% acceptance counted the guaranteed
# token, (1 + a) / 2 at k=1 -> a ~0.67); the rest are assumptions, to be replaced by your measurements.
t1_ms = 17.9  # one decode forward at M of 1 (a replayed graph)
verify_slope = 0.1  # the verify's growth with M: T(M) is T(1) times (1 + verify_slope (M - 1)) (assumed)
head_ms = 1.0  # one MTP head step (assumed)
select_ms = 0.3  # select's commit: replay the kept transitions (assumed)
restore_ms = 0.1  # restoring the recurrent state before a re-advance (assumed)
greedy_ms = None  # greedy's cost per token (None: t1_ms)
alpha = 0.67  # your drafter's per-position acceptance
ks = [1, 2, 3, 4]
# Part 4, the trained model: its sweeps under results/ (missing: the part says which command makes them).
trained = "pycode"  # `mtplab sweep --grid pycode`: k 1..4 x T {0, 0.7} x every commit, and the peer
context = "pycode-context"  # `mtplab sweep --grid pycode-context`: acceptance by context length
policies = "pycode-k-policy"  # `mtplab sweep --grid pycode-k-policy`: draft-length policies against every fixed K

# %%
from IPython.display import Markdown, display

from mtplab.measure import breakeven
from mtplab.report import quality, study
from mtplab.sweep import store, workspace

sweep_dir = workspace.sweep_folder(results, quick)
df = store.load(sweep_dir)
ok = df[df.status.isin([*store.LOSSLESS, "mismatch"])]  # the negative control (validation off) may be a mismatch
calibrations = quality.load_calibration(sweep_dir)
print(f"{sweep_dir}: {len(df)} points, {len(ok)} ran; calibrations of {sorted(calibrations)}")
display(Markdown("\n".join(quality.auto_rounds_lines(ok) or ["- Rounds: a fixed count per point."])))

# %% [markdown]
# ## 1. The seed's path, reproduced
# Each stage is a point of the sweep: the speedup over greedy (median of paired rounds, 95% CI) and, per
# speculative step, the fallbacks, invalidations and hazards of the Primary (M=1) and Verify (M=k+1) slots in
# the checked run. shared-jit: the Verify slot cannot hold its own plan and falls back every step; sibling: its
# own plan, invalidated when the shared per-step workspace moves; sibling-pinned: both slots replay. Within
# each, readvance-batched re-advances the accepted tokens at M=n on the Primary slot (the seed's Blocker B:
# the Primary plan thrown away), readvance-m1 at M=1 one token at a time, select replays the kept transitions.

# %%
path = study.seed_path(ok)
if path.empty:
    display(Markdown("This sweep has no policy grid (run the study grid)."))
else:
    display(Markdown(f"At {path.point.iloc[0]}. Each speedup is over that point's own greedy, paired round by round: "
                     "read it beside the tok/s columns (greedy drifts between points on a shared machine)."))
    display(study.path_table(path))
    print(study.seed_form(path))
    display(Markdown("\n".join(study.path_changes(path))))
    fig = study.seed_path_figure(path)

# %% [markdown]
# ## 2. Break-even acceptance, from the calibrated cost model
# The smallest alpha at which MTP beats greedy, per commit strategy, schedule and k, from costs measured apart
# from any point (the calibration: T(M), the head step, each commit's cost, greedy's cost per token), for runs as
# long as the sweep's (the last step's overshoot priced). The closed form at k = 1 (an infinitely long run) is
# beside it. readvance-m1 re-advances every consumed token with one M=1 forward: each emitted token then costs
# what greedy pays for it, and the drafts and the verify come on top, so no alpha wins wherever greedy's loop costs
# no more per token than one M=1 forward.

# %%
for name, calib in calibrations.items():
    mine = ok[ok.model_name == name]
    tokens = int(mine.tokens.median()) if len(mine) else None  # the measured runs' length
    display(Markdown(f"### {name}, runs of {tokens} tokens"))
    display(Markdown("Break-even alpha per commit, schedule and k (in brackets: the speedup at alpha = 1); then "
                     "the cost ratios that decide it."))
    display(study.break_even_wide(calib, ks, tokens))
    display(study.cost_ratios(calib, ks))
    display(Markdown("\n".join(study.closed_forms(calib))))
    fig = study.curves(calib, mine, ks=sorted(set(mine.k)) or (1, 3), tokens=tokens)

# %% [markdown]
# ## 3. What your hardware needs (a prediction)
# The same cost model on the costs in the parameters above: the predicted speedup at your alpha and the
# break-even alpha per strategy. Assumptions: both slots replay (no eager forwards), k head steps cost k times
# one, a re-advance costs its forwards (readvance-m1: m T(1); readvance-batched: T(m)) plus a restore, greedy
# pays its cost per token, and the run is long (no last-step overshoot). A prediction, not a measurement.

# %%
yours = breakeven.hardware_calibration(t1_ms, verify_slope, head_ms, select_ms, greedy_ms, restore_ms, max(ks))
display(Markdown(f"Predicted speedup at alpha = {alpha:g}, then the break-even alpha (in brackets: the speedup at "
                 "alpha = 1) and the cost ratios."))
if unpriced := study.priced(yours, ks)[1]:
    display(Markdown(f"Not priced by these costs: {', '.join(unpriced)} (its verify runs a graph of its own, which "
                     "your measurements would have to time: `mtplab calibrate` does on this machine)."))
display(study.at_alpha(yours, alpha, ks))
display(study.break_even_wide(yours, ks))
display(study.cost_ratios(yours, ks))
display(Markdown("\n".join(study.closed_forms(yours))))
fig = study.curves(yours, ks=ks)

# %% [markdown]
# ## 4. At the acceptance a trained head gives
# `pycode` (models/pycode, trained here on the Python standard library) drafts with its own trained MTP head on
# held-out source, so acceptance is what the text gives, not a parameter: it varies with the kind of text, the draft
# position, the context length and the temperature. Each figure has its interval; the table holds every point,
# onnxruntime-genai's MtpGenerator on the same prompts beside mtplab. Last, choosing K as the step goes (probe,
# goodput, confidence) against the best fixed K.

# %%
from mtplab.report import figures

for name in (trained, context, policies):
    folder = workspace.made_sweep(name)
    if folder is None:
        continue
    head = store.load(folder)
    head = head[head.status.isin(store.LOSSLESS)]
    print(f"{folder}: {len(head)} points")
    for figure in (figures.head_prediction, figures.head_points, figures.by_kind, figures.by_context,
                   figures.temperature, figures.peer, figures.k_policies):
        figures.show(figure, head)
