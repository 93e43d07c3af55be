"""Step schedules: one speculative step each (draft, verify, accept, commit), on the Engine's public methods.

decode-verify (the seed's): decode the pending token at M=1 on Slot.PRIMARY, draft from that
decode's hidden state, verify [g, d1..dk]. fused (vLLM, SGLang): no decode; drafts start from the
pending token and the hidden state of the last committed position, and the verify [pending,
d1..dk] yields the next step's hidden state.

A step drafts as many tokens as the run's draft-length policy says (engine.k_chooser: k for the fixed policy,
mtplab.engine.k_policies), appends what it emits to `emitted`, its stamps to `phases` and returns the number of
drafts accepted. Its commit is the drafter's (the head's KV rows for the emitted tokens and the verify's hidden states)
and the target's (the recurrent state), the drafter's first: a re-advance may reuse the verify's buffers. Until the verify's one host read, tokens stay on the device.
A schedule is an object in `mtplab.engine.strategies.SCHEDULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter as clock

import numpy as np

from mtplab.engine.strategies import SCHEDULES

PHASES = ("decode", "draft", "verify", "commit")


class Phases(list):
    """A run's steps on the host's clock: each step appends its six stamps (its start, and the end of its decode,
    draft, verify, drafter's commit and commit; a list append, the least a step can do), and `seconds` sums each
    phase over them. The drafter's commit (the MTP head's KV rows for what the verify kept) is draft work, priced
    there by the calibration: it counts in the draft phase. On a device whose runs return once queued (CUDA) a phase
    ends when its work is queued: the device time of the decode and the drafts lands in the phase that waits for it,
    the verify's read (its span then holds the step's device time)."""

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per phase over the steps so far."""
        spans = np.diff(np.asarray(self, dtype=np.float64).reshape(-1, len(PHASES) + 2), axis=1).sum(axis=0)
        decode, draft, verify, drafter_commit, commit = map(float, spans)
        return {"decode": decode, "draft": draft + drafter_commit, "verify": verify, "commit": commit}


def commit_drafts(drafter, ver: dict, tokens: list[int], start: int) -> None:
    """The drafter's commit of what the verify kept (`tokens` at start + 1.., the verify's hidden rows from start),
    where it has one: a drafter with no cache of its own leaves commit out."""
    commit = getattr(drafter, "commit", None)
    if commit is not None:
        commit(ver["hidden"][0], tokens, start)


def decode_verify_step(engine, emitted: list[int], drafter, phases: Phases) -> int:
    t0 = clock()
    hidden = engine.begin_step()
    first = engine.decode(emitted[-1], hidden)  # the decode's token, on the device; its hidden state in `hidden`
    t1 = clock()
    drafts = drafter.draft(first, hidden, engine.state.length - 1, engine.k_chooser.next_k())
    t2 = clock()
    n, consumed, bonus, ver = engine.verify(first, drafts)
    emitted += consumed + [bonus]  # consumed[0] is the decode's token
    t3 = clock()
    commit_drafts(drafter, ver, consumed[1:] + [bonus], engine.state.length)  # before a re-advance reuses ver
    t4 = clock()
    engine.commit(ver, consumed)
    engine.end_step()
    phases.append((t0, t1, t2, t3, t4, clock()))
    return n


def fused_step(engine, emitted: list[int], drafter, phases: Phases) -> int:
    t0 = clock()
    hidden = engine.begin_step(engine.last_hidden)  # the hidden state of the last committed position
    first = emitted[-1]
    t1 = clock()
    drafts = drafter.draft(first, hidden, engine.state.length - 1, engine.k_chooser.next_k())
    t2 = clock()
    n, consumed, bonus, ver = engine.verify(first, drafts)
    emitted += consumed[1:] + [bonus]  # consumed[0] was emitted by the previous step
    engine.keep_hidden(ver, n)  # the next step drafts from the last committed position
    t3 = clock()
    commit_drafts(drafter, ver, consumed[1:] + [bonus], engine.state.length)
    t4 = clock()
    engine.commit(ver, consumed)
    engine.end_step()
    phases.append((t0, t1, t2, t3, t4, clock()))
    return n


@dataclass(frozen=True)
class Schedule:
    """name: the RunConfig `schedule` value; decodes: M=1 decodes per step (each makes one guaranteed token);
    step: the step function."""

    name: str
    summary: str
    decodes: int
    step: Callable[..., int]

    @property
    def extra_tokens(self) -> int:
        """Tokens a step makes beyond its accepted drafts: its decodes' and the bonus token."""
        return self.decodes + 1

    def head_steps(self, k: int) -> int:
        """M=1 head steps a step with k drafts makes: k - 1 chained from the last head commit's row, and one more
        where a decode comes first (its first draft is the step's own)."""
        return k - 1 + self.decodes


DECODE_VERIFY = SCHEDULES.register(Schedule("decode-verify", "decode at M=1, draft from it, verify [g, d1..dk]", 1,
                                            decode_verify_step))
FUSED = SCHEDULES.register(Schedule("fused", "no decode: draft from the pending token, verify [pending, d1..dk]", 0,
                                    fused_step))
