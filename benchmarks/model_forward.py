"""Median forward time per preset for M = 1, 2, 4, 8 and the ratio T(M)/T(1).

That ratio bounds what speculative decoding can win on this machine: a verify of k+1 tokens
costs T(k+1)/T(1) decodes. Runs are plan replays (IOBinding), interleaved across M so that
machine drift cancels out.

    python benchmarks/model_forward.py [--presets tiny small] [--repeats 30]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mtplab.model import build_model, preset_config
from mtplab.runtime.arena import Arena
from mtplab.runtime.executor import Executor, Slot, SlotMemory
from mtplab.runtime.sessions import graph_session
from mtplab.runtime.state import TargetState, target_io

MS = (1, 2, 4, 8)


def measure(name: str, repeats: int, int4: bool = False) -> dict[int, float]:
    art = build_model(preset_config(name, int4))
    cfg = art.config
    main = Arena("main")
    state = TargetState.allocate(art.description, main)
    session = graph_session(art.description.target)
    execs = {M: Executor({Slot.PRIMARY: session}, {Slot.PRIMARY: SlotMemory(Arena(f"M{M}"))}) for M in MS}
    times: dict[int, list[float]] = {M: [] for M in MS}
    for rep in range(repeats + 3):
        for M in MS:
            state.length = 16
            feeds, outputs, bound = target_io(state.desc, state, np.arange(M) % cfg.vocab_size)
            t0 = time.perf_counter()
            execs[M].run(Slot.PRIMARY, feeds, outputs, bound)
            if rep >= 3:  # warm-up, capture, first replay
                times[M].append(time.perf_counter() - t0)
    return {M: float(np.median(t)) for M, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--int4", action="store_true")
    args = ap.parse_args()
    print(
        f"{'preset':8} "
        + " ".join(f"{'T(M=' + str(M) + ') ms':>12}" for M in MS)
        + "  "
        + " ".join(f"{'T' + str(M) + '/T1':>7}" for M in MS[1:])
    )
    for name in args.presets:
        t = measure(name, args.repeats, args.int4)
        print(
            f"{name:8} "
            + " ".join(f"{t[M] * 1e3:12.3f}" for M in MS)
            + "  "
            + " ".join(f"{t[M] / t[1]:7.2f}" for M in MS[1:])
        )


if __name__ == "__main__":
    main()
