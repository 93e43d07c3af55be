"""mtplab against onnxruntime-genai on one model (the small preset, or --model), one process, same prompt.

Greedy tokens/s (mtplab's Primary plan replays vs og.Generator) and MTP tokens/s at k = 1..4 with
the real head (mtplab's `select` commit on both schedules vs og.MtpGenerator), every output checked
against greedy. Beside greedy, its captured plan replayed n - 1 times in a bare loop (no token, length or
bookkeeping work, one position): the ceiling of any host loop on this forward. Runs are interleaved (A B A B ...) and medians reported with 95% bootstrap CIs, so
drift cancels out; each starts once the run before's pool stopped spinning (mtplab.base.threads.settle). Both engines' targets run on the same intra-op threads (genai through genai_config
session_options; its MTP head on one, as the peer's export sets it: mtplab.experiment.genai_export.HEAD_THREADS), both generators are warmed up, and every run counts the n - 1 tokens after the
prefill's token, timed from after the prefill (mtplab.measure.rounds's rates).

mtplab's sessions share one onnxruntime thread pool (what its runs do: mtplab.base.threads), or with
--pool per-session each has its own (how mtplab ran before); genai keeps its own settings either way.

    python benchmarks/mtplab_vs_genai.py [--rounds 3] [--tokens 128] [--model small|DIR] [--threads N]
                                         [--pool global|per-session] [--json FILE] [--no-settle]
"""

from __future__ import annotations

import argparse
import json
import time

from mtplab.base.threads import settle, thread_pool, use_global_pool
from mtplab.engine.engine import Engine
from mtplab.engine.models import model_for
from mtplab.experiment.config import RunConfig
from mtplab.experiment.genai_point import exported
from mtplab.experiment.genai_runner import GenaiPeer
from mtplab.measure import rounds as measure
from mtplab.measure.stats import summarize
from mtplab.model.prompts import prompt_tokens
from mtplab.runtime.executor import Slot

BARE = "greedy bare plan replay"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--model", default="small", help="a preset name or a builder output folder")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads of both engines (0: every core)")
    ap.add_argument("--pool", choices=("global", "per-session"), default="global", help="mtplab's thread pools")
    ap.add_argument("--json", help="also write the medians and ratios here")
    ap.add_argument("--no-settle", action="store_true",
                    help="start each run at once, inside the spin of the pool before it (how this ran before)")
    args = ap.parse_args()
    if args.pool == "global":
        use_global_pool(args.threads)
    named = {"model": args.model}
    art = model_for(RunConfig(**named))
    n = args.tokens
    prompt = prompt_tokens(art.description.vocab_size, 8, 0)
    peer = GenaiPeer(exported(art, args.threads))
    engines = {
        (sched, k): Engine(RunConfig(**named, k=k, drafter="mtp", commit="select", schedule=sched, threads=args.threads), art)
        for sched in ("decode-verify", "fused")
        for k in args.ks
    }
    greedy_engine = engines[("fused", args.ks[0])]
    reference = greedy_engine.greedy(prompt, n).tokens
    peer.greedy(prompt, 16)  # warm-ups: both genai generators, every mtplab engine
    for k in args.ks:
        peer.mtp(prompt, 16, k)
    for e in engines.values():
        e.speculative(prompt, 16)
    rates: dict[str, list[float]] = {}
    identical: dict[str, bool] = {}

    def record(name: str, tokens: list[int], seconds: float) -> None:
        rates.setdefault(name, []).append(measure.tokens_per_s(tokens, n, seconds))
        identical[name] = identical.get(name, True) and tokens[: len(reference)] == reference[: len(tokens)]

    plan = greedy_engine.target.state[Slot.PRIMARY].plan  # greedy's captured M=1 plan
    wait = (lambda: 0.0) if args.no_settle else settle

    for _ in range(args.rounds):  # each run starts once the run before's pool stopped spinning (settle)
        wait()
        g = greedy_engine.greedy(prompt, n, margins=False)
        record("greedy mtplab", g.tokens, g.seconds)
        wait()
        t0 = time.perf_counter()
        for _ in range(n - 1):  # the same plan replayed n - 1 times, nothing else: no host loop can be faster
            plan.run()
        rates.setdefault(BARE, []).append((n - 1) / (time.perf_counter() - t0))
        wait()
        tokens, seconds = peer.greedy(prompt, n)
        record("greedy genai", tokens, seconds)
        for k in args.ks:
            for sched in ("decode-verify", "fused"):
                wait()
                out = engines[(sched, k)].speculative(prompt, n)
                record(f"mtp k={k} mtplab {sched}", out["tokens"][:n], out["seconds"])
            wait()
            tokens, seconds, _ = peer.mtp(prompt, n, k)
            record(f"mtp k={k} genai", tokens, seconds)
    med = {name: summarize(v) for name, v in rates.items()}
    print(f"{art.description.name}, {n} tokens, medians [95% CI] of {args.rounds} interleaved rounds, tokens/s; identity")
    print(f"{'run':34} {'tok/s':>8} {'95% CI':>16} {'identical':>10}")
    for name, s in med.items():
        lo, hi = s["ci"]
        print(f"{name:34} {s['median']:8.1f} [{lo:6.1f}, {hi:6.1f}] {str(identical.get(name, '-')):>10}")

    ratios = {}

    def ratio(name: str, a: str, b: str) -> str:  # median and CI of the per-round ratios (rounds are paired)
        r = ratios[name] = measure.paired_ratio(rates[a], rates[b])
        return f"{r['median']:.2f}x [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"

    print(f"\ngreedy mtplab / genai: {ratio('greedy', 'greedy mtplab', 'greedy genai')}")
    print(f"greedy's bare plan replay / genai (the most a host loop could reach): {ratio('bare', BARE, 'greedy genai')}")
    for k in args.ks:
        for sched in ("decode-verify", "fused"):
            text = ratio(f"mtp k={k} {sched}", f"mtp k={k} mtplab {sched}", f"mtp k={k} genai")
            print(f"k={k}: mtplab MTP {sched} / genai MTP: {text}")
    print(f"mtplab's thread pool: {thread_pool()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": art.description.name, "threads": args.threads, "pool": thread_pool(),
                       "settled": not args.no_settle,
                       "rates": med, "ratios": ratios, "identical": identical}, f, indent=1, default=float)


if __name__ == "__main__":
    main()
