"""mtplab against onnxruntime-genai on the small preset, one process, same model and prompt.

Greedy tokens/s (mtplab's Primary plan replays vs og.Generator) and MTP tokens/s at k = 1..4 with
the real head (mtplab's `select` commit on both schedules vs og.MtpGenerator), every output checked
against greedy. Runs are interleaved (A B A B ...) and medians reported, so drift cancels out.

    python benchmarks/peer.py [--rounds 3] [--tokens 128]
"""

from __future__ import annotations

import argparse

import numpy as np

from mtplab.config import RunConfig
from mtplab.engine import Engine, prompt_tokens
from mtplab.genai import GenaiPeer
from mtplab.model import build_model, preset
from mtplab.peer import exported


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4])
    args = ap.parse_args()
    art = build_model(preset("small"))
    n = args.tokens
    prompt = prompt_tokens(art.config.vocab_size, 8, 0)
    peer = GenaiPeer(exported(art))
    engines = {
        (sched, k): Engine(RunConfig(preset="small", k=k, drafter="mtp", commit="select", schedule=sched), art)
        for sched in ("decode-verify", "fused")
        for k in args.ks
    }
    greedy_engine = engines[("fused", args.ks[0])]
    reference = greedy_engine.greedy(prompt, n).tokens
    peer.greedy(prompt, 16)
    rates: dict[str, list[float]] = {}
    identical: dict[str, bool] = {}

    def record(name: str, tokens: list[int], seconds: float, count: int) -> None:
        rates.setdefault(name, []).append(count / seconds)
        identical[name] = identical.get(name, True) and tokens[: len(reference)] == reference[: len(tokens)]

    for _ in range(args.rounds):
        g = greedy_engine.greedy(prompt, n)
        record("greedy mtplab", g.tokens, g.seconds, g.decodes)
        tokens, seconds = peer.greedy(prompt, n)
        record("greedy genai", tokens, seconds, len(tokens))
        for k in args.ks:
            for sched in ("decode-verify", "fused"):
                out = engines[(sched, k)].speculative(prompt, n)
                record(f"mtp k={k} mtplab {sched}", out["tokens"][:n], out["seconds"], len(out["tokens"]) - 1)
            tokens, seconds, _ = peer.mtp(prompt, n, k)
            record(f"mtp k={k} genai", tokens, seconds, len(tokens))
    med = {name: float(np.median(v)) for name, v in rates.items()}
    print(f"small preset, {n} tokens, medians of {args.rounds} interleaved rounds, tokens/s; identity against greedy")
    print(f"{'run':34} {'tok/s':>8} {'vs genai greedy':>16} {'identical':>10}")
    for name, rate in med.items():
        print(f"{name:34} {rate:8.1f} {rate / med['greedy genai']:15.2f}x {str(identical[name]):>10}")
    print(f"\nmtplab greedy / genai greedy: {med['greedy mtplab'] / med['greedy genai']:.2f}x")
    for k in args.ks:
        best = max(med[f"mtp k={k} mtplab decode-verify"], med[f"mtp k={k} mtplab fused"])
        print(f"k={k}: mtplab MTP (best schedule) / genai MTP: {best / med[f'mtp k={k} genai']:.2f}x")


if __name__ == "__main__":
    main()
