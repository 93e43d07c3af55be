"""Batches: B sequences decoded together, each row with its own length, acceptance and commit.

An Engine made for `run.batch` = B > 1 holds B rows of every state (KV, conv carry, GatedDeltaNet state)
and of the MTP head's KV; this module decodes them. Greedy decodes [B, 1] on Slot.PRIMARY. A speculative
step drafts for every row (the MTP head at [B, 1], k steps; the oracle from each row's own reference, seeded
per row), verifies [B, k+1] in one forward on Slot.VERIFY, accepts per row (greedy match: row b keeps n_b
drafts) and commits per row. Each row keeps its own length: GroupQueryAttention reads it from the per-row
`seqlens_k`, and `query_seqlens` tells every row's query length in an M > 1 forward.

How each commit strategy handles rows with different accepted counts (c_b = n_b + 1 tokens to keep):
- select: row b replays its own c_b transitions and rebuilds its conv carry from its own c_b inputs. No
  forward; the same cost whatever the counts.
- readvance-m1: restore every row, then max_b c_b forwards at [B, 1]; a row whose c_b tokens are in rides
  along (its last token repeated, its length held) and its state rows are put back after each further
  forward. Cost: the longest row's count, not the mean.
- readvance-batched: restore, then one [B, c] forward per distinct count c among the rows; the rows with
  another count are put back after it. Cost: one forward per distinct count (1 at B = 1).
A row that has its tokens (n or more) rides along the same way until every row has: its token repeated, its
length held, its state rows put back after each step. The batch shape, and so each slot's plan, never changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mtplab.engine.acceptance import GREEDY_MATCH
from mtplab.engine.commits import select_commit
from mtplab.engine.drafters import OracleDrafter, row_alphas
from mtplab.engine.mixture import distractor_token, mixture_drafts, row_target_rows
from mtplab.engine.schedules import Phases
from mtplab.engine.speculative import k_chooser
from mtplab.model.prompts import run_prompt
from mtplab.runtime.executor import Slot
from mtplab.runtime.state import mtp_io


def prompts(run, vocab: int) -> np.ndarray:
    """The batch's prompts [B, P]: row b's is the batch-1 prompt of seed + b."""
    return np.array([run_prompt(run, vocab, run.seed + b) for b in range(run.batch)], dtype=np.int64)


@dataclass
class BatchGreedy:
    tokens: list[list[int]]  # per row, n tokens
    margins: list[list[float]]  # per row, greedy's top-2 margin at each token (empty when not asked for)
    seconds: float
    decodes: int  # timed [B, 1] forwards (n - 1: the first tokens are the prefill's)
    started: float = float("nan")  # perf_counter when the timed window opened
    logits: list[list[np.ndarray]] = field(default_factory=list)  # per row, its first kept logits rows (the anchor's)


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


def _margins(rows: np.ndarray) -> np.ndarray:
    """Each row's top-2 gap (0 on a tie)."""
    top2 = np.partition(rows.astype(np.float64), -2, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def start(engine, batch_prompts: np.ndarray) -> dict:
    """A new batch generation: state and plans reset, every row's prompt prefilled at [B, P] (eager, untimed)."""
    check_engine(engine, batch_prompts)
    engine.new_generation()
    out = engine.prefill(batch_prompts)
    engine.state.lengths[...] = batch_prompts.shape[1]
    engine.setup_done()
    return out


def check_engine(engine, batch_prompts: np.ndarray) -> None:
    """ValueError unless the prompts are [B, P] for the engine's batch B."""
    if engine.batch < 2:
        raise ValueError(f"mtplab.engine.batch decodes batch > 1 (this engine's run has batch={engine.batch}: use "
                         "Engine.greedy / Engine.speculative)")
    if batch_prompts.ndim != 2 or batch_prompts.shape[0] != engine.batch:
        raise ValueError(f"prompts must be [B={engine.batch}, prompt_len], got {list(batch_prompts.shape)}")


def greedy(engine, batch_prompts: np.ndarray, n: int, margins: bool = False, keep_logits: int = 0) -> BatchGreedy:
    """Greedy decoding of n tokens per row, [B, 1] per forward on Slot.PRIMARY (the first token is the prefill's).
    keep_logits=m keeps each row's first m logits rows (prefill's last, then each decode) for the anchor."""
    st, forward, choose = engine.state, engine.forward, engine.acceptance.row_tokens
    out = start(engine, batch_prompts)
    rows = out["logits"][:, -1]
    tokens = [choose(np, rows)]
    gaps = [_margins(rows)] if margins else []
    kept = [rows.copy()][:keep_logits]
    t0 = time.perf_counter()
    while len(tokens) < n:
        out = forward(Slot.PRIMARY, tokens[-1][:, None])
        st.lengths += 1
        rows = out["logits"][:, 0]
        if len(kept) < keep_logits:
            kept.append(rows.copy())
        tokens.append(choose(np, rows))
        if margins:
            gaps.append(_margins(rows))
    seconds = time.perf_counter() - t0
    host = np.stack(tokens, axis=1)
    gap = np.stack(gaps, axis=1) if margins else np.zeros((engine.batch, 0))
    logits = [[r[b] for r in kept] for b in range(engine.batch)] if kept else []
    return BatchGreedy(host.tolist(), gap.tolist(), seconds, n - 1, t0, logits)


class RowKeeper:
    """Puts rows' recurrent state back: the rows a forward should not have advanced (rows riding along)."""

    def __init__(self, engine, name: str):
        self.live = engine.state.recurrent_arrays()
        self.kept = [engine.main.reserve(f"{name}.{i}", a.shape, a.dtype) for i, a in enumerate(self.live)]

    def keep(self, rows) -> None:
        for kept, live in zip(self.kept, self.live):
            kept[rows] = live[rows]

    def put_back(self, rows) -> None:
        for kept, live in zip(self.kept, self.live):
            live[rows] = kept[rows]


def select_rows(engine) -> Callable:
    """select at batch B: commit(ver, counts, rows) replays each listed row's own count (its transitions, or its
    LinearAttention inputs through the op)."""
    st = engine.state
    apply = select_commit(engine.desc, engine.device)

    def commit(ver: dict, counts: np.ndarray, rows) -> None:
        for b in rows:
            apply(st, ver, int(counts[b]), int(b))

    return commit


def _restored(engine, counts: np.ndarray, rows) -> np.ndarray:
    """A re-advance's start: the state from before the verify put back; each row's count, 0 for rows not listed."""
    engine.restore_state()
    return np.where(np.isin(np.arange(engine.batch), rows), counts, 0)


def readvance_m1_rows(engine) -> Callable:
    """readvance-m1 at batch B: restore, then max count forwards at [B, 1]; rows with fewer ride along."""
    st, keeper, B = engine.state, RowKeeper(engine, "batch-keep"), engine.batch

    def commit(ver: dict, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        counts = _restored(engine, counts, rows)
        for j in range(int(counts.max(initial=0))):
            done = counts <= j
            keeper.keep(np.flatnonzero(counts == j))  # rows whose tokens are all in: their state from now on
            st.lengths[...] = start + np.minimum(j, counts)
            tokens = ids[np.arange(B), np.minimum(j, np.maximum(counts - 1, 0))]
            engine.forward(Slot.PRIMARY, tokens[:, None])
            keeper.put_back(np.flatnonzero(done))

    return commit


def readvance_batched_rows(engine) -> Callable:
    """readvance-batched at batch B: restore, then one [B, c] forward per distinct count c; other rows put back."""
    st, keeper, B = engine.state, RowKeeper(engine, "batch-keep"), engine.batch

    def commit(ver: dict, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        counts = _restored(engine, counts, rows)
        held = np.zeros(B, dtype=np.int64)  # tokens each row holds so far
        for c in sorted(set(counts[counts > 0].tolist())):
            others = np.flatnonzero(counts != c)
            keeper.keep(others)
            st.lengths[...] = start + held
            engine.forward(Slot.PRIMARY, ids[:, :c])
            keeper.put_back(others)
            held[counts == c] = c

    return commit


BATCH_COMMITS = {"select": select_rows, "readvance-m1": readvance_m1_rows, "readvance-batched": readvance_batched_rows}


def batch_commit(engine) -> Callable:
    """The run's commit strategy at batch B, prepared once per engine (ValueError for one with no batched form)."""
    name = engine.commit_strategy.name
    if name not in BATCH_COMMITS:
        raise ValueError(f"commit={name!r} has no batched form: batch > 1 runs commit in {list(BATCH_COMMITS)}")
    return engine.prepared(("batch", name, BATCH_COMMITS[name]), BATCH_COMMITS[name])


def draft_head(engine, first: np.ndarray, hidden: np.ndarray, position: np.ndarray, k: int,
               lengths: np.ndarray | None = None, stop: Callable | None = None, choose: Callable | None = None
               ) -> np.ndarray:
    """k drafts per row [B, k] from the MTP head at [B, 1]: row b from its token `first[b]` and hidden[b] at
    its own position. lengths: each row's own number of drafts (a draft-length policy's K_b, 0 for a row that has its
    tokens): a row draws nothing past its own (a sampled row's generator stays where a batch-1 run of it is), and
    stop (the policy's, on a row's logits after a draft) lowers it in place where it ends the row's drafting; the
    drafts end where the longest row's do. choose: how the drafts are chosen (the acceptance rule's draft_rows; the
    mixture oracle's head, which runs for its cost, takes the argmax and draws nothing)."""
    desc, io = engine.desc, engine.desc.mtp
    choose = choose or engine.acceptance.draft_rows
    drafts = np.empty((engine.batch, k), dtype=np.int64)
    token, h = first, hidden
    for i in range(k):
        feeds, outputs, bound = mtp_io(desc, engine.mtp_state, token[:, None], h[:, None], position + i)
        out = engine.mtp.run(Slot.PRIMARY, feeds, outputs, bound)
        engine.forwards["mtp/M=1"] = engine.forwards.get("mtp/M=1", 0) + 1
        logits = out[io.logits][:, 0]
        drawing = None if lengths is None else np.flatnonzero(lengths > i)
        token = choose(np, logits, drawing)
        h = out[io.hidden][:, 0]
        drafts[:, i] = token
        if lengths is not None and (ended := _stopped(lengths, drawing, logits, i + 1, stop)):
            return drafts[:, :ended]
    return drafts


def _stopped(lengths: np.ndarray, drawing: np.ndarray, logits, made: int, stop: Callable | None) -> int:
    """After `made` drafts: rows whose policy stops here have their lengths lowered to it; the drafts made when no
    row wants more (0 while some row does)."""
    if stop is not None:
        for b in drawing:
            if lengths[b] > made and stop(logits[b]):
                lengths[b] = made
    return made if lengths.max(initial=0) <= made else 0


def draft_from_rows(engine, ready: tuple[np.ndarray, np.ndarray], position: np.ndarray, k: int,
                    lengths: np.ndarray | None = None, stop: Callable | None = None, choose: Callable | None = None
                    ) -> np.ndarray:
    """The drafts [B, k] of a step whose first head step the last head commit ran (the fused schedule): `ready`
    holds each row's logits and hidden state there; the first draft from the logits, the rest chained (lengths and
    stop and choose as draft_head's)."""
    logits, hidden = ready
    choose = choose or engine.acceptance.draft_rows
    drafts = np.empty((engine.batch, k), dtype=np.int64)
    drawing = None if lengths is None else np.flatnonzero(lengths > 0)
    drafts[:, 0] = choose(np, logits, drawing)
    if lengths is not None and _stopped(lengths, drawing, logits, 1, stop):
        return drafts[:, :1]
    if k > 1:
        rest = None if lengths is None else np.maximum(lengths - 1, 0)
        chained = draft_head(engine, drafts[:, 0], hidden, position + 1, k - 1, rest, stop, choose)
        drafts = drafts[:, : 1 + chained.shape[1]]
        drafts[:, 1:] = chained
        if lengths is not None:
            lengths[...] = np.where(lengths > 0, rest + 1, 0)
    return drafts


def commit_head(engine, targets: np.ndarray, counts: np.ndarray, hidden: np.ndarray, start: np.ndarray):
    """The head's KV rows start.. for what each row's verify kept, one [B, k+1] forward on the head's Verify slot:
    row b's kept tokens are its targets up to counts[b] (the accepted drafts, then the bonus), padded with the
    bonus (rows past the kept ones lie beyond the committed length). Returns each row's (logits, hidden) at its
    last kept row: the next step's first head step where it starts there (fused)."""
    io, B = engine.desc.mtp, engine.batch
    rows = np.arange(B)
    bonus = targets[rows, counts]
    kept = np.where(np.arange(targets.shape[1]) <= counts[:, None], targets, bonus[:, None])
    feeds, outputs, bound = mtp_io(engine.desc, engine.mtp_state, kept, hidden, start)
    out = engine.mtp.run(Slot.VERIFY, feeds, outputs, bound)
    key = f"mtp-commit/M={targets.shape[1]}"
    engine.forwards[key] = engine.forwards.get(key, 0) + 1
    return np.array(out[io.logits][rows, counts]), np.array(out[io.hidden][rows, counts])


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
    emitted), when given, is called after every step's commit with the rows it committed and every row's tokens so
    far (the checked pass compares each committed row's state there).
    """
    run, k, B = engine.spec, engine.k, engine.batch
    oracle = run.drafter == "oracle"
    mixture = oracle and engine.acceptance.samples  # at T > 0 the oracle drafts from the target's own rows
    if oracle and not mixture and (references is None or len(references) != B or min(map(len, references)) < n + k + 1):
        got = "none" if references is None else f"{len(references)} of {min(map(len, references), default=0)}+ tokens"
        raise ValueError(f"the oracle drafter drafts from each row's greedy reference: {B} references of at least "
                         f"n + k + 1 = {n + k + 1} tokens (got {got})")
    commit, decode_first = batch_commit(engine), run.schedule == "decode-verify"
    skip = 0 if decode_first else 1  # fused: the verify's first token was emitted by the step before
    readvance = engine.commit_strategy.verify_in_place
    st = engine.state
    out = start(engine, batch_prompts)
    first = engine.acceptance.row_tokens(np, out["logits"][:, -1])
    emitted = [[int(t)] for t in first]
    head = engine.head if not (oracle and run.oracle_free_drafts) else None
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
        width = drafts.shape[1]  # the longest row's drafts, after its policy's stop
        stamps.append(time.perf_counter())  # the drafts'
        ids = np.empty((B, width + 1), dtype=np.int64)
        ids[:, 0], ids[:, 1:] = first, drafts
        if readvance:
            engine.save_state()
        verify_start = st.lengths.copy()
        ver = engine.forward(Slot.VERIFY, ids, in_place=readvance)
        counts, targets = _judged(engine, drafts, ver["logits"], lengths)  # drafts each row keeps, [B, K+1]
        if not decode_first:  # before the commit: a re-advance may reuse the verify's output buffers
            engine.last_hidden[...] = ver["hidden"][all_rows, counts]
        stamps.append(time.perf_counter())  # the verify's
        if head is not None:  # before the commit, for the same reason; draft work (Phases)
            ready = commit_head(engine, targets, counts, ver["hidden"], verify_start)
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
            on_commit(steps, rows, emitted)
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
