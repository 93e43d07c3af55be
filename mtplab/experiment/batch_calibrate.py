"""The cost model at batch B: T(B, M), the draft phase, greedy's step and each commit, measured at [B, *].

What `mtplab.experiment.calibrate` measures at batch 1, measured the same way (interleaved over repeats,
each sample beside a sample of T(B, 1), medians of the ratios) on an Engine made for B rows: the target
forward at [B, M] for M = 1..8 on replayed plans, the draft phase of k = 1..7 drafts at [B, 1] (host work
included), greedy's cost per [B, 1] step (its loop), and each commit strategy's cost when every row commits
n tokens, n = 1..8. The head's acceptance is the batch-1
calibration's (a row drafts as a batch of one does). Cached per model, machine, threads, onnxruntime and B;
`mtplab.measure.theory.predict_batch` turns it into a batch point's predicted speedup.
"""

from __future__ import annotations

import functools
import json
import os
import time

import numpy as np

from mtplab.base.files import write_atomic
from mtplab.base.threads import threads_used
from mtplab.engine.batch_head import commit_head, draft_from_rows
from mtplab.engine.engine import Engine
from mtplab.engine.greedy import decode_rows, start_rows
from mtplab.engine.strategies import COMMITS
from mtplab.experiment.calibrate import (
    GREEDY_TOKENS,
    MAX_M,
    PROMPT_LEN,
    REPEATS,
    _calibration_run,
    cache_key,
    cache_path,
    calibration_sizes,
    load_or_measure,
)
from mtplab.experiment.timing import FORWARD_SAMPLES, PairedSamples, block_time, call_time, time_after, time_targets
from mtplab.measure.result import dumps
from mtplab.model.prompts import run_prompts
from mtplab.runtime.executor import Slot


