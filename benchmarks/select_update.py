"""select's host state update: the compiled per-layer replay against numpy's closed form, side by side.

For each preset's GatedDeltaNet layout (one layer's state and transitions row, as a commit sees them) and each
count n of accepted tokens: interleaved rounds of `--calls` calls each of mtplab.runtime.host_replay.replay_state
(the compiled token-by-token loop select runs on the host) and mtplab.model.graph.replay_transitions_closed (the
numpy closed form it replaced), microseconds per call (medians) and the ratio closed / compiled with its 95% CI.
Hot loops: inside a speculative step, between onnxruntime runs, numpy's calls cost two to four times as much
(benchmarks/executor_overhead.py measures the commit there). Each round also checks the compiled result bitwise
against numpy's token-by-token form.

    python benchmarks/select_update.py [--rounds 11] [--calls 200] [--presets tiny small base] [--ns 1 4 8]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

from mtplab.measure.stats import summarize
from mtplab.model import preset
from mtplab.model.graph import replay_transitions_closed, replay_transitions_xp, transition_layout
from mtplab.runtime import host_replay


def case(layout, seed: int = 0):
    """A state [1, Hv, Dv, Dk], its transitions row [1, C*width] (decays in (0.2, 1)) and the row's views."""
    rng = np.random.default_rng(seed)
    flat = rng.standard_normal((1, layout.capacity * layout.width)).astype(np.float32)
    decay, key, delta = layout.split(flat)
    decay[...] = rng.uniform(0.2, 1.0, decay.shape)
    state = rng.standard_normal((1, layout.value_heads, layout.value_dim, layout.key_dim)).astype(np.float32)
    return state, flat, (decay, key, delta)


def per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small", "base"])
    ap.add_argument("--ns", type=int, nargs="+", default=[1, 4, 8])
    args = ap.parse_args()
    print(f"{'preset':8s} {'Hv x Dv x Dk':>13s} {'n':>2s} {'compiled us':>12s} {'closed us':>10s}  closed / compiled")
    for name in args.presets:
        layout = transition_layout(preset(name))
        start, flat, (decay, key, delta) = case(layout)
        for n in args.ns:
            a, b = start.copy(), start.copy()
            host_replay.replay_state(layout, a, flat, n)  # compiled (or loaded from the cache) before timing
            replay_transitions_xp(np, b[0], decay, key, delta, n, layout.group)
            assert np.array_equal(a, b), "the compiled replay is not numpy's token-by-token update bitwise"
            compiled, closed, state = [], [], start.copy()
            runs = [("compiled", functools.partial(host_replay.replay_state, layout, state, flat, n)),
                    ("closed", functools.partial(replay_transitions_closed, state, decay[None], key[None], delta[None],
                                                 n, layout.group))]
            for r in range(args.rounds):
                for what, fn in (runs if r % 2 else runs[::-1]):
                    state[...] = start  # the values stay bounded: decays below 1 over a few hundred calls
                    (compiled if what == "compiled" else closed).append(per_call(fn, args.calls))
            ratio = summarize(list(np.asarray(closed) / np.asarray(compiled)))
            dims = f"{layout.value_heads}x{layout.value_dim}x{layout.key_dim}"
            print(f"{name:8s} {dims:>13s} {n:2d} {np.median(compiled):12.1f} {np.median(closed):10.1f}  "
                  f"{ratio['median']:.2f}x [{ratio['ci'][0]:.2f}, {ratio['ci'][1]:.2f}]")


if __name__ == "__main__":
    main()
