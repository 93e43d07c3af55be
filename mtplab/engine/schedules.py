"""Step schedules: one speculative step each (draft, verify, accept, commit), on the Engine's public methods.

decode-verify (the seed's): decode the pending token at M=1 on Slot.PRIMARY, draft from that
decode's hidden state, verify [g, d1..dk]. fused (vLLM, SGLang): no decode; drafts start from the
pending token and the hidden state of the last committed position, and the verify [pending,
d1..dk] yields the next step's hidden state.

A step appends what it emits to `emitted`, adds its phase times to `phases` and returns the number
of drafts accepted. Until the verify's one host read, tokens stay on the device.
A schedule is an object in `mtplab.engine.strategies.SCHEDULES`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from mtplab.engine.strategies import SCHEDULES

PHASES = ("decode", "draft", "verify", "commit")


class Phases:
    """Seconds per phase of a run's steps, lap by lap, on the host's clock. On a device whose runs return once
    queued (CUDA) a lap ends when its phase's work is queued: the device time of the decode and the drafts lands in
    the phase that waits for it, the verify's read (its lap then holds the step's device time)."""

    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._t = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        t = time.perf_counter()
        self.seconds[phase] += t - self._t
        self._t = t


def decode_verify_step(engine, emitted: list[int], drafter, phases: Phases) -> int:
    phases.start()
    hidden = engine.begin_step()
    first = engine.decode(emitted[-1], hidden)  # the decode's token, on the device; its hidden state in `hidden`
    phases.lap("decode")
    drafts = drafter.draft(first, hidden, engine.length - 1, engine.k)
    phases.lap("draft")
    n, consumed, bonus, ver = engine.verify(first, drafts)
    emitted += consumed + [bonus]  # consumed[0] is the decode's token
    phases.lap("verify")
    engine.commit(ver, consumed)
    engine.end_step()
    phases.lap("commit")
    return n


def fused_step(engine, emitted: list[int], drafter, phases: Phases) -> int:
    phases.start()
    hidden = engine.begin_step(engine.last_hidden)  # the hidden state of the last committed position
    first = emitted[-1]
    phases.lap("decode")
    drafts = drafter.draft(first, hidden, engine.length - 1, engine.k)
    phases.lap("draft")
    n, consumed, bonus, ver = engine.verify(first, drafts)
    emitted += consumed[1:] + [bonus]  # consumed[0] was emitted by the previous step
    engine.keep_hidden(ver, n)  # the next step drafts from the last committed position
    phases.lap("verify")
    engine.commit(ver, consumed)
    engine.end_step()
    phases.lap("commit")
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


DECODE_VERIFY = SCHEDULES.register(Schedule("decode-verify", "decode at M=1, draft from it, verify [g, d1..dk]", 1,
                                            decode_verify_step))
FUSED = SCHEDULES.register(Schedule("fused", "no decode: draft from the pending token, verify [pending, d1..dk]", 0,
                                    fused_step))
