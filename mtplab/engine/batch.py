"""Batches: B sequences decoded together, each row with its own length, acceptance and commit.

An Engine made for `run.batch` = B > 1 holds B rows of every state (KV, conv carry, GatedDeltaNet state)
and of the MTP head's KV; this module decodes them. Greedy decodes [B, 1] on Slot.PRIMARY. A speculative
step drafts for every row its own K (k, or its draft-length policy's: the MTP head at [B, 1]; the oracle from
each row's own reference or, sampled, its own mixture, seeded per row), verifies [B, K+1] in one forward on
Slot.VERIFY (K the longest row's), accepts per row on its own drafts (row b keeps n_b; sampled, from its own
generator) and commits per row. Row b decodes as a batch-1 run of its seeds would. Each row keeps its own length:
GroupQueryAttention reads it from the per-row `seqlens_k` (or attention mask), and `query_seqlens` tells every
row's query length in an M > 1 forward.

How each commit strategy handles rows with different accepted counts: mtplab.engine.batch_commits; the head's
drafts and commit per row: mtplab.engine.batch_head.
A row that has its tokens (n or more) rides along until every row has: its token repeated, its
length held, its state rows put back after each step. The batch shape, and so each slot's plan, never changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mtplab.engine.acceptance import GREEDY_MATCH
from mtplab.engine.batch_commits import RowKeeper, batch_commit
from mtplab.engine.batch_head import commit_head, draft_from_rows, draft_head
from mtplab.engine.drafters import OracleDrafter, row_alphas
from mtplab.engine.greedy import GreedyRows, decode_rows, start_rows
from mtplab.engine.mixture import distractor_token, mixture_drafts, row_target_rows
from mtplab.engine.schedules import Phases
from mtplab.engine.speculative import k_chooser
from mtplab.engine.strategies import DRAFTERS
from mtplab.model.prompts import run_prompt
from mtplab.runtime.executor import Slot
from mtplab.runtime.state import mtp_io


def prompts(run, vocab: int) -> np.ndarray:
    """The batch's prompts [B, P]: row b's is the batch-1 prompt of seed + b."""
    return np.array([run_prompt(run, vocab, run.seed + b) for b in range(run.batch)], dtype=np.int64)


@dataclass
class BatchRun:
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


def start(engine, batch_prompts: np.ndarray) -> dict:
    """A new batch generation: state and plans reset, every row's prompt prefilled at [B, P] (eager, untimed)."""
    check_engine(engine, batch_prompts)
    return start_rows(engine, batch_prompts)


def check_engine(engine, batch_prompts: np.ndarray) -> None:
    """ValueError unless the prompts are [B, P] for the engine's batch B."""
    if engine.batch < 2:
        raise ValueError(f"mtplab.engine.batch decodes batch > 1 (this engine's run has batch={engine.batch}: use "
                         "Engine.greedy / Engine.speculative)")
    if batch_prompts.ndim != 2 or batch_prompts.shape[0] != engine.batch:
        raise ValueError(f"prompts must be [B={engine.batch}, prompt_len], got {list(batch_prompts.shape)}")


def greedy(engine, batch_prompts: np.ndarray, n: int, margins: bool = False, keep_logits: int = 0) -> GreedyRows:
    """Greedy decoding of n tokens per row (mtplab.engine.greedy.decode_rows, the loop a batch of one runs too)."""
    check_engine(engine, batch_prompts)
    return decode_rows(engine, batch_prompts, n, margins=margins, keep_logits=keep_logits)


