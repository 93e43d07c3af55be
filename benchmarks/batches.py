"""Speculative decoding at every batch size, each point checked row by row: B in {1, 2, 4, 8} x {the oracle at
alpha 0.8 with select, the MTP head, the MTP head sampling at T=0.7 (rejection sampling)} on each model.

Each point is one `run_point` (the checked pass, paired interleaved rounds greedy-against-speculative, the audit), so
its speedup is a median of per-round ratios with a 95% CI, against greedy at the same B (plain sampling at T=0.7 for
the sampled points); its efficiency is measured over predicted from the calibration at that B (made on first use).
Lossless: the rows whose own checks passed (tokens against their greedy where greedy, state and KV after every
commit against a batch-1 reference of the row alone). The load average is printed before and after.

    python benchmarks/batches.py [--models small tests/data/builder-tiny] [--batches 1 2 4 8] [--tokens 64]
                                 [--rounds 5|auto] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os

from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import dedicate_process, run_point

CONFIGS = {  # name: the RunConfig fields it sets
    "oracle a=0.8 select": {"drafter": "oracle", "alpha": 0.8, "commit": "select"},
    "MTP head": {"drafter": "mtp"},
    "MTP head T=0.7": {"drafter": "mtp", "temperature": 0.7, "acceptance": "rejection-sampling"},
}


def _ci(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci and all(c == c for c in ci) else "[-]"


def row(model: str, batch: int, name: str, result) -> dict:
    per_row = (result.extra.get("batch") or {}).get("per_row")
    rows_ok = sum(r["lossless"] for r in per_row) if per_row else int(result.lossless)
    return {"model": os.path.basename(model), "batch": batch, "config": name,
            "greedy_tokens_per_s": result.greedy_tokens_per_s, "tokens_per_s": result.tokens_per_s,
            "speedup": result.speedup, "speedup_ci": result.speedup_ci, "efficiency": result.efficiency,
            "efficiency_ci": result.efficiency_ci, "lossless_rows": f"{rows_ok}/{batch}", "lossless": result.lossless,
            "stable": result.stable, "suspect": bool(result.suspect)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["small", "tests/data/builder-tiny"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=lambda v: v if v == "auto" else int(v), default=5,
                   help="paired rounds per point, or auto (until the CI is within 5%% or the budget is spent)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    print(f"load before: {os.getloadavg()}", flush=True)
    dedicate_process(RunConfig(model="tiny", threads=args.threads))
    rows = []
    print("| model | B | config | greedy tok/s | speculative tok/s | speedup [95% CI] | efficiency [95% CI] | lossless rows |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models:
        for batch in args.batches:
            for name in args.configs:
                run = RunConfig(model=model, batch=batch, tokens=args.tokens, rounds=args.rounds, threads=args.threads,
                                **CONFIGS[name])
                r = row(model, batch, name, run_point(run))
                rows.append(r)
                flags = ("" if r["stable"] else " unstable") + (" suspect" if r["suspect"] else "")
                print(f"| {r['model']} | {batch} | {name} | {r['greedy_tokens_per_s']:.0f} | {r['tokens_per_s']:.0f} | "
                      f"{r['speedup']:.2f} {_ci(r['speedup_ci'])}{flags} | {r['efficiency']:.2f} "
                      f"{_ci(r['efficiency_ci'])} | {r['lossless_rows']} |", flush=True)
    print(f"load after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
