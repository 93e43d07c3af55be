"""The cost model's inputs, measured apart from any point: forward, head and commit times, head acceptance.

`calibrate(preset)` measures, interleaved over `repeats` (each repeat visits every item once, so
drift spreads over all of them): the target forward T(M) for M = 1..8 on replayed plans (M=1 on
Primary as greedy decodes, M >= 2 on Verify as the select commit's verify runs) and the same
forwards eager (what a fallback costs), one MTP head step and the whole draft phase of k = 1..7
drafts (host work included; each timed right after the verify forward a step runs between two
draft phases, whose weights evict the head's: back to back, the head ran at half its cost in a
step), greedy's own cost per token (its loop, not just the forward), and each commit strategy's
cost for n committed tokens = 1..8. T(M) and greedy's token, which every
prediction divides, get FORWARD_SAMPLES samples per repeat.

A forward's sample is the mean of a few calls in a row after an untimed one (a run pays its
occasional slow forward too). Every sample is timed beside a sample of T(1), which goes first for
every other sample of the same cost (PairedSamples): a cost is its median ratio to the T(1) beside
it times T(1)'s median over all of them, so a machine that speeds up or slows down between items
moves no ratio a prediction divides (greedy's token against T(k+1)).
At batch B every forward runs at [B, M] on an engine made for B rows (one prompt per row), greedy's token is a
[B, 1] decode and every commit commits n tokens in each row: T(B, M), the same measurement at any batch size.
It also measures the MTP head's acceptance on prompts no point uses (at batch 1: a row drafts as a batch of one
does), and records the load average before and after. Results are cached per model, machine, threads, onnxruntime
version and batch; `mtplab.measure.theory.predict` (`predict_batch` at B > 1) turns them into a point's predicted
speedup.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mtplab.base.files import write_atomic
from mtplab.base.memory import calibration_pages
from mtplab.base.paths import cache_root
from mtplab.base.threads import threads_used
from mtplab.engine.batch_head import commit_head, draft_from_rows, draft_head, prefill_head
from mtplab.engine.greedy import decode_rows, start_rows
from mtplab.engine.strategies import COMMITS
from mtplab.experiment.config import RunConfig, model_name
from mtplab.experiment.timing import FORWARD_SAMPLES, PairedSamples, block_time, call_time, time_after, time_targets
from mtplab.measure import theory
from mtplab.measure.env import _cpu_name
from mtplab.measure.result import dumps
from mtplab.model.config import MAX_TRANSITION_CAPACITY, PRESETS
from mtplab.runtime.executor import Slot

MAX_M = MAX_TRANSITION_CAPACITY  # verify sizes 1..8 cover k = 0..7
ACCEPTANCE_SEEDS = (1000, 1001, 1002)  # prompts for the head's acceptance; sweep seeds stay below them
ACCEPTANCE_K = 4
PROMPT_LEN = 8
GREEDY_TOKENS = 16  # decodes per greedy sample of the calibration


def model_hash(model: str, int4: bool = False) -> str:
    """A preset's config hash (its int4 form's with int4), or a folder's content hash (its graphs and config)."""
    if model in PRESETS:
        from mtplab.model import preset_config

        return preset_config(model, int4).config_hash()
    from mtplab.model.folders import open_model

    return open_model(model).identity()["hash"]


REPEATS = 3  # what runs and sweeps use; another count is cached apart and never replaces it
# Bumped whenever what a calibration measures changes, so a cached one from before is measured again (14: one
# measurement for every batch size; the CHANGELOG says what each bump changed).
MEASURES = 14


