"""The MTP head at batch B: each row's drafts at [B, 1] from its own token, hidden state and position (a row drafting
as many as its own K and drawing for those only), and the head's commit of what each row's verify kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from mtplab.model.description import length_feeds
from mtplab.model.greedy_outputs import TOKENS
from mtplab.runtime.arena import to_numpy
from mtplab.runtime.executor import Slot
from mtplab.runtime.sessions import refused_run
from mtplab.runtime.state import mtp_io


def prefill_head(engine, tokens: np.ndarray, hidden) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fill the head's KV cache for the prompts (tokens [B, P]: each prompt's tokens after its first, then its
    prefill's token; hidden: the prefill's [B, P, H]): entry j pairs token j+1 with the target's hidden j. Eager and
    untimed, counted as "mtp/M=P". Returns each row's logits, hidden state and greedy token at its last entry: a first
    draft from the prompt's end, as a head commit's last kept row is."""
    feeds, outputs, bound = mtp_io(engine.desc, engine.mtp_state, tokens, hidden, np.zeros(engine.batch, np.int64))
    try:
        out = engine.mtp.run_eager(Slot.PRIMARY, feeds, outputs, bound)
    except RuntimeError as err:  # onnxruntime's: the head's graph does not run with the buffers described
        raise refused_run(f"{engine.desc.name}'s MTP head (its prefill)", err) from err
    key = f"mtp/M={tokens.shape[1]}"
    engine.forwards[key] = engine.forwards.get(key, 0) + 1
    io = engine.desc.mtp
    return out[io.logits][:, -1].copy(), out[io.hidden][:, -1].copy(), out[TOKENS][:, -1].copy()


def draft_head(engine, first: np.ndarray, hidden: np.ndarray, position: np.ndarray, k: int,
               lengths: np.ndarray | None = None, stop: Callable | None = None, choose: Callable | None = None
               ) -> np.ndarray:
    """k drafts per row [B, k] from the MTP head at [B, 1]: row b from its token `first[b]` and hidden[b] at
    its own position. lengths: each row's own number of drafts (a draft-length policy's K_b, 0 for a row that has its
    tokens): a row draws nothing past its own (a sampled row's generator stays where a batch-1 run of it is), and
    stop (the policy's, on a row's logits after a draft) lowers it in place where it ends the row's drafting; the
    drafts end where the longest row's do. choose: how the drafts are chosen (the acceptance rule's draft_rows; the
    mixture oracle's head, which runs for its cost, takes the argmax and draws nothing)."""
    desc, io, xp = engine.desc, engine.desc.mtp, engine.xp
    choose = choose or engine.acceptance.draft_rows
    drafts = xp.empty((engine.batch, k), dtype=np.int64)  # on the device: nothing here waits for it
    step = head_step(engine) if xp is np else None
    # every row drafts all k unless its policy said fewer or may stop it early: then each step says which rows draw
    uniform = stop is None and (lengths is None or (lengths == k).all())
    token, h, logits_name, hidden_name = first, hidden, io.logits, io.hidden
    at, done = position.copy(), 0  # each row's position at this step
    try:
        for i in range(k):
            if step is not None:  # host tokens: the step's feeds rewritten in place, replayed
                step.ids[:, 0] = token
                step.hidden[:, 0] = h
                length_feeds(io, at, 1, desc.capacity, step.feeds)
                out = step.run()
            else:
                out = engine.mtp.run(Slot.PRIMARY, *mtp_io(desc, engine.mtp_state, token[:, None], h[:, None], at))
            at += 1
            done += 1
            logits = out[logits_name][:, 0]
            drawing = None if uniform else np.flatnonzero(lengths > i)
            drafts[:, i] = choose(xp, logits, out[TOKENS][:, 0], drawing)
            token, h = drafts[:, i], out[hidden_name][:, 0]
            if not uniform and (ended := _stopped(lengths, drawing, logits, i + 1, stop)):
                return drafts[:, :ended]
    finally:  # counted once, and kept true when a step raises
        engine.forwards["mtp/M=1"] = engine.forwards.get("mtp/M=1", 0) + done
    return drafts


class HeadStep(NamedTuple):
    """A head forward of M tokens per row as the host runs it: mtp_io's feeds (its hidden state in an array of its
    own), their token ids, and the head's replayer on them (it decides as Executor.run does)."""

    feeds: dict
    ids: np.ndarray
    hidden: np.ndarray
    run: Callable[[], dict]
    kv: tuple
    executor: object


