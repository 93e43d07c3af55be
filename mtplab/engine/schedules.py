"""Step schedules: how a speculative step begins (mtplab.engine.speculative runs every step of either).

decode-verify (the seed's): decode the pending token at M=1 on Slot.PRIMARY, draft from that
decode's hidden state, verify [g, d1..dk]. fused (vLLM, SGLang): no decode; drafts start from the
pending token and the hidden state of the last committed position, and the verify [pending,
d1..dk] yields the next step's hidden state.

A step drafts as many tokens as each row's draft-length policy says (k for the fixed policy,
mtplab.engine.k_policies). Its commit is the drafter's (the head's KV rows for the emitted tokens and the verify's
hidden states) and the target's (the recurrent state), the drafter's first: a re-advance may reuse the verify's
buffers. A schedule is an object in `mtplab.engine.strategies.SCHEDULES`.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Schedule:
    """name: the RunConfig `schedule` value; decodes: M=1 decodes per step before its drafts (each makes one
    guaranteed token; mtplab.engine.speculative runs 1 or 0)."""

    name: str
    summary: str
    decodes: int

    @property
    def extra_tokens(self) -> int:
        """Tokens a step makes beyond its accepted drafts: its decodes' and the bonus token."""
        return self.decodes + 1

    def head_steps(self, k: int) -> int:
        """M=1 head steps a step with k drafts makes: k - 1 chained from the last head commit's row, and one more
        where a decode comes first (its first draft is the step's own)."""
        return k - 1 + self.decodes


DECODE_VERIFY = SCHEDULES.register(Schedule("decode-verify", "decode at M=1, draft from it, verify [g, d1..dk]", 1))
FUSED = SCHEDULES.register(Schedule("fused", "no decode: draft from the pending token, verify [pending, d1..dk]", 0))
