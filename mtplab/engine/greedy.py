"""Greedy decoding on an Engine: the baseline every speculative run is timed and checked against.

Each token is decoded at M=1 on Slot.PRIMARY from the feeds of one prepared forward (Engine.decoder), its token
and length feeds rewritten in place before each run; tokens and margins stay on the device until the end, so the
loop never waits for it (each argmax feeds the next decode directly).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mtplab.engine.acceptance import top2_margin_xp
from mtplab.model.description import beyond_capacity, length_feeds
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


def decode(engine, prompt: list[int], n: int, eager: bool = False, keep_logits: int = 0,
           margins: bool = True) -> Greedy:
    """Greedy decoding of n tokens at M=1 on Slot.PRIMARY.

    eager=True runs every decode outside the slot's plan. keep_logits=m keeps the first m logits rows (prefill's
    last, then each decode) for the anchor. margins=False skips the top-2 margins (a timed run: the decoder it
    measures computes none). Time starts after the prefill; `decodes` = n - 1 tokens are timed (the first is the
    prefill's).
    """
    xp, capacity = engine.xp, engine.desc.capacity
    if len(prompt) + n - 1 > capacity:
        raise beyond_capacity(len(prompt) + n - 1, capacity)
    out = engine.start(prompt)
    row = out["logits"][0, -1]
    tokens, rows = [engine.acceptance.token(xp, row)], [row.copy()][:keep_logits]
    gaps = [top2_margin_xp(xp, row)] if margins else []
    decoder = engine._decoder(eager) if n > 1 else None
    t0 = time.perf_counter()
    if decoder is not None:
        _decode_loop(engine, decoder, tokens, rows, gaps, n, keep_logits, margins)
    if xp is np:  # host scalars: one array from the list (np.stack makes an array of each first)
        host = [engine.device.read(np.array(tokens)), np.array(gaps)]
    elif margins:
        host = engine.device.read(xp.stack([xp.stack(tokens).astype(np.float64), xp.stack(gaps)]))
    else:
        host = [engine.device.read(xp.stack(tokens)), []]
    seconds = time.perf_counter() - t0
    logits = [to_numpy(r) for r in rows]
    return Greedy([int(t) for t in host[0]], [float(m) for m in host[1]], seconds, n - 1, logits, t0)


def _decode_loop(engine, decoder, tokens: list, rows: list, gaps: list, n: int, keep_logits: int,
                 margins: bool) -> None:
    """The timed decodes: each token decoded at M=1 and the next chosen, until there are n (the kept logits rows
    and the margins too); the forward stamps and counts as Engine.forward keeps them."""
    xp, state, choose, watch = engine.xp, engine.state, engine.acceptance.token, engine.watch
    decode_one, ids, feeds = decoder
    io, capacity, key = engine.primary_desc.target, engine.desc.capacity, engine.forward_key(Slot.PRIMARY, 1)
    logits, carries, done = io.logits, state.carries(), 0
    engine.first_forward = time.perf_counter()
    try:
        while len(tokens) < n:
            ids[...] = tokens[-1]
            length_feeds(io, state.length, 1, capacity, feeds)
            out = decode_one()
            done += 1
            for committed, present in carries:  # state.carry(), its pairs looked up once
                committed[...] = present
            if watch is not None:
                watch(key, state.length, engine.by_role(out))
            state.length += 1
            row = out[logits][0, 0]
            if len(rows) < keep_logits:
                rows.append(row.copy())
            tokens.append(choose(xp, row))
            if margins:
                gaps.append(top2_margin_xp(xp, row))
    finally:  # counted once, and kept true when a decode raises
        engine.last_forward = time.perf_counter()
        engine.forwards[key] = engine.forwards.get(key, 0) + done