def head_step(engine, M: int = 1) -> HeadStep:
    """The engine's prepared head forward of M tokens per row: a draft step (M=1, the head's Primary slot) or a commit
    (M > 1, its Verify slot); made again when the head's KV buffers or executor change."""
    key = f"head step {M}"
    step = engine.drafter_memory.get(key)
    fixed = engine.mtp_state.io_cache.get(M)
    if step is None or fixed is None or step.kv is not engine.mtp_state.kv or step.executor is not engine.mtp or (
            step.feeds is not fixed.feeds):
        desc, B = engine.desc, engine.batch
        feeds, outputs, bound = mtp_io(desc, engine.mtp_state, np.zeros((B, M), np.int64),
                                       np.zeros((B, M, desc.hidden_size), np.float32), np.zeros(B, np.int64))
        hidden = feeds[desc.mtp.hidden_input] = np.zeros((B, M, desc.hidden_size), desc.target.hidden_type)
        slot = Slot.PRIMARY if M == 1 else Slot.VERIFY
        step = engine.drafter_memory[key] = HeadStep(
            feeds, feeds[desc.mtp.input_ids], hidden, engine.mtp.replayer(slot, feeds, outputs, bound),
            engine.mtp_state.kv, engine.mtp)
    step.feeds[engine.desc.mtp.hidden_input] = step.hidden  # mtp_io's other callers put an array of theirs there
    return step


def _stopped(lengths: np.ndarray, drawing: np.ndarray, logits, made: int, stop: Callable | None) -> int:
    """After `made` drafts: rows whose policy stops here have their lengths lowered to it; the drafts made when no
    row wants more (0 while some row does)."""
    if stop is not None:
        for b in drawing:
            if lengths[b] > made and stop(to_numpy(logits[b])):  # the policy reads the row on the host
                lengths[b] = made
    return made if lengths.max(initial=0) <= made else 0


def draft_from_rows(engine, ready: tuple[np.ndarray, np.ndarray, np.ndarray], position: np.ndarray, k: int,
                    lengths: np.ndarray | None = None, stop: Callable | None = None, choose: Callable | None = None
                    ) -> np.ndarray:
    """The drafts [B, k] of a step whose first head step the last head commit ran (the fused schedule): `ready`
    holds each row's logits, hidden state and greedy token there; the first draft from them, the rest chained
    (lengths and stop and choose as draft_head's)."""
    logits, hidden, greedy = ready
    choose = choose or engine.acceptance.draft_rows
    drafts = engine.xp.empty((engine.batch, k), dtype=np.int64)
    drawing = None if lengths is None else np.flatnonzero(lengths > 0)
    drafts[:, 0] = choose(engine.xp, logits, greedy, drawing)
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


def commit_head(engine, targets: np.ndarray, counts: np.ndarray, hidden, start: np.ndarray):
    """The head's KV rows start.. for what each row's verify kept, one [B, M] forward on the head's Verify slot:
    row b's kept tokens are its targets up to counts[b] (the accepted drafts, then the bonus), padded with the
    bonus (rows past the kept ones lie beyond the committed length). Returns each row's (logits, hidden, greedy
    token) at its last kept row: the next step's first head step where it starts there (fused). targets, counts: on
    the host."""
    io, B, M = engine.desc.mtp, engine.batch, hidden.shape[1]  # M: the verify's (a padded one's k_max + 1)
    rows = np.arange(B)
    bonus = targets[rows, counts]
    if M > targets.shape[1]:  # a padded verify's rows beyond the judged ones: the bonus, as past the kept ones
        targets = np.pad(targets, ((0, 0), (0, M - targets.shape[1])), mode="edge")
    kept = np.where(np.arange(M) <= counts[:, None], targets, bonus[:, None])
    step = head_step(engine, M) if engine.xp is np else None
    if step is not None:  # the commit's feeds at this M rewritten in place, replayed
        step.ids[...] = kept
        step.hidden[...] = hidden
        length_feeds(io, start, M, engine.desc.capacity, step.feeds)
        out = step.run()
    else:
        out = engine.mtp.run(Slot.VERIFY, *mtp_io(engine.desc, engine.mtp_state, kept, hidden, start))
    key = f"mtp-commit/M={M}"
    engine.forwards[key] = engine.forwards.get(key, 0) + 1
    return out[io.logits][rows, counts].copy(), out[io.hidden][rows, counts].copy(), out[TOKENS][rows, counts].copy()
