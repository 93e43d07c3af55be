"""per-position against select, side by side: the same model, prompt, drafts and tokens, only the commit differs.

One process, one engine per commit and K; each round times one speculative generation on each (the order
alternating from round to round, so that drift falls on both), and the ratio per-position / select of their times
is taken per round. Prints, per K: the median ratio with its 95% bootstrap interval, and each commit's median verify
and commit phase per step (what per-position trades: a verify that writes a state per token, a commit that is a
copy). Run on a quiet machine; `uptime` is printed before and after.

    python benchmarks/per_position.py [--model pycode] [--prompts code] [--ks 2 4] [--rounds 30] [--tokens 128]
"""

from __future__ import annotations

import argparse
import os
import subprocess

import numpy as np

from mtplab.engine.engine import Engine
from mtplab.engine.models import model_for
from mtplab.experiment.config import RunConfig
from mtplab.measure import stats
from mtplab.model.prompts import run_prompt

COMMITS = ("select", "per-position")


def alternate(engines: dict, prompt: list[int], tokens: int, rounds: int) -> tuple[dict, dict]:
    """Each round one speculative generation on every engine, the order reversed every other round: each engine's
    seconds per round, and its verify and commit phases per step (ms) per round."""
    names = list(engines)
    seconds = {c: [] for c in names}
    split = {c: {"verify": [], "commit": []} for c in names}
    for i in range(rounds):
        for c in names if i % 2 == 0 else names[::-1]:
            out = engines[c].speculative(prompt, tokens)
            seconds[c].append(out["seconds"])
            steps = len(out["accepted"])
            for phase in ("verify", "commit"):
                split[c][phase].append(out["split"][phase] / steps * 1e3)
    return seconds, split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pycode", help="a preset name or a model folder")
    ap.add_argument("--prompts", default="code", help="a folder's held-out prompt set ('' for random tokens)")
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--schedule", default="fused")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    base = RunConfig(model=args.model, prompts=args.prompts, drafter="mtp", schedule=args.schedule,
                     tokens=args.tokens, threads=args.threads)
    art = model_for(base)
    print(f"{args.model} ({args.prompts or 'random'} prompts), {args.schedule}, MTP head, {args.tokens} tokens, "
          f"{args.threads} threads, {args.rounds} rounds alternating")
    print(f"{'K':>2} {'per-position / select time':>27} {'verify ms/step':>22} {'commit ms/step':>22}")
    for k in args.ks:
        runs = {c: base.replace(k=k, commit=c) for c in COMMITS}
        engines = {c: Engine(r, art) for c, r in runs.items()}
        prompt = run_prompt(runs["select"], engines["select"].desc.vocab_size)
        outs = {c: e.speculative(prompt, args.tokens) for c, e in engines.items()}  # warm-up, and the tokens
        assert outs["select"]["tokens"] == outs["per-position"]["tokens"], "the two commits emitted different tokens"
        seconds, split = alternate(engines, prompt, args.tokens, args.rounds)
        ratio = np.asarray(seconds["per-position"]) / np.asarray(seconds["select"])
        lo, hi = stats.bootstrap_ci(ratio)

        both = {phase: " / ".join(f"{stats.median(split[c][phase]):.3f}" for c in COMMITS) for phase in ("verify", "commit")}
        print(f"{k:2d} {stats.median(ratio):13.3f} [{lo:.3f}, {hi:.3f}] {both['verify']:>22} {both['commit']:>22}")
    print("(verify and commit columns: select / per-position)")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), f"pid {os.getpid()}")


if __name__ == "__main__":
    main()
