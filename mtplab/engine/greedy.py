"""Greedy decoding on an Engine: the baseline every speculative run is timed and checked against.

Each row's token is decoded at M=1 on Slot.PRIMARY from the feeds of one prepared forward (Engine._decoder), every
row of the engine's batch at once ([B, 1]; a batch of one decodes one sequence), its token and length feeds
rewritten in place before each run; tokens and margins stay on the device until the end, so the loop never waits
for it (each argmax feeds the next decode directly).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mtplab.engine.acceptance import top2_margins_xp
from mtplab.model.description import beyond_capacity, length_feeds
from mtplab.model.greedy_outputs import TOKENS
from mtplab.runtime.arena import to_numpy
from mtplab.runtime.executor import Slot


@dataclass
class Greedy:
    """A greedy run: its tokens (the prefill's first), the top-2 margins, the timed seconds of its decodes, the
    kept logits rows and when the timed window opened (perf_counter)."""

    tokens: list[int]
    margins: list[float]
    seconds: float
    decodes: int
    logits: list[np.ndarray] = field(default_factory=list)
    started: float = float("nan")


@dataclass
class GreedyRows:
    """A greedy run of every row of a batch (one row at batch 1): per row its tokens, margins and kept logits rows;
    the timed seconds of the batch's decodes ([B, 1] forwards) and when the timed window opened."""

    tokens: list[list[int]]
    margins: list[list[float]]
    seconds: float
    decodes: int
    started: float = float("nan")
    logits: list[list[np.ndarray]] = field(default_factory=list)


def decode(engine, prompt: list[int], n: int, eager: bool = False, keep_logits: int = 0,
           margins: bool = True) -> Greedy:
    """Greedy decoding of one sequence: decode_rows on a batch of one."""
    engine.one_sequence()
    capacity = engine.desc.capacity
    if len(prompt) + n - 1 > capacity:
        raise beyond_capacity(len(prompt) + n - 1, capacity)
    rows = decode_rows(engine, np.asarray([prompt], dtype=np.int64), n, eager, keep_logits, margins)
    return Greedy(rows.tokens[0], rows.margins[0], rows.seconds, rows.decodes, rows.logits[0] if rows.logits else [],
                  rows.started)


def decode_rows(engine, prompts: np.ndarray, n: int, eager: bool = False, keep_logits: int = 0,
                margins: bool = True) -> GreedyRows:
    """Greedy decoding of n tokens per row at M=1 on Slot.PRIMARY, every row of the engine's batch in one [B, 1]
    forward (prompts [B, P]; a row's tokens are chosen by the acceptance rule, its own generator where it samples).

    eager=True runs every decode outside the slot's plan. keep_logits=m keeps each row's first m logits rows
    (prefill's last, then each decode) for the anchor. margins=False skips the top-2 margins (a timed run: the decoder
    it measures computes none). Time starts after the prefill; `decodes` = n - 1 forwards are timed (the first
    tokens are the prefill's).
    """
    xp = engine.xp
    out = start_rows(engine, prompts)
    row = out["logits"][:, -1]
    tokens, rows = [engine.acceptance.row_tokens(xp, row, out[TOKENS][:, -1].copy())], [row.copy()][:keep_logits]
    gaps = [top2_margins_xp(xp, row)] if margins else []
    decoder = engine._decoder(eager) if n > 1 else None
    t0 = time.perf_counter()
    if decoder is not None:
        _decode_loop(engine, decoder, tokens, rows, gaps, n, keep_logits, margins)
    if xp is np:  # host arrays: the one read is the tokens' (on the CPU a copy, counted as a device's read is)
        host = [engine.device.read(np.stack(tokens, axis=1)), np.stack(gaps, axis=1) if margins else None]
    elif margins:
        both = engine.device.read(xp.stack([xp.stack(tokens, axis=1).astype(np.float64), xp.stack(gaps, axis=1)]))
        host = [both[0].astype(np.int64), both[1]]
    else:
        host = [engine.device.read(xp.stack(tokens, axis=1)), None]
    seconds = time.perf_counter() - t0
    B = engine.batch
    kept = [[to_numpy(r[b]) for r in rows] for b in range(B)] if rows else []
    gap = [[float(m) for m in host[1][b]] for b in range(B)] if margins else [[] for _ in range(B)]
    return GreedyRows([[int(t) for t in host[0][b]] for b in range(B)], gap, seconds, n - 1, t0, kept)


def start_rows(engine, prompts: np.ndarray) -> dict:
    """Engine.start for every row of the engine's batch: prompts [B, P] (one row at batch 1), prefilled together."""
    prompts = np.asarray(prompts)
    if prompts.ndim != 2 or prompts.shape[0] != engine.batch:
        raise ValueError(f"prompts must be [B={engine.batch}, prompt_len], got {list(prompts.shape)}")
    if engine.batch == 1:
        return engine.start([int(t) for t in prompts[0]])
    engine.new_generation()
    out = engine.prefill(prompts)
    engine.state.lengths[...] = prompts.shape[1]
    engine.setup_done()
    return out


def _decode_loop(engine, decoder, tokens: list, rows: list, gaps: list, n: int, keep_logits: int,
                 margins: bool) -> None:
    """The timed decodes: each row's token decoded at M=1 and its next chosen, until there are n (the kept logits
    rows and the margins too); the forward stamps and counts as Engine.forward keeps them."""
    xp, state, choose, watch = engine.xp, engine.state, engine.acceptance.row_tokens, engine.watch
    decode_one, ids, feeds = decoder
    io, capacity, key = engine.primary_desc.target, engine.desc.capacity, engine.forward_key(Slot.PRIMARY, 1)
    logits, carries, lengths, done = io.logits, state.carries(), state.lengths, 0
    # every row advances one token a decode: the lengths fed are the start's plus the decodes so far (a batch of one's
    # an int), and the state's are set once, at the end
    start = lengths.copy() if engine.batch > 1 else int(lengths[0])
    engine.first_forward = time.perf_counter()
    try:
        while len(tokens) < n:
            ids[:, 0] = tokens[-1]
            length_feeds(io, start + done, 1, capacity, feeds)
            out = decode_one()
            done += 1
            for committed, present in carries:  # state.carry(), its pairs looked up once
                committed[...] = present
            if watch is not None:  # the position: a batch's longest row
                watch(key, int(np.max(start)) + done - 1, engine.by_role(out))
            row = out[logits][:, 0]
            if len(rows) < keep_logits:
                rows.append(row.copy())
            tokens.append(choose(xp, row, out[TOKENS][:, 0].copy()))  # the next decode rewrites the graph's
            if margins:
                gaps.append(top2_margins_xp(xp, row))
    finally:  # counted once, and kept true when a decode raises
        lengths[...] = start + done
        engine.last_forward = time.perf_counter()
        engine.forwards[key] = engine.forwards.get(key, 0) + done