def check_batch(batch) -> None:
    """ValueError unless batch is a whole number of rows, 1 or more."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch={batch!r}: a calibration is measured at a whole number of rows, 1 or more")


def cache_key(model: str, threads: int, repeats: int = REPEATS, int4: bool = False, batch: int = 1) -> dict:
    """What a calibration is valid for: model (a preset name, with int4 weights or not, or a folder), machine,
    threads, onnxruntime, the commit strategies registered (a new one is measured, not missing from a cached
    table), how many repeats measured it, what the engine runs where (MEASURES), and whether GLIBC_TUNABLES puts
    malloc's memory on huge pages (mtplab.base.memory: a sweep's points run as its calibration did), and the batch."""
    import onnxruntime

    check_batch(batch)
    return {
        "preset": model_name(model, int4),
        "model": model_hash(model, int4),
        "machine": f"{platform.node()} / {_cpu_name()}",
        "threads": threads,
        "onnxruntime": onnxruntime.__version__,
        "commits": sorted(COMMITS.names()),
        "measures": MEASURES,
        **({"malloc_hugetlb": pages} if (pages := calibration_pages()) else {}),
        **({} if repeats == REPEATS else {"repeats": repeats}),
        **({"int4": True} if int4 else {}),
        **({"batch": batch} if batch > 1 else {}),
    }


def cache_path(key: dict) -> Path:
    import hashlib

    root = cache_root()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / "calibration" / f"{key['preset']}-{digest}.json"


def calibration_sizes(desc) -> tuple[int, int]:
    """(the largest verify size M, greedy decodes per sample) a calibration of this model measures: MAX_M and
    GREEDY_TOKENS, or fewer where the model's transition capacity or KV capacity holds fewer (a verify of M needs
    2M tokens of headroom after the prompt). A prediction at a k the calibration lacks is not made."""
    room = desc.capacity - PROMPT_LEN
    if desc.transition_capacity and desc.transition_capacity < 2:  # 0: the model keeps no transitions (no limit)
        raise ValueError(f"{desc.name}: a transition capacity of {desc.transition_capacity} holds no verify of k >= 1")
    top = min(MAX_M, desc.transition_capacity or MAX_M, (room - 2) // 2)
    if top < 2:
        raise ValueError(f"{desc.name}: a KV capacity of {desc.capacity} leaves no room to calibrate (a {PROMPT_LEN}-token "
                         f"prompt, then a verify of 2 tokens needs {PROMPT_LEN + 6})")
    return top, min(GREEDY_TOKENS, room - 1)


def _calibration_run(model: str, threads: int, int4: bool = False, **fields) -> tuple[RunConfig, object]:
    """A RunConfig for measuring `model` (int4: a preset's int4 form) with a commit it supports (the calibration
    measures every supported commit itself; which one the engine starts with does not matter), and the opened
    model."""
    from mtplab.engine.fit import commits_on
    from mtplab.engine.models import model_for

    art = model_for(RunConfig(model=model, threads=threads, int4=int4))
    supported, refused = commits_on(art.description)
    if not supported:
        raise ValueError(f"{model_name(model)}: every commit strategy is refused: "
                         + "; ".join(f"{n}: {why}" for n, why in refused.items()))
    top, greedy = calibration_sizes(art.description)  # a k or a length the model holds
    if "k" in fields:
        fields["k"] = min(fields["k"], top - 1)
    if "tokens" in fields:
        fields["tokens"] = min(fields["tokens"], greedy + 1)
    # the engine's commit: one whose verify runs the model's own form (a strategy with a graph of its own gets an
    # engine of its own in measure())
    commit = next((n for n in supported if not COMMITS.get(n).own_verify_graph), supported[0])
    return RunConfig(model=model, threads=threads, int4=int4, commit=commit, **fields), art


def _acceptance(model: str, tokens: int, threads: int, int4: bool = False) -> dict:
    """The MTP head's per-position acceptance on prompts of their own, and the alpha fitted to it."""
    from mtplab.engine.engine import Engine

    run, art = _calibration_run(model, threads, int4, k=ACCEPTANCE_K, drafter="mtp", rounds=1)
    # A model with a short context gets fewer tokens per prompt: prompt + tokens + verify headroom must fit.
    tokens = max(2, min(tokens, art.description.capacity - PROMPT_LEN - 2 * (run.k + 1)))
    run = run.replace(tokens=tokens)
    engine = Engine(run, art)
    counts: list[int] = []
    for seed in ACCEPTANCE_SEEDS:
        from mtplab.model.prompts import prompt_tokens

        counts += engine.speculative(prompt_tokens(engine.desc.vocab_size, PROMPT_LEN, seed), tokens)["accepted"]
    acc = np.asarray(counts, dtype=float)
    per_pos = theory.measured_per_position(acc, run.k)  # ACCEPTANCE_K, or fewer where the model holds fewer
    return {"alpha": theory.fit_alpha(per_pos), "per_position": per_pos, "steps": len(counts), "seeds": list(ACCEPTANCE_SEEDS)}


