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
# # The two-slot executor, policy by policy
# The seed's story on the built-in model: one executor holds the M=1 decode plan (Primary) and the
# M=k+1 verify plan (Verify). With one arena sized by the decode, the verify capture declines
# (`shared-jit`). A verify sibling with a private arena fixes that, but only if its step-scoped
# workspace is pinned: unpinned, the signature check invalidates it every step (`sibling`), and
# with the check off the replay writes into memory the decode now owns, which the lossless
# oracle catches. Pinned (`sibling-pinned`) or pre-sized (`shared-max`), both slots replay.

# %% tags=["parameters"]
model = "tiny"
k = 3
tokens = 64
results = "two-slot-executor"  # folder under results/ for the table (CSV) and the figure (PNG)

# %%
import pandas as pd

from mtplab.report import plots
from mtplab.sweep import workspace

pd.set_option("display.max_colwidth", None)  # the reasons in full
out = workspace.output_folder(results)
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point

cases = [("shared-jit", True), ("shared-max", True), ("sibling", True), ("sibling", False), ("sibling-pinned", True)]
rows = []
print("The 'sibling (validation off)' case is the negative control: its LOSSLESS CHECK FAILED banner below is expected.")
for policy, validate in cases:
    r = run_point(RunConfig(model=model, k=k, drafter="mtp", policy=policy, commit="select", tokens=tokens,
                            validate=validate))
    label = policy + ("" if validate else " (validation off)")
    for slot in ("primary", "verify"):
        rows.append({"case": label, "slot": slot, **r.slots[slot], "lossless": r.lossless,
                     "first_divergence": r.identity["first_divergence"], "reason": r.slot_reasons[slot]})
table = pd.DataFrame(rows).astype({"first_divergence": "Int64"})  # a token index, blank where none
table[["case", "slot", "captures", "replays", "fallbacks", "invalidations", "hazards", "lossless", "first_divergence"]]

# %%
table.to_csv(out / "counters.csv", index=False)
fig = plots.slot_counters(table.rename(columns={"case": "policy"}))
fig.savefig(out / "counters.png", dpi=110, bbox_inches="tight")
print(f"written: {out / 'counters.csv'}, {out / 'counters.png'}")

# %% [markdown]
# Why each slot did what it did (the executor's last recorded reason):

# %%
table[table.reason != ""][["case", "slot", "reason"]]
