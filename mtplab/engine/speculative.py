"""Speculative decoding of every row of an engine's batch (a batch of one included), one step at a time.

A step drafts for every row its own K (k, or its draft-length policy's: the MTP head at [B, 1]; the oracle from
each row's own reference or, sampled, its own mixture, seeded per row; a drafter of the user's own, one per row),
verifies [B, K+1] in one forward on Slot.VERIFY (K the longest row's), accepts per row on its own drafts (row b keeps
n_b; sampled, from its own generator) and commits per row (mtplab.engine.batch_commits). The schedule says whether
the step first decodes the pending token at M=1 on Slot.PRIMARY (decode-verify) or drafts from the hidden state of
the last committed position (fused: vLLM's, SGLang's). Row b decodes as a batch of one of its seeds would. A row that
has its tokens (n or more) rides along until every row has: its token repeated, its length held, its state rows
put back after each step. The batch shape, and so each slot's plan, never changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mtplab.engine.batch_commits import RowKeeper
from mtplab.engine.greedy import start_rows
from mtplab.engine.k_policies import StepCosts
from mtplab.engine.schedules import Phases
from mtplab.engine.step_drafts import StepDrafts
from mtplab.engine.strategies import DRAFTERS, K_POLICIES, SCHEDULES
from mtplab.model.description import beyond_capacity
from mtplab.model.greedy_outputs import ACCEPTED, TOKENS
from mtplab.runtime.executor import Slot


@dataclass
class SpeculativeRun:
    tokens: list[list[int]]  # per row, what it emitted (n or a few more: a step emits up to k + 1)
    accepted: list[list[int]]  # per row, its accepted drafts per step while it was decoding
    steps: int
    seconds: float
    finished: list[float]  # per row, seconds from the start until it had its n tokens
    split: dict = field(default_factory=dict)  # seconds per phase: decode, draft, verify, commit
    started: float = float("nan")  # perf_counter when the timed window opened
    expected_acceptance: dict | None = None  # a sampled checked run's expected acceptance per draft position
    ks: list[list[int]] = field(default_factory=list)  # per row, the drafts it made at each step while decoding
    widths: list[int] = field(default_factory=list)  # per batch step, its drafts (the verify's M - 1): the longest row's
    step_ends: list[float] = field(default_factory=list)  # per batch step, seconds from the start to its commit's end


def k_chooser(engine):
    """The run's draft-length chooser for one row's generation (mtplab.engine.k_policies); a policy that prices steps
    reads engine.k_costs (the point runner sets them from the calibration)."""
    policy = K_POLICIES.get(engine.spec.k_policy)
    costs: StepCosts | None = engine.k_costs
    if policy.needs_costs and costs is None:
        raise ValueError(f"k_policy={policy.name!r} prices each step's K with the cost-model calibration: run it "
                         "through run_point or `mtplab run` (which load it), or set engine.k_costs "
                         "(mtplab.engine.k_policies.StepCosts)")
    return policy.make(engine.spec, costs)


def check_inputs(engine, prompts: np.ndarray, n: int, references) -> None:
    """ValueError before any forward: a reference-reading drafter reads up to k + 1 tokens past the n a run makes
    (its last step's drafts), and the last verify must fit the KV capacity."""
    run, B, need = engine.spec, engine.batch, n + engine.k + 1
    kind = DRAFTERS.get(run.drafter)
    if kind.reads_reference(run):
        lengths = [] if references is None else [len(r) for r in references]
        if len(lengths) != B or min(lengths) < need:
            got = "none" if references is None else (f"{min(lengths, default=0)}" + (
                f" in the shortest of {len(lengths)}" if len(lengths) != 1 else ""))
            raise ValueError(f"the {kind.name} drafter drafts from the greedy reference: a run of {n} tokens at "
                             f"k={engine.k} needs its first {need} tokens (n + k + 1), got {got} (one per row, "
                             f"{B} here)")
    if prompts.shape[1] + n + engine.k > engine.desc.capacity:  # its last verify's reach, at most
        raise beyond_capacity(prompts.shape[1] + n + engine.k, engine.desc.capacity)


def _judged(engine, drafts, ver: dict, lengths: np.ndarray | None) -> tuple:
    """The acceptance rule's verdict on each row's own drafts (lengths: row b's K_b, 0 for a row that has its tokens):
    (each row's accepted count, its targets [B, K+1]), from the verify's outputs `ver` (its logits, and the graph's
    greedy choice: a row judged on k drafts keeps at most k of the graph's count). A row is judged on its first K_b
    drafts only (its bonus the target at K_b); a riding row keeps nothing (its state is put back), so it is not
    judged: a sampled row's generator stops where a batch-1 run of it ends, and the expected acceptance counts
    decoding rows only. Both on the engine's device (nothing here waits for it)."""
    K, xp, rule = drafts.shape[1], engine.xp, engine.acceptance
    logits, greedy, kept = ver["logits"], ver[TOKENS][:, : K + 1].copy(), ver[ACCEPTED]
    if lengths is None or (lengths == K).all():  # every row judged on all K
        counts, targets = rule.accept(xp, drafts, logits[:, : K + 1], greedy, xp.minimum(kept, K))
        return xp.asarray(counts), targets
    counts, targets = xp.zeros(engine.batch, dtype=np.int64), xp.zeros((engine.batch, K + 1), dtype=np.int64)
    for k in sorted(set(lengths[lengths > 0].tolist())):  # the rows of each K at once
        rows = np.flatnonzero(lengths == k)
        n, chosen = rule.accept(xp, drafts[rows, :k], logits[rows, : k + 1], greedy[rows, : k + 1],
                                xp.minimum(kept[rows], k), rows)
        counts[rows], targets[rows, : k + 1] = xp.asarray(n), chosen
    return counts, targets


def generate(engine, prompts: np.ndarray, n: int, references: list[list[int]] | None = None,
             on_commit: Callable | None = None) -> SpeculativeRun:
    """Speculative decoding of every row (prompts [B, P]) until it has n tokens; per-row tokens and accepted counts.

    references: each row's greedy tokens (a reference-reading drafter drafts from them; n + k + 1 each).
    on_commit(step, rows, emitted, ks), when given, is called after every step's commit with the rows it committed,
    every row's tokens so far and each row's drafts per step (the checked pass compares each committed row's state).
    """
    run, B, xp, read = engine.spec, engine.batch, engine.xp, engine.device.read
    prompts = np.asarray(prompts, dtype=np.int64)
    check_inputs(engine, prompts, n, references)
    decode_first = SCHEDULES.get(run.schedule).decodes > 0
    skip = 0 if decode_first else 1  # fused: the verify's first token was emitted by the step before
    readvance = engine.commit_strategy.verify_in_place
    st = engine.state
    out = start_rows(engine, prompts)
    first = read(engine.acceptance.row_tokens(xp, out["logits"][:, -1], out[TOKENS][:, -1].copy()))
    emitted = [[int(t)] for t in first]
    engine.last_hidden[...] = out["hidden"][:, -1]
    choosers = [k_chooser(engine) for _ in range(B)]  # each row's draft-length policy, on its own acceptance
    stop = choosers[0].stop  # a policy's stop reads the drafts' logits alone: the same for every row
    drafting = StepDrafts(engine, prompts, first, out["hidden"], references, stop, decode_first)
    frozen_rows = RowKeeper(engine, "batch-frozen") if B > 1 else None
    frozen_len = np.zeros(B, dtype=np.int64)
    active = [len(e) < n for e in emitted]  # the rows still decoding
    accepted: list[list[int]] = [[] for _ in range(B)]
    ks: list[list[int]] = [[] for _ in range(B)]
    widths: list[int] = []
    step_ends: list[float] = []
    phases, steps, all_rows = Phases(), 0, np.arange(B)
    pending, position, verify_start = (np.empty(B, dtype=np.int64) for _ in range(3))
    lengths, verify_ids = np.empty(B, dtype=np.int64), {}  # each step's K per row; the verify's ids, by M

    engine.setup_done()
    t0 = time.perf_counter()
    while any(active):
        stamps = [time.perf_counter()]
        for b in range(B):
            pending[b] = emitted[b][-1]
        if decode_first:  # decode the pending token at [B, 1]; draft from its hidden state
            hidden = engine.begin_step()
            dec = engine.forward(Slot.PRIMARY, pending[:, None])
            st.lengths += 1
            hidden[...] = dec["hidden"][:, 0]  # the next forward rewrites the slot's outputs
            first = engine.acceptance.row_tokens(xp, dec["logits"][:, 0], dec[TOKENS][:, 0].copy())  # on the device
        else:  # fused: draft from the pending token and the hidden state of the last committed position
            hidden, first = engine.begin_step(engine.last_hidden), pending
        stamps.append(time.perf_counter())  # the decode's end
        np.subtract(st.lengths, 1, out=position)
        # each row's K this step (its policy's), 0 for a row riding along: it drafts nothing and is not judged
        rows = [b for b in range(B) if active[b]]
        chosen = [c.next_k() if active[b] else 0 for b, c in enumerate(choosers)]
        lengths[:], width = chosen, max(chosen)
        # every row drafts `width` (no row's policy chose fewer, none may stop early): nothing to tell the drafts apart
        uniform = stop is None and min(chosen) == width
        drafts = drafting.draft(first, hidden, position, lengths, width, rows, uniform, emitted)
        width = drafts.shape[1]  # the longest row's drafts, after its policy's stop
        if uniform and drafting.on_host:  # a row may have drafted fewer (its reference ended)
            uniform = bool((lengths == width).all())
        stamps.append(time.perf_counter())  # the drafts'
        M = run.verified(width) + 1  # padded: each row's last draft repeated
        ids = verify_ids.get(M)
        if ids is None:
            ids = verify_ids[M] = xp.empty((B, M), dtype=np.int64)
        ids[:, 0], ids[:, 1 : width + 1] = xp.asarray(first), xp.asarray(drafts)
        if ids.shape[1] > width + 1:
            ids[:, width + 1 :] = ids[:, width : width + 1]
        if readvance:
            engine.save_state()
        verify_start[:] = st.lengths
        ver = engine.forward(Slot.VERIFY, ids, in_place=readvance)
        counts, targets = _judged(engine, ids[:, 1 : width + 1], ver, None if uniform else lengths)
        if xp is np:  # the step's one host read (host arrays: nothing to copy)
            counts = read(counts)
        else:  # each row's kept drafts, its targets [K+1] and its verify's ids, in one copy
            packed = read(xp.concatenate([counts[:, None], targets, ids], axis=1))
            counts, targets, ids = packed[:, 0], packed[:, 1 : width + 2], packed[:, width + 2 :]
        if not decode_first:  # before the commit: a re-advance may reuse the verify's output buffers
            engine.last_hidden[...] = ver["hidden"][all_rows, counts]
        stamps.append(time.perf_counter())  # the verify's
        drafting.commit(ver["hidden"], ids, targets, counts, verify_start, rows)  # before the commit; draft work
        stamps.append(time.perf_counter())  # the drafter's commit's
        engine.commit(ver, counts + 1, rows, ids, verify_start)
        engine.end_step()
        steps += 1
        widths.append(width)
        step_ends.append(time.perf_counter() - t0)
        kept_counts, verified, K_of = counts.tolist(), ids.tolist(), lengths.tolist()
        for b in rows:
            c, K, kept = kept_counts[b], K_of[b], verified[b]
            accepted[b].append(c)
            ks[b].append(K)
            choosers[b].observe(K, c)
            emitted[b] += kept[skip : c + 1]
            emitted[b].append(int(targets[b, c]))
        if on_commit is not None:
            on_commit(steps, rows, emitted, ks)
        done = [b for b in rows if len(emitted[b]) >= n]
        for b in done:
            active[b] = False
        if done and frozen_rows is not None:
            frozen_rows.keep(done)
            frozen_len[done] = st.lengths[done]
        riding = [b for b in range(B) if not active[b]]
        if riding and frozen_rows is not None:  # rows that have their tokens: state and length as they finished
            frozen_rows.put_back(riding)
            st.lengths[riding] = frozen_len[riding]
        phases.append((*stamps, time.perf_counter()))  # and the commit's
    seconds = time.perf_counter() - t0
    finished = [step_ends[len(a) - 1] if a else float("nan") for a in accepted]  # the end of each row's last step
    return SpeculativeRun(emitted, accepted, steps, seconds, finished, phases.seconds, t0, ks=ks, widths=widths,
                          step_ends=step_ends)