def measure(model: str, repeats: int = REPEATS, reps: int = 3, acceptance_tokens: int = 48, threads: int = 0,
            int4: bool = False, batch: int = 1) -> dict:
    """Measure the calibration of one model (a preset name, int4: its int4 form, or a folder) on `threads`
    intra-op threads (RunConfig.threads: 0 is every core), at `batch` rows: every forward at [B, M], every commit
    committing n tokens in each row. The head's acceptance is measured at batch 1 (a row drafts as a batch of one
    does): load_or_measure adds it to a batch's."""
    from mtplab.engine.fit import commits_on

    check_batch(batch)
    run, art = _calibration_run(model, threads, int4, k=MAX_M - 1, drafter="mtp", tokens=2, max_recaptures=10**9,
                                rounds=1, batch=batch)
    # from here, once the model is built: a first use's build is no part of the measurement or its load
    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    main = _on_prompt(run, art)
    engine, prompts, forward, greedy_token, top, ids, L0 = main
    B = batch
    hidden0 = np.zeros((B, PROMPT_LEN, engine.desc.hidden_size), np.float32)
    head_prompt = np.concatenate([prompts[:, 1:], prompts[:, :1]], axis=1)
    prefill_head(engine, head_prompt, hidden0)
    first = prompts[:, 0].copy()

    def head() -> None:
        draft_head(engine, first, engine.last_hidden, L0, 1)

    rows = np.repeat(np.asarray(engine.last_hidden)[:, None], top, 1)

    def draft(k: int) -> None:  # a fused step's head work for k drafts: the commit of k+1 rows, k - 1 steps from its last
        ready = commit_head(engine, ids[:, : k + 1], np.full(B, k), rows[:, : k + 1], L0)
        draft_from_rows(engine, ready, L0 + k, k)

    def copy_forward() -> dict:  # M=1 on mtplab's copy (Verify's graph): what a shared policy's Primary runs
        engine.state.lengths[...] = L0
        return engine.forward(Slot.VERIFY, ids[:, :1])

    def commit(on: _OnPrompt, strategy: str, n: int, reps: int) -> float:
        """Mean seconds of one commit of n tokens in every row (the verify it commits from is untimed, run once)."""
        e = on.engine
        e.use_commit(strategy)
        e.state.lengths[...] = L0
        # A strategy that reads the verify's outputs gets them; one whose verify runs in place restores a snapshot.
        ver = None if e.commit_strategy.verify_in_place else on.forward(top)
        e.save_state()
        times = []
        counts, every = np.full(B, n), np.arange(B)

        def once() -> None:  # as a step commits: the lengths back at the verify's start, n tokens kept
            e.state.lengths[...] = L0
            e.target.rollback(Slot.PRIMARY)
            e.commit_rows(ver, counts, every, ids, L0)

        for _ in range(reps + 1):  # the first is untimed: a changed size recaptures the slot's plan
            times.append(call_time(once, e.device.sync))
        return float(np.mean(times[1:]))

    strategies, skipped = commits_on(engine.desc, B)
    # a strategy whose verify runs a graph of its own (per-position) is timed on an engine of its own: its verify at
    # each M and its commits
    own = {name: _on_prompt(run.replace(commit=name), art) for name in strategies if COMMITS.get(name).own_verify_graph}
    sync = engine.device.sync
    target_fallbacks = 0
    paired = PairedSamples(lambda: block_time(lambda: forward(1), reps, sync), "target/1")
    add = paired.add
    for _ in range(repeats):
        target_fallbacks += time_targets(engine, forward, add, top, reps)
        if engine.primary_desc.target.path != engine.desc.target.path:  # Primary runs the user's graph, Verify the copy
            copy_forward()  # the Verify plan's size changes: untimed
            for _ in range(FORWARD_SAMPLES):
                add("copy/1", lambda: block_time(copy_forward, reps, sync))
        for M in range(1, top + 1):
            add(f"eager/{M}", lambda M=M: block_time(lambda: forward(M, eager=True), reps, sync))  # a fallback's
        head()
        add("head", lambda: block_time(head, reps, sync))
        for k in range(1, top):
            add(f"draft/{k}", lambda k=k: time_after(lambda: forward(k + 1), lambda: draft(k), reps, sync))
        for _ in range(FORWARD_SAMPLES):
            add("greedy_token", lambda: float(np.mean([greedy_token() for _ in range(reps)])))
        start_rows(engine, prompts)  # back to the state the other items are measured from
        prefill_head(engine, head_prompt, hidden0)
        for strategy in strategies:
            on = own.get(strategy, main)
            for n in range(1, top + 1):
                add(f"commit/{strategy}/{n}", lambda on=on, strategy=strategy, n=n: commit(on, strategy, n, reps))
        for strategy, on in own.items():
            for M in range(2, top + 1):
                add(f"verify/{strategy}/{M}", lambda on=on, M=M: block_time(lambda: on.forward(M), reps, sync))
            for _ in range(FORWARD_SAMPLES):  # its copy at M=1: what a shared policy's Primary decodes on
                add(f"copy_decode/{strategy}", lambda on=on: block_time(lambda: on.engine.forward(
                    Slot.VERIFY, ids[:, :1], in_place=False), reps, sync))
    summary = paired.summary()

    def table(prefix: str) -> dict:
        return {name[len(prefix) :]: s["median"] for name, s in summary.items() if name.startswith(prefix)}

    return {
        "key": cache_key(model, threads_used(threads), repeats, int4, batch),
        "batch": B,
        "repeats": repeats,
        "reps_per_sample": reps,
        "target": table("target/"),
        "eager": table("eager/"),
        **({"copy_target": table("copy/")} if "copy/1" in summary else {}),
        "head": summary["head"]["median"],
        "draft": table("draft/"),
        "greedy_token": summary["greedy_token"]["median"],
        "target_fallbacks": target_fallbacks,
        "commit": {s: table(f"commit/{s}/") for s in strategies},
        "verify": {s: table(f"verify/{s}/") for s in own},  # the verify of a strategy with a graph of its own
        "copy_decode": {s: summary[f"copy_decode/{s}"]["median"] for s in own},  # and its graph's M=1
        "commits_skipped": skipped,
        "ci": {name: s["ci"] for name, s in summary.items()},
        "ratio_to_t1": {name: s["ratio"] for name, s in summary.items()},
        **({"mtp_acceptance": _acceptance(model, acceptance_tokens, threads, int4)} if B == 1 else {}),
        "seconds": time.perf_counter() - t_start,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }


