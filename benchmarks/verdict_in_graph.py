"""The greedy verdict inside the graph (what the engine runs) against the same verdict on the host, side by side on
a real target graph.

Every graph the engine runs outputs its own greedy choice (mtplab.model.greedy_outputs: an ArgMax, and the count of
leading drafts equal to it), so a greedy step reads k + 1 tokens and a count, not logits. The alternative it
replaced: the verify's logits [1, k+1, V] read by the host, which takes their argmax and the longest run of drafts
equal to it in NumPy. Both sides here run the target's verify at M = k+1 through an IOBinding bound to preallocated
host buffers, the decode's feeds and state from a prefilled prompt; "host" is the original graph's run followed by
NumPy's argmax and leading run, "graph" the appended graph's run alone (its tokens and count read from its bound
outputs). Before timing, both sides judge three sets of drafts (random ones, the target's own argmax fed back until
it holds, and those with their last draft changed) and must give the same tokens and counts. Rounds alternate which
side runs first; each round times a block of calls per side and the ratio graph / host of their mean times is taken
per round. Prints microseconds per verify and the ratio's median with its 95% bootstrap interval; `uptime` before
and after.

    python benchmarks/verdict_in_graph.py [--models tiny small] [--k 3] [--calls 2000] [--rounds 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import subprocess
import time

import numpy as np
import onnx

from mtplab.base.threads import session_options
from mtplab.engine.models import model_for
from mtplab.experiment.config import RunConfig
from mtplab.measure import stats
from mtplab.model.greedy_outputs import ACCEPTED, TOKENS, append_greedy_outputs
from mtplab.model.stepper import Stepper


def host_verdict(drafts: np.ndarray, logits: np.ndarray) -> tuple[int, np.ndarray]:
    """(kept drafts, targets) of one row on the host: NumPy's argmax, then the leading drafts equal to it."""
    targets = logits[0].argmax(-1)
    missed = drafts[0] != targets[:-1]
    return int(missed.argmax()) if missed.any() else len(missed), targets


class BoundVerify:
    """One verify at M tokens on a session, inputs and outputs bound once to host buffers."""

    def __init__(self, session, feeds: dict, outputs: list[str]):
        self.session, self.feeds, self.binding = session, feeds, session.io_binding()
        for name, a in feeds.items():
            self.binding.bind_cpu_input(name, a)
        self.out = dict(zip(outputs, session.run(outputs, feeds)))
        for name, a in self.out.items():
            self.binding.bind_output(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)

    def run(self) -> None:
        self.session._sess.run_with_iobinding(self.binding._iobinding, None)

    def run_on(self, ids_name: str, ids: np.ndarray, names: list[str]) -> list[np.ndarray]:
        """The named outputs of one unbound run with other token ids (the bound buffers untouched)."""
        return self.session.run(names, {**self.feeds, ids_name: ids})


def same_verdicts(host: BoundVerify, graph: BoundVerify, ids_name: str, logits: str, ids: np.ndarray) -> list[int]:
    """The accepted counts both sides agree on for random drafts, the target's own argmax (fed back until it holds:
    every draft kept) and the same with its last draft changed; AssertionError where they differ."""
    cases, own = [ids], ids.copy()
    for _ in range(ids.shape[1]):
        own[:, 1:] = host.run_on(ids_name, own, [logits])[0].argmax(-1)[:, :-1]
    cases += [own, own.copy()]
    cases[2][0, -1] = (cases[2][0, -1] + 1) % host.out[logits].shape[-1]
    counts = []
    for case in cases:
        count, tokens = host_verdict(case[:, 1:], host.run_on(ids_name, case, [logits])[0])
        g_tokens, g_count = graph.run_on(ids_name, case, [TOKENS, ACCEPTED])
        assert np.array_equal(tokens, g_tokens[0]) and count == int(g_count[0]), (case, count, g_count)
        counts.append(count)
    return counts


def setup(model: str, k: int, threads: int):
    """(host side, graph side, the verify's ids) on `model` at M = k+1, after a prefill of a seeded prompt."""
    import onnxruntime as ort

    desc = model_for(RunConfig(model=model)).description
    stepper = Stepper(desc, threads=threads)
    rng = np.random.default_rng(0)
    stepper.forward(rng.integers(1, desc.vocab_size, 16))
    first = int(stepper.forward(rng.integers(1, desc.vocab_size, 1))["logits"][-1].argmax())
    ids = np.array([[first] + rng.integers(1, desc.vocab_size, k).tolist()], dtype=np.int64)
    io = stepper.io
    feeds = {n: np.ascontiguousarray(a) for n, a in stepper.feeds(ids).items()}
    outputs = stepper.output_names()
    original = onnx.load(str(stepper.original))
    appended = onnx.ModelProto()
    appended.CopyFrom(original)
    append_greedy_outputs(appended, io.input_ids, io.logits)
    so = session_options(threads)
    host = BoundVerify(ort.InferenceSession(original.SerializeToString(), so, providers=["CPUExecutionProvider"]),
                       feeds, outputs)
    graph = BoundVerify(ort.InferenceSession(appended.SerializeToString(), so, providers=["CPUExecutionProvider"]),
                        feeds, outputs + [TOKENS, ACCEPTED])
    return host, graph, ids, io.input_ids, io.logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "small"])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000, help="verifies per side per round")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"verify at M = k+1 = {args.k + 1}, {args.calls} calls per side per round, {args.rounds} rounds alternating, "
          f"{args.threads} thread(s); microseconds per verify, median over rounds")
    print(f"{'model':>8} {'host: run + accept':>19} {'graph: run':>11} {'graph / host [95% CI]':>27}  "
          "same counts (random, own argmax, last changed)")
    for model in args.models:
        host, graph, ids, ids_name, logits = setup(model, args.k, args.threads)
        counts = same_verdicts(host, graph, ids_name, logits, ids)
        drafts = ids[:, 1:]

        def host_side(host=host, drafts=drafts, logits=host.out[logits]):
            host.run()
            return host_verdict(drafts, logits)

        sides = {"host": host_side, "graph": graph.run}
        us = {s: [] for s in sides}
        for r in range(args.rounds):
            for s in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                f, t0 = sides[s], time.perf_counter()
                for _ in range(args.calls):
                    f()
                us[s].append((time.perf_counter() - t0) / args.calls * 1e6)
        ratio = np.array(us["graph"]) / np.array(us["host"])
        lo, hi = stats.bootstrap_ci(ratio)
        print(f"{model:>8} {stats.median(us['host']):19.1f} {stats.median(us['graph']):11.1f} "
              f"{stats.median(ratio):12.3f} [{lo:.3f}, {hi:.3f}]  {counts}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
