"""Host cost per run on the tiny preset: eager session.run, an eager one-shot IOBinding, and a plan replay.

Per slot (Primary M=1, Verify M=k+1), interleaved, medians over many runs; ratios printed side by side.
The tiny model's forward is a few hundred microseconds, so this is mostly host overhead.

    python benchmarks/executor_overhead.py [--k 3] [--runs 400]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mtplab.arena import Arena
from mtplab.executor import Executor, Slot, SlotMemory
from mtplab.model import build_model, preset
from mtplab.runtime import TargetState, make_session, target_io

HOW = ("session.run", "eager IOBinding", "executor replay", "raw replay")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--runs", type=int, default=400)
    args = ap.parse_args()
    art = build_model(preset("tiny"))
    cfg = art.config
    session = make_session(art.target)
    state = TargetState.allocate(art.description, Arena("main"))
    arena = Arena("shared")
    ex = Executor(
        {Slot.PRIMARY: session, Slot.VERIFY: session}, {Slot.PRIMARY: SlotMemory(arena), Slot.VERIFY: SlotMemory(arena)}
    )
    big = target_io(state.desc, state, np.zeros(args.k + 1, dtype=np.int64))
    for n, v in big[0].items():
        arena.reserve(f"feed.{n}", v.shape, v.dtype)
    for n, (s, d) in big[1].items():
        arena.reserve(n, s, d)
    names = [o.name for o in session.get_outputs()]
    times: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.runs + 3):
        for slot, M in ((Slot.PRIMARY, 1), (Slot.VERIFY, args.k + 1)):
            state.length = 16
            feeds, outputs, bound = target_io(state.desc, state, np.arange(M) % cfg.vocab_size)
            plain = dict(feeds)
            plain.update({n: a for n, a, out in bound if not out})
            for how in HOW:
                t0 = time.perf_counter()
                if how == "session.run":
                    session.run(names, plain)
                elif how == "eager IOBinding":
                    ex._eager_temporaries(slot, feeds, outputs, bound)
                elif how == "raw replay":
                    if ex.state[slot].plan is not None:  # none yet during warm-up and capture
                        ex.backend.replay(session, ex.state[slot].plan)
                else:
                    ex.run(slot, feeds, outputs, bound)
                if rep >= 3:
                    times.setdefault((slot.name.lower(), how), []).append(time.perf_counter() - t0)
    print(f"tiny preset, k={args.k}, {args.runs} interleaved runs each, median microseconds per run")
    print("executor replay = signature check of every binding + input staging + run_with_iobinding;")
    print("raw replay = run_with_iobinding on the captured plan alone (what a device graph replay replaces)")
    print(
        f"{'slot':8} "
        + " ".join(f"{h:>16}" for h in HOW)
        + f" {'run/raw':>8} {'run/executor':>12} {'eager/executor':>14}"
    )
    for slot in ("primary", "verify"):
        m = {how: np.median(times[(slot, how)]) * 1e6 for how in HOW}
        cells = " ".join(f"{m[h]:16.1f}" for h in HOW)
        print(
            f"{slot:8} {cells} {m['session.run'] / m['raw replay']:7.2f}x "
            f"{m['session.run'] / m['executor replay']:11.2f}x {m['eager IOBinding'] / m['executor replay']:13.2f}x"
        )
    print(ex.format_counters())


if __name__ == "__main__":
    main()