def _judged(engine, drafts: np.ndarray, logits, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The acceptance rule's verdict on each row's own drafts (lengths: row b's K_b, 0 for a row that has its tokens):
    (each row's accepted count, its targets [B, K+1]). A row is judged on its first K_b drafts only (its bonus the
    target at K_b); a riding row keeps nothing (its state is put back), so it is not judged: a sampled row's
    generator stops where a batch-1 run of it ends, and the expected acceptance counts decoding rows only."""
    K = drafts.shape[1]
    if (lengths == K).all():
        return engine.acceptance.accept(np, drafts, logits)
    counts, targets = np.zeros(engine.batch, dtype=np.int64), np.zeros((engine.batch, K + 1), dtype=np.int64)
    for k in sorted(set(lengths[lengths > 0].tolist())):  # the rows of each K at once
        rows = np.flatnonzero(lengths == k)
        counts[rows], targets[rows, : k + 1] = engine.acceptance.accept(np, drafts[rows, :k], logits[rows, : k + 1],
                                                                        rows)
    return counts, targets


def speculative(engine, batch_prompts: np.ndarray, n: int, references: list[list[int]] | None = None,
                on_commit: Callable | None = None) -> BatchRun:
    """Speculative decoding of every row until it has n tokens; per-row tokens and accepted counts.

    references: each row's greedy tokens (the oracle drafts from them; n + k + 1 each). on_commit(step, rows,
    emitted, ks), when given, is called after every step's commit with the rows it committed, every row's tokens so
    far and each row's drafts per step (the checked pass compares each committed row's state there).
    """
    run, k, B = engine.spec, engine.k, engine.batch
    kind = DRAFTERS.get(run.drafter)
    oracle = run.drafter == "oracle"
    mixture = oracle and engine.acceptance.samples  # at T > 0 the oracle drafts from the target's own rows
    if kind.reads_reference(run) and (references is None or len(references) != B or min(map(len, references)) < n + k + 1):
        got = "none" if references is None else f"{len(references)} of {min(map(len, references), default=0)}+ tokens"
        raise ValueError(f"the {kind.name} drafter drafts from each row's greedy reference: {B} references of at least "
                         f"n + k + 1 = {n + k + 1} tokens (got {got})")
    commit, decode_first = batch_commit(engine), run.schedule == "decode-verify"
    skip = 0 if decode_first else 1  # fused: the verify's first token was emitted by the step before
    readvance = engine.commit_strategy.verify_in_place
    st = engine.state
    out = start(engine, batch_prompts)
    first = engine.acceptance.row_tokens(np, out["logits"][:, -1])
    emitted = [[int(t)] for t in first]
    head = engine.head if kind.uses_head(run) and kind.name in ("mtp", "oracle") else None
    if head is not None:  # the head's KV: entry j pairs token j+1 with the target's hidden j
        feeds, outputs, bound = mtp_io(engine.desc, engine.mtp_state, np.concatenate([batch_prompts[:, 1:], first[:, None]], 1),
                                       out["hidden"], np.zeros(B, np.int64))
        head_out = engine.mtp.run_eager(Slot.PRIMARY, feeds, outputs, bound)
        key = f"mtp/M={batch_prompts.shape[1]}"  # counted as a batch-1 head's prefill is
        engine.forwards[key] = engine.forwards.get(key, 0) + 1
        io = engine.desc.mtp
        ready = np.array(head_out[io.logits][:, -1]), np.array(head_out[io.hidden][:, -1])
    alphas, P = row_alphas(run.alpha, B), batch_prompts.shape[1]
    row_prompts = [[int(t) for t in row] for row in batch_prompts]
    # a drafter of the user's own drafts one sequence: one per row, each told only its own row
    own = [kind.build(engine, references[b] if references else None) for b in range(B)] if head is None and not (
        oracle) else []
    for b, d in enumerate(own):
        d.prefill(row_prompts[b][1:] + [int(first[b])], out["hidden"][b])
    oracles = [OracleDrafter(references[b], alpha, run.seed + b, engine.desc.vocab_size, None)
               for b, alpha in enumerate(alphas)] if oracle and not mixture else []
    for o in oracles:
        o.prefill([0] * P, None)
    mixtures = [(row_target_rows(engine, b), distractor_token(run.seed + b, engine.desc.vocab_size))
                for b in range(B)] if mixture else []
    for b, (rows_b, _) in enumerate(mixtures):
        rows_b.start(row_prompts[b])
    head_choice = GREEDY_MATCH.draft_rows if mixture else None  # the mixture's head runs for its cost, drawing nothing
    engine.last_hidden[...] = out["hidden"][:, -1]
    choosers = [k_chooser(engine) for _ in range(B)]  # each row's draft-length policy, on its own acceptance
    stop = choosers[0].stop  # a policy's stop reads the drafts' logits alone: the same for every row
    for d in own if stop is not None else ():
        d.stop = stop
    frozen_rows = RowKeeper(engine, "batch-frozen")
    frozen_len = np.zeros(B, dtype=np.int64)
    active = np.array([len(e) < n for e in emitted])
    accepted: list[list[int]] = [[] for _ in range(B)]
    ks: list[list[int]] = [[] for _ in range(B)]
    widths: list[int] = []
    finished = [float("nan")] * B
    phases, steps, all_rows = Phases(), 0, np.arange(B)
    engine.setup_done()
    t0 = time.perf_counter()
    while active.any():
        stamps = [time.perf_counter()]
        pending = np.array([e[-1] for e in emitted], dtype=np.int64)
        if decode_first:  # decode the pending token at [B, 1]; draft from its hidden state
            dec = engine.forward(Slot.PRIMARY, pending[:, None])
            st.lengths += 1
            hidden = np.array(dec["hidden"][:, 0], dtype=np.float32)
            first = engine.acceptance.row_tokens(np, dec["logits"][:, 0])
        else:  # fused: draft from the pending token and the last committed position's hidden state
            hidden, first = engine.last_hidden, pending  # read by the drafts only, before the verify rewrites it
        stamps.append(time.perf_counter())  # the decode's end
        position = st.lengths - 1
        # each row's K this step (its policy's), 0 for a row riding along: it drafts nothing and is not judged
        lengths = np.array([c.next_k() if active[b] else 0 for b, c in enumerate(choosers)], dtype=np.int64)
        width, drafts = int(lengths.max()), None
        if head is not None:
            drafts = draft_head(engine, first, hidden, position, width, lengths, stop, head_choice) if (
                decode_first) else draft_from_rows(engine, ready, position, width, lengths, stop, head_choice)
        if oracle:  # each row its own K drafts (its generator stays where a batch-1 run of the row is)
            drafts = np.zeros((B, width), dtype=np.int64)
            for b in np.flatnonzero(active):
                K, committed = int(lengths[b]), int(position[b]) + 1
                drafts[b, :K] = oracles[b].draft(int(first[b]), None, committed - 1, K) if not mixture else (
                    mixture_drafts(engine.acceptance, mixtures[b][0], alphas[b], mixtures[b][1], row_prompts[b]
                                   + emitted[b][: committed - P] + [int(first[b])], committed, K, b))
        if own:  # each row's own drafter, as in a batch-1 run of the row; a row may draft fewer than asked
            drafts = np.zeros((B, width), dtype=np.int64)
            for b in np.flatnonzero(active):
                made = np.asarray(engine.device.read(own[b].draft(int(first[b]), hidden[b], int(position[b]),
                                                                  int(lengths[b]))), dtype=np.int64)[: lengths[b]]
                lengths[b] = made.shape[0]
                drafts[b, : lengths[b]] = made
            drafts = drafts[:, : int(lengths.max(initial=0))]
        width = drafts.shape[1]  # the longest row's drafts, after its policy's stop
        stamps.append(time.perf_counter())  # the drafts'
        ids = np.empty((B, run.verified(width) + 1), dtype=np.int64)  # padded: each row's last draft repeated
        ids[:, 0], ids[:, 1 : width + 1], ids[:, width + 1 :] = first, drafts, drafts[:, -1:]
        if readvance:
            engine.save_state()
        verify_start = st.lengths.copy()
        ver = engine.forward(Slot.VERIFY, ids, in_place=readvance)
        counts, targets = _judged(engine, drafts, ver["logits"][:, : width + 1], lengths)  # kept drafts, [B, K+1]
        if not decode_first:  # before the commit: a re-advance may reuse the verify's output buffers
            engine.last_hidden[...] = ver["hidden"][all_rows, counts]
        stamps.append(time.perf_counter())  # the verify's
        if head is not None:  # before the commit, for the same reason; draft work (Phases)
            ready = commit_head(engine, targets, counts, ver["hidden"], verify_start)
        for b in np.flatnonzero(active) if own else ():  # a drafter with a cache of its own: what its row kept
            if (commit_own := getattr(own[b], "commit", None)) is not None:
                c = int(counts[b])
                commit_own(ver["hidden"][b], ids[b, 1 : c + 1].tolist() + [int(targets[b, c])], int(verify_start[b]))
        stamps.append(time.perf_counter())  # the head's commit's
        st.lengths[...] = verify_start
        engine.target.rollback(Slot.PRIMARY)
        rows = np.flatnonzero(active)
        if readvance:
            commit(ver, counts + 1, rows, ids, verify_start)
        else:
            commit(ver, counts + 1, rows)
        st.lengths[...] = verify_start + counts + 1
        engine.end_step()
        steps += 1
        widths.append(width)
        now = time.perf_counter()
        for b in rows:
            c = int(counts[b])
            accepted[b].append(c)
            ks[b].append(int(lengths[b]))
            choosers[b].observe(int(lengths[b]), c)
            emitted[b] += ids[b, skip : c + 1].tolist() + [int(targets[b, c])]
        if on_commit is not None:
            on_commit(steps, rows, emitted, ks)
        done = [b for b in rows if len(emitted[b]) >= n]
        for b in done:
            active[b] = False
            finished[b] = now - t0
        if done:
            frozen_rows.keep(done)
            frozen_len[done] = st.lengths[done]
        riding = np.flatnonzero(~active)
        if riding.size:  # rows that have their tokens: state and length as they finished
            frozen_rows.put_back(riding)
            st.lengths[riding] = frozen_len[riding]
        phases.append((*stamps, time.perf_counter()))  # and the commit's
    return BatchRun(emitted, accepted, steps, time.perf_counter() - t0, finished, phases.seconds, t0, ks=ks,
                    widths=widths)