class _OnPrompt(NamedTuple):
    """What measure() and recheck_now() time: the calibration's engine, started on its prompts (one per row); the
    prompts [B, P]; forward(M, eager=False), the target's forward of M copies of each row's first prompt token at the prompts' end
    (M=1 on Primary as greedy decodes, M >= 2 on Verify as select's verify); greedy_token(), greedy's own loop in
    seconds per [B, 1] decode (a replayed M=1 forward plus its per-token host work), the engine back on the prompts
    after it; the largest M; the ids forward(M) feeds ([B, top]: each row's first prompt token) and the lengths it
    runs at (the prompts')."""

    engine: Any
    prompts: np.ndarray
    forward: Callable[..., dict]
    greedy_token: Callable[[], float]
    top: int
    ids: np.ndarray
    start: np.ndarray


def _on_prompt(run: RunConfig, art) -> _OnPrompt:
    """The calibration's engine on its prompts, both slots' plans captured (Primary first, then the Verify slot at
    its largest M: a pinned workspace keeps the size of its first forward, see time_targets)."""
    from mtplab.engine.engine import Engine
    from mtplab.model.prompts import run_prompts

    top, greedy_n = calibration_sizes(art.description)
    engine = Engine(run, art)
    prompts = run_prompts(run.replace(prompt_len=PROMPT_LEN, seed=0), engine.desc.vocab_size)
    start_rows(engine, prompts)
    L0, ids = engine.state.lengths.copy(), np.tile(prompts[:, :1], (1, top))

    def forward(M: int, eager: bool = False) -> dict:  # eager: outside the slot's plan, as a fallback runs
        engine.state.lengths[...] = L0
        if M == 1:
            return engine.forward(Slot.PRIMARY, ids[:, :1], eager=eager)
        return engine.forward(Slot.VERIFY, ids[:, :M], in_place=False, eager=eager)

    def greedy_token() -> float:
        g = decode_rows(engine, prompts, greedy_n + 1, margins=False)
        start_rows(engine, prompts)  # back to the state the forwards are timed from
        return g.seconds / g.decodes

    forward(1), forward(1)
    forward(top)
    return _OnPrompt(engine, prompts, forward, greedy_token, top, ids, L0)


