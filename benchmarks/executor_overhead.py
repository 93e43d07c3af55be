"""Host cost on the tiny preset: per run (eager vs plan replay), and per token in the engine's loops.

The tiny model's forward is about a hundred microseconds, so Python overhead decides throughput.

Per run, per slot (Primary M=1, Verify M=k+1), interleaved, medians over many runs: eager
session.run, an eager one-shot IOBinding, Executor.run replaying its plan (staging + signature
check + run_with_iobinding), and run_with_iobinding on the captured plan alone ("raw replay").

Per token, on one Engine (tiny, k, default policy and commit), interleaved rounds, medians:
- bare replay loop: the engine's captured Primary plan run n times in a plain loop, by the very call
  the backend replays it with (no staging, no argmax, no bookkeeping), its length buffers advanced in place through
  greedy's lengths (a forward's attention grows with them): the floor a greedy loop could reach.
- engine greedy: Engine.greedy(prompt, n, margins=False), its timed seconds / its timed decodes
  (the timed baseline's setting). Goal: engine greedy / bare loop <= 1.2x.
- speculative host share: a speculative run with the oracle drafter (alpha, head running, as the
  default oracle config). The plan backend's runs (eager, capture, replay) are wrapped to sum the
  time spent inside them (the forwards); each step's wall runs from one commit callback to the next. Over the steps
  after the first three (warm-up and captures), host share = (sum of step walls - sum of forward
  times inside them) / sum of step walls: the part of a step the host spends outside the forwards.
  The clock's wrappers are host work of the benchmark's, not the engine's (about a microsecond a forward inside a
  step), so the share as clocked is an upper bound. The same speculative run without them, interleaved (the same
  steps: one seed), gives the step wall an engine runs; host share less the clock = 1 - (the clocked run's time
  inside the forwards) / (the unclocked run's step wall), round by round: a lower bound, since the part of each
  wrapper between its two clock reads (a call and a clock read, a few tenths of a microsecond) stays counted as
  forward time. Goal: <= 20%, the engine's share lying between the two. Where it goes: each phase's host time per step (the schedule's phase clock less the
  forwards of the session that phase runs: Primary decode, the MTP head's drafts, the Verify; the clock's cost
  included).
Greedy's host path by layer, on the same Engine, interleaved rounds of n tokens, each layer adding to the one
before, every one relative to the first (the captured plan replayed n times, nothing else): + the loop's own
work (the token and length feeds rewritten in place, the state's carry, the graph's token read; nothing stages the feeds
yet, so the plan still runs one token at one length), + the replay check (ReplayCheck.stage: the feeds staged
into the plan's buffers, every binding checked; from here the plan runs the real tokens and lengths), the
executor's replayer (the check, the replay and the slot's counters), Engine.greedy (the timed loop): where greedy's
host time goes. Beside them, Engine.forward's path (target_io, Executor.run, the engine's
bookkeeping), which a speculative step's decode, verify and readvance forwards take.
On a machine shared with other work, --threads 1 keeps each forward on the calling thread
(no intra-op pool waiting for a busy core), which steadies both ratios.

    python benchmarks/executor_overhead.py --threads 1 [--k 3] [--runs 400] [--rounds 11] [--tokens 128]
                                           [--schedule decode-verify|fused]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from mtplab.base.threads import thread_pool, use_global_pool
from mtplab.engine.engine import Engine
from mtplab.engine.schedules import PHASES
from mtplab.engine.strategies import SCHEDULES
from mtplab.experiment.config import RunConfig
from mtplab.measure.stats import summarize
from mtplab.model import build_model, preset
from mtplab.model.description import length_feeds
from mtplab.model.greedy_outputs import TOKENS
from mtplab.model.prompts import prompt_tokens
from mtplab.runtime.arena import Arena
from mtplab.runtime.executor import Executor, Slot, SlotMemory
from mtplab.runtime.sessions import graph_session
from mtplab.runtime.state import TargetState, target_io

HOW = ("session.run", "eager IOBinding", "executor replay", "raw replay")
GREEDY_GOAL, HOST_SHARE_GOAL = 1.2, 0.20


def per_run(art, k: int, runs: int, threads: int) -> dict[tuple[str, str], float]:
    """Median microseconds per run, per (slot, how)."""
    cfg = art.config
    session = graph_session(art.description.target, threads=threads)
    state = TargetState.allocate(art.description, Arena("main"))
    arena = Arena("shared")
    ex = Executor(
        {Slot.PRIMARY: session, Slot.VERIFY: session}, {Slot.PRIMARY: SlotMemory(arena), Slot.VERIFY: SlotMemory(arena)}
    )
    big = target_io(state.desc, state, np.zeros(k + 1, dtype=np.int64))
    for n, v in big[0].items():
        arena.reserve(f"feed.{n}", v.shape, v.dtype)
    for n, (s, d) in big[1].items():
        arena.reserve(n, s, d)
    names = [o.name for o in session.get_outputs()]
    times: dict[tuple[str, str], list[float]] = {}
    for rep in range(runs + 3):
        for slot, M in ((Slot.PRIMARY, 1), (Slot.VERIFY, k + 1)):
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
    print(ex.format_counters())
    return {key: float(np.median(v)) * 1e6 for key, v in times.items()}


class ForwardClock:
    """Wraps a plan backend's runs (eager, capture, replay): every call's duration goes into `spans` as (start,
    seconds). The backend is where every forward of the engine's executors runs. attach(False) puts the backend's
    own methods back for an unclocked run (what the wrappers themselves cost a step is its wall less that run's)."""

    def __init__(self, backend):
        self.spans: list[tuple[float, float, object]] = []  # (start, seconds, session)
        self.on = False
        self.backend = backend
        self.real = {name: getattr(backend, name) for name in ("eager", "capture", "replay")}
        self.wrapped = {name: self._wrap(name, run) for name, run in self.real.items()}
        self.attach(True)

    def attach(self, on: bool) -> None:
        for name, run in (self.wrapped if on else self.real).items():
            setattr(self.backend, name, run)

    def _wrap(self, name: str, real):
        spans, clock = self.spans, time.perf_counter
        if name == "replay":  # a step's forwards: replay(session, plan), with the least work around the clock

            def replay(session, plan):
                t0 = clock()
                real(session, plan)
                t1 = clock()
                if self.on:
                    spans.append((t0, t1 - t0, session))

            return replay

        def run(session, *args, **kw):
            t0 = clock()
            out = real(session, *args, **kw)
            if self.on:
                spans.append((t0, clock() - t0, session))
            return out

        return run


def bare_loop(eng: Engine, prompt: list[int], n: int) -> float:
    """Seconds for greedy's n - 1 decodes as the Primary plan replayed at greedy's lengths and nothing else: the
    plan's own length buffers advanced in place, one position a run, by the very call the backend replays it with
    (no staging, no argmax, no bookkeeping). A forward's attention grows with the length, so the floor runs the
    lengths greedy runs."""
    eng.start(prompt)
    slot, io = eng.target.state[Slot.PRIMARY], eng.primary_desc.target
    feeds, outputs, bound = target_io(eng.primary_desc, eng.state, np.zeros(1, dtype=np.int64))
    length_feeds(io, eng.state.length, 1, eng.desc.capacity, feeds)
    assert slot.check.stage(eng.target.memory[Slot.PRIMARY], feeds, outputs, bound), "the plan's own feeds refused"
    staged = dict(zip(slot.check.feed_names, (view for view, _ in slot.check.staging)))
    lengths = {name: staged[name] for name in ("seqlens_k", "position_ids", "attention_mask") if name in staged}
    replay, start = slot.plan.run, eng.state.length
    t0 = time.perf_counter()
    for i in range(n - 1):
        length_feeds(io, start + i, 1, eng.desc.capacity, lengths)
        replay()
    return time.perf_counter() - t0


def per_token(art, k: int, alpha: float, rounds: int, n: int, threads: int, schedule: str) -> dict[str, float]:
    run = RunConfig(model="tiny", k=k, drafter="oracle", alpha=alpha, threads=threads, schedule=schedule)
    eng = Engine(run, art)
    prompt = prompt_tokens(art.config.vocab_size, run.prompt_len, 0)
    reference = eng.greedy(prompt, n + k + 1, margins=False).tokens  # also captures the Primary plan
    assert eng.target.backend is eng.mtp.backend  # one backend runs every forward: the clock wraps it
    clock = ForwardClock(eng.target.backend)
    # whose forwards each phase runs (the default policy's sibling Verify session; select commits without a forward)
    assert eng.commit_strategy.name == "select", "the phase split counts Primary forwards as the decode's"
    phase_of = {id(eng.target.sessions[Slot.PRIMARY]): "decode", id(eng.mtp.sessions[Slot.PRIMARY]): "draft",
                id(eng.target.sessions[Slot.VERIFY]): "verify"}
    assert len(phase_of) == 3, "the phase split needs the Verify slot on a session of its own"
    sides = ("bare", "greedy", "spec", "spec unclocked")
    seen: dict[str, list] = {side: [] for side in sides}

    def speculative() -> tuple[float, float, dict[str, float]]:
        """(host share, step wall in us, host us per step by phase) of one speculative run."""
        commits: list[float] = []
        clock.spans.clear()
        clock.on = True
        spec = eng.speculative(prompt, n, reference,
                               on_commit=lambda step, length, emitted, drafted, c=commits: c.append(time.perf_counter()))
        clock.on = False
        assert spec["tokens"][:n] == reference[:n], "speculative output differs from greedy"
        t_from, t_to = commits[2], commits[-1]
        wall = t_to - t_from
        inside = sum(d for t, d, _ in clock.spans if t_from <= t and t + d <= t_to)
        forwards = dict.fromkeys(PHASES, 0.0)
        for t, d, session in clock.spans:
            if t >= spec["started"]:  # the steps' forwards (not the prefills before them)
                forwards[phase_of.get(id(session), "commit")] += d
        # every step of the run, its first three included
        host = {phase: (spec["split"][phase] - forwards[phase]) / len(commits) * 1e6 for phase in PHASES}
        return (wall - inside) / wall, wall / (len(commits) - 3) * 1e6, host

    def unclocked() -> float:
        """A speculative run's step wall in us (the same steps as speculative()'s) with the backend's own methods."""
        commits: list[float] = []
        clock.attach(False)
        try:
            eng.speculative(prompt, n, reference,
                            on_commit=lambda step, length, emitted, drafted, c=commits: c.append(time.perf_counter()))
        finally:
            clock.attach(True)
        return (commits[-1] - commits[2]) / (len(commits) - 3) * 1e6

    for r in range(rounds + 1):
        for side in (sides if r % 2 else sides[::-1]):
            if side == "spec unclocked":
                value = unclocked()
            elif side == "bare":
                value = bare_loop(eng, prompt, n) / (n - 1) * 1e6
            elif side.startswith("greedy"):
                g = eng.greedy(prompt, n, margins=False)
                value = g.seconds / g.decodes * 1e6
            else:
                value = speculative()
            if r:
                seen[side].append(value)
    bare = np.asarray(seen["bare"])

    def greedy(side: str) -> dict:
        ratio = np.asarray(seen[side]) / bare
        return {"us": float(np.median(seen[side])), "ratio": float(np.median(ratio)), "ratio_ci": summarize(list(ratio))["ci"]}

    def spec(side: str) -> dict:
        share = [s for s, _, _ in seen[side]]
        return {"share": float(np.median(share)), "share_ci": summarize(share)["ci"],
                "step_us": float(np.median([w for _, w, _ in seen[side]])),
                "host_us": {phase: float(np.median([h[phase] for _, _, h in seen[side]])) for phase in PHASES}}

    # the clock's own cost: a clocked step's wall less an unclocked one's, round by round; the host share without
    # it, each round's time inside the forwards (clocked) over its unclocked step wall
    walls = np.asarray([w for _, w, _ in seen["spec"]])
    inside = walls * (1 - np.asarray([share for share, _, _ in seen["spec"]]))
    plain = np.asarray(seen["spec unclocked"])
    clockless = list(1 - inside / plain)
    unclocked_share = {"clock_us": float(np.median(walls - plain)), "clock_us_ci": summarize(list(walls - plain))["ci"],
                       "share_unclocked": float(np.median(clockless)), "share_unclocked_ci": summarize(clockless)["ci"]}
    engine = greedy("greedy")
    return {"bare": float(np.median(bare)), "greedy": engine["us"], "ratio": engine["ratio"],
            "ratio_ci": engine["ratio_ci"], **spec("spec"), **unclocked_share}


LAYERS = ("plan replay", "+ feeds, carry, token", "+ replay check", "Executor.replayer", "Engine.greedy",
          "Engine.forward's path")


def greedy_layers(art, rounds: int, n: int, threads: int) -> dict[str, dict]:
    """Microseconds per token of greedy's loop built up layer by layer (LAYERS), and each layer's ratio to the first."""
    run = RunConfig(model="tiny", k=3, threads=threads)
    eng = Engine(run, art)
    prompt = prompt_tokens(art.config.vocab_size, run.prompt_len, 0)
    eng.greedy(prompt, n, margins=False)  # captures the Primary plan
    ex, state, desc = eng.target, eng.state, eng.primary_desc
    slot, memory, io = ex.state[Slot.PRIMARY], ex.memory[Slot.PRIMARY], desc.target

    def loop(layer: str) -> float:
        if layer == "Engine.greedy":
            g = eng.greedy(prompt, n, margins=False)
            return g.seconds / g.decodes
        eng.start(prompt)
        feeds, outputs, bound = target_io(desc, state, np.zeros(1, dtype=np.int64))  # the feeds greedy rewrites
        ids, plan, check, carries = feeds[io.input_ids], slot.plan, slot.check, state.carries()
        replayer = ex.replayer(Slot.PRIMARY, feeds, outputs, bound)
        t0 = time.perf_counter()
        for _ in range(n - 1):
            if layer == "plan replay":
                plan.run()
            elif layer == "Engine.forward's path":
                out = eng.forward(Slot.PRIMARY, ids)
                ids[0, 0] = out[TOKENS][0, 0]
            else:
                length_feeds(io, state.length, 1, desc.capacity, feeds)
                if layer == "Executor.replayer":
                    out = replayer()
                else:
                    if layer == "+ replay check":
                        assert check.stage(memory, feeds, outputs, bound), "the replay check refused its own plan"
                    plan.run()
                    out = check.result
                for committed, present in carries:
                    committed[...] = present
                ids[0, 0] = out[TOKENS][0, 0]
            state.length += 1
        return (time.perf_counter() - t0) / (n - 1)

    times: dict[str, list[float]] = {layer: [] for layer in LAYERS}
    for r in range(rounds + 1):
        for layer in (LAYERS if r % 2 else LAYERS[::-1]):
            seconds = loop(layer)
            if r:
                times[layer].append(seconds * 1e6)
    base = np.asarray(times[LAYERS[0]])
    return {layer: {"us": float(np.median(v)), "ratio": float(np.median(np.asarray(v) / base)),
                    "ratio_ci": summarize(list(np.asarray(v) / base))["ci"]} for layer, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.8)
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: onnxruntime's default)")
    ap.add_argument("--schedule", choices=SCHEDULES.names(), default="decode-verify")
    ap.add_argument("--pool", choices=("global", "per-session"), default="global",
                    help="one onnxruntime thread pool for every session (as mtplab's runs), or one each")
    ap.add_argument("--json", help="also write the per-token measures here")
    args = ap.parse_args()
    if args.pool == "global":
        use_global_pool(args.threads)
    art = build_model(preset("tiny"))
    m = per_run(art, args.k, args.runs, args.threads)
    print(f"tiny preset, k={args.k}, {args.runs} interleaved runs each, median microseconds per run")
    print("executor replay = staging + signature check of every binding + run_with_iobinding")
    print("(the feeds, outputs and bindings are built once, outside the timing);")
    print("raw replay = run_with_iobinding on the captured plan alone (what a device graph replay replaces)")
    print(f"{'slot':8} " + " ".join(f"{h:>16}" for h in HOW) + f" {'executor/raw':>12}")
    for slot in ("primary", "verify"):
        cells = " ".join(f"{m[(slot, h)]:16.1f}" for h in HOW)
        print(f"{slot:8} {cells} {m[(slot, 'executor replay')] / m[(slot, 'raw replay')]:11.2f}x")
    t = per_token(art, args.k, args.alpha, args.rounds, args.tokens, args.threads, args.schedule)
    print()
    print(
        f"engine on tiny, k={args.k}, oracle alpha={args.alpha}, {args.schedule}, {args.tokens} tokens, "
        f"median of {args.rounds} rounds, threads={args.threads or 'default'}"
    )
    rows = [
        ("bare replay loop (us/token)", f"{t['bare']:.1f}", ""),
        ("Executor.run replay, primary (us)", f"{m[('primary', 'executor replay')]:.1f}", ""),
        ("raw replay, primary (us)", f"{m[('primary', 'raw replay')]:.1f}", ""),
        ("engine greedy (us/token)", f"{t['greedy']:.1f}", ""),
        ("engine greedy / bare loop", f"{t['ratio']:.2f}x [{t['ratio_ci'][0]:.2f}, {t['ratio_ci'][1]:.2f}]",
         f"<= {GREEDY_GOAL}x"),
        ("speculative step wall (us)", f"{t['step_us']:.1f}", ""),
        ("speculative host share, as clocked (upper)", f"{t['share']:.1%} [{t['share_ci'][0]:.1%}, {t['share_ci'][1]:.1%}]",
         ""),
        ("  the forward clock's own cost (us/step)",
         f"{t['clock_us']:.1f} [{t['clock_us_ci'][0]:.1f}, {t['clock_us_ci'][1]:.1f}]", ""),
        ("  host share less the clock's cost (lower)", f"{t['share_unclocked']:.1%} [{t['share_unclocked_ci'][0]:.1%}, "
                                                 f"{t['share_unclocked_ci'][1]:.1%}]", f"<= {HOST_SHARE_GOAL:.0%}"),
    ]
    rows += [(f"  host per step in {phase} (us)", f"{t['host_us'][phase]:.1f}", "") for phase in PHASES]
    print(f"{'measure':42} {'value':>22} {'goal':>8}")
    for name, value, goal in rows:
        print(f"{name:42} {value:>22} {goal:>8}")
    layers = greedy_layers(art, args.rounds, args.tokens, args.threads)
    print()
    print(f"greedy's host path by layer on tiny, {args.tokens} tokens, median of {args.rounds} interleaved rounds "
          "(each layer adds to the one above; the last, a speculative step's forward path, stands apart)")
    print(f"{'layer':26} {'us/token':>9} {'/ plan replay':>22}")
    for layer, m in layers.items():
        print(f"{layer:26} {m['us']:9.1f} {m['ratio']:9.3f}x [{m['ratio_ci'][0]:.3f}, {m['ratio_ci'][1]:.3f}]")
    print(f"thread pool: {thread_pool()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "pool": thread_pool(), "per_token": t, "greedy_layers": layers}, f,
                      indent=1, default=float)


if __name__ == "__main__":
    main()
