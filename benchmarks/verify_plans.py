"""The Verify slot's plans when K changes from step to step, side by side: a plan per M against one padded plan at
M = k + 1 (and the single plan every change of M invalidates).

One process, one engine per setting on the same model, prompt and draft-length policy (confidence: the MTP head stops
drafting below a threshold, so K changes with the text); each round times one speculative generation on each, the
order reversed every other round, and each setting's time over per-length's is taken per round. Prints, per
threshold: the mean K, each ratio's median with its 95% bootstrap interval, the verify phase per step, each
setting's Verify captures and invalidations, and the bytes its plans bind. Run on a quiet machine; `uptime` is
printed before and after.

    python benchmarks/verify_plans.py [--model pycode] [--prompts code] [--k 4] [--thresholds 0.3 0.7] [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import subprocess

import numpy as np
from per_position import alternate

from mtplab.check.trace import plans_held
from mtplab.engine.engine import Engine
from mtplab.engine.models import model_for
from mtplab.experiment.config import RunConfig
from mtplab.measure import stats
from mtplab.model.prompts import run_prompt
from mtplab.runtime.executor import Slot

PLANS = ("per-length", "padded", "one")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pycode", help="a preset name or a model folder")
    ap.add_argument("--prompts", default="code", help="a folder's held-out prompt set ('' for random tokens)")
    ap.add_argument("--k", type=int, default=4, help="the most drafts a step makes")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.7], help="confidence thresholds")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--schedule", default="fused")
    ap.add_argument("--commit", default="select")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    base = RunConfig(model=args.model, prompts=args.prompts, drafter="mtp", k=args.k, k_policy="confidence",
                     schedule=args.schedule, commit=args.commit, tokens=args.tokens, threads=args.threads,
                     max_recaptures=10**6)
    art = model_for(base)
    print(f"{args.model} ({args.prompts or 'random'} prompts), {args.schedule}, {args.commit}, MTP head, K <= {args.k} "
          f"(confidence), {args.tokens} tokens, {args.threads} threads, {args.rounds} rounds alternating")
    print(f"{'threshold':>9} {'mean K':>6} {'padded / per-length':>27} {'one / per-length':>27} "
          f"{'verify ms/step (per-length / padded / one)':>44}")
    for threshold in args.thresholds:
        engines = {p: Engine(base.replace(k_confidence=threshold, verify_plans=p), art) for p in PLANS}
        prompt = run_prompt(base, engines["padded"].desc.vocab_size)
        outs = {p: e.speculative(prompt, args.tokens) for p, e in engines.items()}  # warm-up, and the tokens
        assert len({tuple(o["tokens"]) for o in outs.values()}) == 1, "the settings emitted different tokens"
        counters = {p: e.target.counters()[e.target.labels[Slot.VERIFY]] for p, e in engines.items()}
        seconds, split = alternate(engines, prompt, args.tokens, args.rounds)
        cells = []
        for p in PLANS[1:]:
            ratio = np.asarray(seconds[p]) / np.asarray(seconds["per-length"])
            lo, hi = stats.bootstrap_ci(ratio)
            cells.append(f"{stats.median(ratio):13.3f} [{lo:.3f}, {hi:.3f}]")
        verify = " / ".join(f"{stats.median(split[p]['verify']):.3f}" for p in PLANS)
        print(f"{threshold:9.2f} {np.mean(outs['padded']['k']):6.2f} {cells[0]:>27} {cells[1]:>27} {verify:>44}")
        for p, e in engines.items():
            c, plans = e.target.counters()[e.target.labels[Slot.VERIFY]], plans_held(e)["verify"]
            held = ", ".join(f"M={q['tokens']} {q['plan_bytes'] / 1024:.1f} KiB" for q in sorted(plans, key=lambda q: q["tokens"]))
            print(f"{'':9} {p:>10}: captures {c['captures']} (first run {counters[p]['captures']}), invalidations "
                  f"{c['invalidations']}, fallbacks {c['fallbacks']}; plans {held}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), f"pid {os.getpid()}")


if __name__ == "__main__":
    main()
