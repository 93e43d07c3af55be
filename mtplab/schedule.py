"""One speculative step per schedule: draft, verify, accept, commit.

decode-verify (the seed's): decode the pending token at M=1 on Slot.PRIMARY, draft from that
decode's hidden state, verify [g, d1..dk]. fused (vLLM, SGLang): no decode; drafts start from the
pending token and the hidden state of the last committed position, and the verify [pending,
d1..dk] yields the next step's hidden state.

Each step appends what it emits to `emitted`, adds its phase times to `split` and returns the
number of drafts accepted. Until the verify's one host read, tokens stay on the device.
"""

from __future__ import annotations

import time

import numpy as np

from .executor import Slot


def decode_verify_step(engine, emitted: list[int], drafter, split: dict) -> int:
    st, k = engine.state, engine.run_cfg.k
    t0 = time.perf_counter()
    handoff, hidden = _handoff(engine)
    L = st.length
    dec = engine.forward(Slot.PRIMARY, [emitted[-1]])
    st.length = L + 1
    hidden[...] = dec["hidden"][0, 0]
    first = engine.xp.argmax(dec["logits"][0, 0])
    t1 = time.perf_counter()
    drafts = drafter.draft(first, hidden, L, k)
    t2 = time.perf_counter()
    start = st.length
    n, consumed, bonus, ver = engine.verify(first, drafts)
    emitted += consumed + [bonus]  # consumed[0] is the decode's token
    t3 = time.perf_counter()
    _commit(engine, handoff, ver, consumed, start)
    _account(split, t0, t1, t2, t3, time.perf_counter())
    return n


def fused_step(engine, emitted: list[int], drafter, split: dict) -> int:
    st, k = engine.state, engine.run_cfg.k
    t0 = time.perf_counter()
    handoff, hidden = _handoff(engine)
    first, position = emitted[-1], st.length - 1
    hidden[...] = engine.last_hidden
    t1 = time.perf_counter()
    drafts = drafter.draft(first, hidden, position, k)
    t2 = time.perf_counter()
    start = st.length
    n, consumed, bonus, ver = engine.verify(first, drafts)
    emitted += consumed[1:] + [bonus]  # consumed[0] was emitted by the previous step
    engine.last_hidden[...] = ver["hidden"][0, n]  # the next step drafts from the last committed position
    t3 = time.perf_counter()
    _commit(engine, handoff, ver, consumed, start)
    _account(split, t0, t1, t2, t3, time.perf_counter())
    return n


STEPS = {"decode-verify": decode_verify_step, "fused": fused_step}


def _handoff(engine):
    """The step's hidden-state handoff buffer, from the shared pool (given back after the commit)."""
    block = engine.main.acquire("decode-handoff", engine.handoff_bytes)
    return block, block.carve({"hidden": ((engine.desc.hidden_size,), np.float32)})["hidden"]


def _commit(engine, handoff, ver: dict, consumed: list[int], start: int) -> None:
    engine.commit(ver, consumed, start)
    engine.main.release(handoff)
    engine.target.end_step()


def _account(split: dict, t0: float, t1: float, t2: float, t3: float, t4: float) -> None:
    split["decode"] += t1 - t0
    split["draft"] += t2 - t1
    split["verify"] += t3 - t2
    split["commit"] += t4 - t3