def recheck_now(model: str, threads: int, repeats: int = REPEATS, int4: bool = False) -> dict:
    """What every prediction divides, measured again now as measure() measures it (the sweep's re-check at its end,
    against the calibration from its start): greedy's seconds per token ("greedy_token") and each T(M) as its ratio
    to the T(1) timed beside it ("ratio_to_t1", M = 2..top), over `repeats` interleaved repeats."""
    run, art = _calibration_run(model, threads, int4, k=MAX_M - 1, drafter="mtp", tokens=2, max_recaptures=10**9,
                                rounds=1)
    engine, _, forward, greedy_token, top, *_ = _on_prompt(run, art)
    sync = engine.device.sync
    paired = PairedSamples(lambda: block_time(lambda: forward(1), 3, sync), "target/1")
    for _ in range(repeats):
        time_targets(engine, forward, paired.add, top, 3)
        for _ in range(FORWARD_SAMPLES):
            paired.add("greedy_token", lambda: float(np.mean([greedy_token() for _ in range(3)])))
    summary = paired.summary()
    return {"greedy_token": summary["greedy_token"]["median"],
            "ratio_to_t1": {name: s["ratio"] for name, s in summary.items() if name.startswith("target/")}}


def sweep_calibration(calibration_file: str, run: RunConfig) -> dict | None:
    """The calibration a sweep measured for this run's model, threads and batch (calibration.json, and
    calibration_batch.json beside it for a batch > 1), or None."""

    path = Path(calibration_file) if calibration_file else None
    if path is None or not path.exists():
        return None
    name = model_name(run.model, run.int4)
    calib = json.loads(path.read_text()).get(name)
    if calib is None or calib.get("key", {}).get("threads") != threads_used(run.threads):
        return None
    if run.batch > 1:  # the cost model at the run's batch, beside it (calibration_batch.json); the head's acceptance
        batched = path.with_name("calibration_batch.json")
        at_b = json.loads(batched.read_text()).get(f"{name}/{run.batch}") if batched.exists() else None
        if at_b is None or at_b.get("key", {}).get("threads") != threads_used(run.threads):
            return None
        return at_b | {"mtp_acceptance": calib["mtp_acceptance"]}
    return calib


def load_or_measure(model: str, say=print, threads: int = 0, int4: bool = False, batch: int = 1, **kwargs) -> dict:
    """The cached calibration for this model (int4: a preset's int4 form), machine, threads, onnxruntime and batch;
    measured first when missing. A batch's carries the head's acceptance from the batch-1 calibration (measured too
    when missing)."""
    key = cache_key(model, threads_used(threads), int4=int4, batch=batch)
    path = cache_path(key)
    calib = None
    if path.exists():
        try:
            calib = json.loads(path.read_text())
        except (OSError, ValueError):
            calib = None
    if calib is None or calib.get("key") != key:
        at = f" at batch {batch}" if batch > 1 else ""
        say(f"no calibration for {key['preset']}{at} on {key['threads']} threads (onnxruntime {key['onnxruntime']}): "
            "measuring it")
        calib = measure(model, threads=threads, int4=int4, batch=batch, **kwargs)
        write_atomic(path, dumps(calib, indent=1))
        calib |= {"source": "measured now (none was cached on this machine)"}
    if batch > 1:
        calib |= {"mtp_acceptance": load_or_measure(model, say, threads, int4)["mtp_acceptance"]}
    return calib
