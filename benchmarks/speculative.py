"""Greedy against each commit strategy (small preset by default), oracle alpha=0.8, k=1..4, both schedules.

One process; each point runs its own greedy baseline right before its speculative run, and the
points are repeated in interleaved rounds (A B C ... A B C ...) so machine drift cancels out.
Medians of the measured speedup, the speedup predicted at alpha and the efficiency (measured over the price of the
steps each point made) are printed side by side (each point's rates: mtplab.measure.rounds).

    python benchmarks/speculative.py [--rounds 3] [--tokens 128] [--alpha 0.8] [--backend cuda] [--preset small]
"""

from __future__ import annotations

import argparse
import itertools

from mtplab.engine.engine import Engine
from mtplab.engine.models import model_for
from mtplab.engine.strategies import COMMITS, SCHEDULES
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.measure import stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--alpha", type=float, default=0.8)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--policy", default="sibling-pinned")
    ap.add_argument("--model", default="small", help="a preset name or a builder output folder")
    ap.add_argument("--backend", default="cpu", help="cpu, or cuda (CUDA graphs, the fp16 build)")
    args = ap.parse_args()
    art = model_for(RunConfig(model=args.model, backend=args.backend))
    combos = list(itertools.product(SCHEDULES, COMMITS, args.ks))
    engines = {}
    rows: dict[tuple, list] = {c: [] for c in combos}
    for _ in range(args.rounds):
        for sched, commit, k in combos:
            run = RunConfig(
                model=args.model,
                k=k,
                drafter="oracle",
                alpha=args.alpha,
                policy=args.policy,
                commit=commit,
                schedule=sched,
                tokens=args.tokens,
                backend=args.backend,
            )
            if (sched, commit, k) not in engines:  # one engine (three sessions) per configuration, reused by rounds
                engines[(sched, commit, k)] = Engine(run, art)
            r = run_point(run, art, engines[(sched, commit, k)])
            assert r.lossless, r.verdict
            rows[(sched, commit, k)].append(r)
    print(
        f"{args.model} on {args.backend}, oracle alpha={args.alpha}, policy={args.policy}, {args.tokens} tokens, "
        f"medians of {args.rounds} interleaved rounds"
    )
    print(
        f"{'schedule':14} {'commit':18} {'k':>2} {'greedy tok/s':>12} {'spec tok/s':>10} {'speedup':>8} "
        f"{'at alpha':>9} {'efficiency':>10} {'tok/step':>8} {'T(verify)/T(1)':>14}"
    )
    for (sched, commit, k), rs in rows.items():

        def med(f, rs=rs):
            return stats.median([f(r) for r in rs])

        sp, pr = med(lambda r: r.speedup), med(lambda r: r.theory["speedup"])
        print(
            f"{sched:14} {commit:18} {k:2d} {med(lambda r: r.greedy_tokens_per_s):12.1f} {med(lambda r: r.tokens_per_s):10.1f} "
            f"{sp:7.2f}x {pr:8.2f}x {med(lambda r: r.efficiency):10.2f} {med(lambda r: r.tokens_per_step):8.2f} "
            f"{med(lambda r: r.theory['verify_cost_ratio']):14.2f}"
        )


if __name__ == "__main__":
    main()
