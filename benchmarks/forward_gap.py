"""Below greedy's loop, where a forward of mtplab's costs more than onnxruntime-genai's: the library build, the
static attention span a replayed plan needs, and what the session ran first.

One M=1 forward of a model, the very same buffers (mtplab's target_io for one token at half the KV capacity, every
input and output bound by address), three ways side by side:
- mtplab's: onnxruntime's Python module (a build of its own, statically linked), bound and run as the CPU plan
  backend binds and replays a plan (its IOBinding through its C entry), the lengths as a replayed plan feeds them
  (the attention span the KV capacity: static shapes);
- the same feeds through the wheel's libonnxruntime.so (the library onnxruntime-genai loads): OrtApi::Run through
  ctypes on OrtValues made once over those buffers;
- the Python module again, the attention span the length + 1: the attention mask (or total_sequence_length) of the
  length, the KV buffers as they are (genai's feeds where its config shares past and present buffers, as the builder
  fixture's does; not a cache whose KV grows too);
- the Python module again, on a session whose first run was a prompt's prefill (8 tokens) instead of this forward:
  onnxruntime's CPU memory keeps the layout of a session's first run, so a session that prefilled first (genai's,
  and mtplab's before its engines warmed their decode up first) decodes at another speed for its whole life.
Same graph (the user's own, as a decode runs it), same session settings (one intra-op and one inter-op thread: no
pool whose spinning either build sets its own way; graph optimizations all on), outputs checked equal. Interleaved
rounds of --runs forwards each (by default as many as take about a quarter of a second); the medians of the
per-round ratios with 95% CIs: Python module / libonnxruntime.so (the build; the library's side also pays a ctypes
call, about 1.4 us, which favours the module by about 1% on the builder fixture's 0.12 ms forward), static /
growing span (the shapes), prefill first / decode first (the session's history). None of these is work any host
loop of mtplab can remove.

The OrtApi entries it calls are the first 70 of onnxruntime_c_api.h's struct OrtApi, whose order every release
keeps (entries are only appended).

    python benchmarks/forward_gap.py [--model tests/data/builder-tiny|small] [--rounds 21] [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import time

import numpy as np
import onnxruntime as ort

from mtplab.engine.models import model_for
from mtplab.experiment.config import RunConfig
from mtplab.measure.stats import summarize
from mtplab.model.description import length_feeds
from mtplab.model.greedy_outputs import ACCEPTED, TOKENS
from mtplab.runtime.arena import Arena
from mtplab.runtime.plans import CpuPlanBackend, direct_runner
from mtplab.runtime.sessions import make_session
from mtplab.runtime.signature import Binding
from mtplab.runtime.state import TargetState, target_io

# OrtApi's entries by index (onnxruntime_c_api.h)
GET_ERROR_MESSAGE, CREATE_ENV, CREATE_SESSION, RUN, CREATE_SESSION_OPTIONS = 2, 3, 7, 9, 10
SET_GRAPH_OPTIMIZATION_LEVEL, SET_INTRA_OP_THREADS, SET_INTER_OP_THREADS = 23, 24, 25
CREATE_TENSOR_WITH_DATA, CREATE_CPU_MEMORY_INFO = 49, 69
ELEMENT = {np.dtype(np.float32): 1, np.dtype(np.int32): 6, np.dtype(np.int64): 7, np.dtype(np.float16): 10}
P = ctypes.c_void_p
MODULE, LIBRARY = "Python module, static span (mtplab's)", "libonnxruntime.so, static span"
GROWING = "Python module, growing span"
PREFILLED = "Python module, session's first run a prefill"
PREFILL = 8  # the prompt PREFILLED's session ran first


class CApiSession:
    """A session of libonnxruntime.so, run on OrtValues over numpy arrays (held, not copied)."""

    def __init__(self, path: str, threads: int):
        lib = ctypes.CDLL(str(pathlib.Path(ort.__file__).parent / "capi" / f"libonnxruntime.so.{ort.__version__}"))
        lib.OrtGetApiBase.restype = P
        base = ctypes.cast(lib.OrtGetApiBase(), ctypes.POINTER(P))
        api = ctypes.cast(ctypes.CFUNCTYPE(P, ctypes.c_uint32)(base[0])(1), ctypes.POINTER(P))  # API version 1's
        self.api, self.message = api, ctypes.CFUNCTYPE(ctypes.c_char_p, P)(api[GET_ERROR_MESSAGE])
        self.env, options, self.session, self.memory = P(), P(), P(), P()
        self._call(CREATE_ENV, (ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(P)), 3, b"mtplab", ctypes.byref(self.env))
        self._call(CREATE_SESSION_OPTIONS, (ctypes.POINTER(P),), ctypes.byref(options))
        self._call(SET_INTRA_OP_THREADS, (P, ctypes.c_int), options, threads)
        self._call(SET_INTER_OP_THREADS, (P, ctypes.c_int), options, 1)
        self._call(SET_GRAPH_OPTIMIZATION_LEVEL, (P, ctypes.c_int), options, 99)  # ORT_ENABLE_ALL
        self._call(CREATE_SESSION, (P, ctypes.c_char_p, P, ctypes.POINTER(P)), self.env, path.encode(), options,
                   ctypes.byref(self.session))
        self._call(CREATE_CPU_MEMORY_INFO, (ctypes.c_int, ctypes.c_int, ctypes.POINTER(P)), 0, 0, ctypes.byref(self.memory))
        self.run_fn = ctypes.CFUNCTYPE(P, P, P, P, P, ctypes.c_size_t, P, ctypes.c_size_t, P)(api[RUN])

    def _call(self, index: int, types: tuple, *args) -> None:
        status = ctypes.CFUNCTYPE(P, *types)(self.api[index])(*args)
        if status:
            raise RuntimeError(self.message(status).decode())

    def value(self, a: np.ndarray) -> P:
        out, shape = P(), (ctypes.c_int64 * a.ndim)(*a.shape)
        self._call(CREATE_TENSOR_WITH_DATA, (P, P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t,
                                             ctypes.c_int, ctypes.POINTER(P)),
                   self.memory, a.ctypes.data, a.nbytes, shape, a.ndim, ELEMENT[a.dtype], ctypes.byref(out))
        return out

    def runner(self, inputs: dict, outputs: dict):
        """A call of no arguments running the session on these arrays."""
        def names(named: dict):
            return (ctypes.c_char_p * len(named))(*[n.encode() for n in named])

        def values(named: dict):
            return (P * len(named))(*[self.value(a) for a in named.values()])

        # Run(session, run options, input names, inputs, their count, output names, their count, outputs)
        keep = [self.session, None, names(inputs), values(inputs), len(inputs), names(outputs), len(outputs),
                values(outputs)]
        run, message = self.run_fn, self.message

        def call() -> None:
            status = run(*keep)
            if status:
                raise RuntimeError(message(status).decode())

        return call


def _named_io(desc, state: TargetState, tokens: np.ndarray) -> tuple[dict, dict]:
    """A forward's inputs and outputs by name, as target_io binds them (its other outputs into new arrays), less the
    greedy choice mtplab appends to a graph it runs: the graph here is the file as it is."""
    feeds, outputs, bound = target_io(desc, state, tokens)
    inputs = dict(feeds) | {name: a for name, a, out in bound if not out}
    results = {name: np.zeros(shape, dtype) for name, (shape, dtype) in outputs.items()
               if name not in (TOKENS, ACCEPTED)}
    return inputs, results | {name: a for name, a, out in bound if out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tests/data/builder-tiny", help="a preset name or a builder output folder")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--runs", type=int, default=0, help="forwards per side and round (0: about 0.25 s of them)")
    ap.add_argument("--json", help="also write the times and the ratio here")
    args = ap.parse_args()
    if args.rounds < 2 or args.runs < 0:
        ap.error(f"--rounds {args.rounds} --runs {args.runs}: rounds must be at least 2 (a CI needs two), runs at "
                 "least 0")
    try:
        desc = model_for(RunConfig(model=args.model)).description
    except (ValueError, OSError) as err:  # a name that is no preset and no model folder: said as the CLI says it
        ap.error(str(err))
    desc = desc.own_graph() or desc  # the graph a decode runs: the user's own, not mtplab's copy with select's outputs
    state = TargetState.allocate(desc, Arena("bench"))
    state.length = desc.capacity // 2
    inputs, results = _named_io(desc, state, np.array([5], dtype=np.int64))
    growing = inputs | length_feeds(desc.target, state.length, 1, state.length + 1)  # the span: the length + 1
    path = str(desc.target.path)
    module = make_session(path, threads=1)

    def bound_run(named_inputs: dict, session=module, named_results: dict = results):  # as the CPU backend replays it
        binds = [Binding(n, a, False) for n, a in named_inputs.items()]
        binds += [Binding(n, a, True) for n, a in named_results.items()]
        return direct_runner(session, CpuPlanBackend._binding(session, binds))

    prefilled = make_session(path, threads=1)  # its prompt on a state of its own: `state` stays as it is
    prompt_inputs, prompt_results = _named_io(desc, TargetState.allocate(desc, Arena("prompt")),
                                              np.arange(PREFILL, dtype=np.int64) + 1)
    bound_run(prompt_inputs, prefilled, prompt_results)()
    sides = {MODULE: bound_run(inputs), LIBRARY: CApiSession(path, 1).runner(inputs, results),
             GROWING: bound_run(growing), PREFILLED: bound_run(inputs, prefilled)}
    firsts = []
    for run in sides.values():  # the same outputs from each, each from the same state (the recurrent states zeroed)
        for a in state.recurrent_arrays():
            a[...] = 0
        run()
        firsts.append({name: a.copy() for name, a in results.items()})
    for side, outs in zip(list(sides)[1:], firsts[1:]):
        if differ := [name for name, a in outs.items() if not np.array_equal(a, firsts[0][name], equal_nan=True)]:
            raise SystemExit(f"{side} computed other outputs than {MODULE}: {differ}")
    t0 = time.perf_counter()
    for _ in range(3):
        sides[MODULE]()
    runs = args.runs or max(3, round(0.25 / ((time.perf_counter() - t0) / 3)))
    seen: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(args.rounds + 1):  # round 0 warms both up
        for side in (list(sides) if r % 2 else list(sides)[::-1]):
            run, t0 = sides[side], time.perf_counter()
            for _ in range(runs):
                run()
            if r:
                seen[side].append((time.perf_counter() - t0) / runs * 1e6)
    us = {side: np.asarray(v) for side, v in seen.items()}
    ratios = {"build": summarize(list(us[MODULE] / us[LIBRARY])), "span": summarize(list(us[MODULE] / us[GROWING])),
              "history": summarize(list(us[PREFILLED] / us[MODULE]))}
    print(f"{desc.name} ({path}): one M=1 forward at length {state.length} of {desc.capacity}, onnxruntime "
          f"{ort.__version__}, one thread, median of {args.rounds} interleaved rounds of {runs}")
    for side, v in us.items():
        print(f"  {side:44} {np.median(v):9.1f} us")
    for name, what in (("build", "Python module / libonnxruntime.so"), ("span", "static span / growing span"),
                       ("history", f"first run a {PREFILL}-token prefill / this forward")):
        lo, hi = ratios[name]["ci"]
        print(f"  {what:44} {ratios[name]['median']:.3f}x [{lo:.3f}, {hi:.3f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": desc.name, "us": {side: float(np.median(v)) for side, v in us.items()},
                       "ratios": ratios}, f, indent=1, default=float)


if __name__ == "__main__":
    main()