def measure_batch(model: str, batch: int, threads: int = 0, repeats: int = REPEATS, reps: int = 3,
                  int4: bool = False) -> dict:
    """The batch-B calibration of one model (int4: a preset's int4 form) on `threads` intra-op threads."""
    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    run, art = _calibration_run(model, threads, int4, k=MAX_M - 1, drafter="mtp", tokens=GREEDY_TOKENS + 1,
                                max_recaptures=10**9, rounds=1, batch=batch)
    top, _ = calibration_sizes(art.description)
    engine = Engine(run, art)
    st, B = engine.state, batch
    prompts = run_prompts(run.replace(prompt_len=PROMPT_LEN), engine.desc.vocab_size)
    start_rows(engine, prompts)
    L0 = st.lengths.copy()
    ids = np.tile(prompts[:, :1], (1, top))
    rows = np.zeros((B, top, engine.desc.hidden_size), np.float32)

    def forward_on(e: Engine):
        def forward(M: int) -> dict:
            e.state.lengths[...] = L0
            if M == 1:
                return e.forward(Slot.PRIMARY, ids[:, :1])
            return e.forward(Slot.VERIFY, ids[:, :M], in_place=False)
        return forward

    forward = forward_on(engine)

    def head_work(k: int) -> None:  # a fused step's head work for k drafts: the commit of k+1 rows, k - 1 steps after
        ready = commit_head(engine, ids[:, : k + 1], np.full(B, k), rows[:, : k + 1], L0)
        draft_from_rows(engine, ready, L0 + k, k)

    def greedy_step() -> float:
        g = decode_rows(engine, prompts, run.tokens, margins=False)  # GREEDY_TOKENS + 1, or what the capacity holds
        return g.seconds / g.decodes

    def commit(e: Engine, strategy: str, n: int) -> float:
        e.use_commit(strategy)
        apply = e.commit_rows
        e.state.lengths[...] = L0
        ver = None if e.commit_strategy.verify_in_place else forward_on(e)(top)
        e.save_state()
        counts, rows = np.full(B, n), np.arange(B)
        commit_once = functools.partial(apply, ver, counts, rows, ids, L0)
        times = []
        for _ in range(reps + 1):  # the first is untimed: a changed size recaptures the slot's plan
            e.state.lengths[...] = L0
            times.append(call_time(commit_once, e.device.sync))
        return float(np.mean(times[1:]))

    from mtplab.engine.fit import commits_on

    strategies, skipped = commits_on(engine.desc, B)
    own = {}  # a strategy whose verify runs a graph of its own (per-position): an engine of its own, as at batch 1
    for name in strategies:
        if COMMITS.get(name).own_verify_graph:
            e = own[name] = Engine(run.replace(commit=name), art)
            start_rows(e, prompts)
    own_forward = {name: forward_on(e) for name, e in own.items()}
    for f in own_forward.values():
        f(top)
    sync = engine.device.sync
    forward(1), forward(1)  # Primary's plan captured before the first reference sample
    forward(top)  # the Verify slot's largest forward first (time_targets)
    target_fallbacks = 0
    paired = PairedSamples(lambda: block_time(lambda: forward(1), reps, sync), "target/1")
    add = paired.add
    for _ in range(repeats):
        target_fallbacks += time_targets(engine, forward, add, top, reps)
        for k in range(1, top):
            add(f"draft/{k}", lambda k=k: time_after(  # after the verify a step runs before it, as measure() does
                lambda: forward(k + 1), lambda: head_work(k), reps, sync))
        for _ in range(FORWARD_SAMPLES):
            add("greedy_token", lambda: float(np.mean([greedy_step() for _ in range(reps)])))
        start_rows(engine, prompts)
        for strategy in strategies:
            e = own.get(strategy, engine)
            for n in range(1, top + 1):
                add(f"commit/{strategy}/{n}", lambda e=e, strategy=strategy, n=n: commit(e, strategy, n))
        for strategy, f in own_forward.items():
            for M in range(2, top + 1):
                add(f"verify/{strategy}/{M}", lambda f=f, M=M: block_time(lambda: f(M), reps, sync))
    summary = paired.summary()

    def table(prefix: str) -> dict:
        return {name[len(prefix):]: s["median"] for name, s in summary.items() if name.startswith(prefix)}

    return {
        "key": batch_key(model, threads, batch, repeats, int4),
        "batch": B,
        "repeats": repeats,
        "reps_per_sample": reps,
        "target": table("target/"),
        "draft": table("draft/"),
        "head": summary["draft/1"]["median"],
        "greedy_token": summary["greedy_token"]["median"],
        "target_fallbacks": target_fallbacks,
        "commit": {s: table(f"commit/{s}/") for s in strategies},
        "verify": {s: table(f"verify/{s}/") for s in own},
        "commits_skipped": skipped,
        "ci": {name: s["ci"] for name, s in summary.items()},
        "ratio_to_t1": {name: s["ratio"] for name, s in summary.items()},
        "seconds": time.perf_counter() - t_start,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }


def batch_key(model: str, threads: int, batch: int, repeats: int = REPEATS, int4: bool = False) -> dict:
    """The batch-1 calibration's key with the batch added."""
    return cache_key(model, threads_used(threads), repeats, int4) | {"batch": batch}


def load_or_measure_batch(model: str, batch: int, say=print, threads: int = 0, int4: bool = False) -> dict:
    """The cached batch-B calibration (measured first when missing), with the head's acceptance from the
    batch-1 calibration (measured too when missing); int4: a preset's int4 form."""
    if batch == 1:
        return load_or_measure(model, say=say, threads=threads, int4=int4)
    key = batch_key(model, threads, batch, int4=int4)
    path = cache_path(key)
    calib = None
    if path.exists():
        try:
            calib = json.loads(path.read_text())
        except (OSError, ValueError):
            calib = None
    if calib is None or calib.get("key") != key:
        say(f"no calibration for {key['preset']} at batch {batch} on {key['threads']} threads: measuring it")
        calib = measure_batch(model, batch, threads, int4=int4)
        write_atomic(path, dumps(calib, indent=1))
    return calib | {"mtp_acceptance": load_or_measure(model, say=say, threads=threads, int4=int4)["mtp_acceptance"]}
