"""The oracle at temperature > 0: drafts from a mixture of the target's own distribution and a fixed distractor.

Each draft comes from q = alpha * p + (1 - alpha) * [d], where p is the target's next-token distribution
(the run's transform: temperature, then top-k, then top-p) after the context the draft extends, and [d]
puts all its mass on one fixed token d (chosen by the run's seed). Rejection sampling keeps such a
draft with probability sum(min(p, q)) = alpha + (1 - alpha) * p(d): alpha is the knob, and p(d) (small;
0 where top-k or top-p cut d) is what the distractor adds. The checked pass reports the expected
acceptance computed on the verify's own rows beside the measured one (`SampledRun.track`).

The target's rows come from a plain stepper on the target graph (`TargetRows`), remembered by context
on the engine: the checked pass computes them, and the timed rounds, which follow the checked run token
for token (the same sampling seed; the audit holds their tokens to the checked run's), look them up.
What a timed run pays for drafting is then the MTP head's k steps, run as the greedy oracle runs them
(unless oracle_free_drafts), plus the k draws and a host read of each (the next row is looked up by the
drafted token: on CUDA, k small device reads a step that the head's own drafting does not make).
Performance studies only, like the greedy oracle.
"""

from __future__ import annotations

import hashlib

import numpy as np

from mtplab.model.stepper import Stepper


def distractor_token(seed: int, vocab: int) -> int:
    """The fixed token the mixture puts its other mass on, for a run's seed."""
    digest = hashlib.sha256(f"distractor:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % vocab


class TargetRows:
    """The target's next-token logits after any context, from a plain stepper, remembered by context.

    Marks keep the stepper's state at lengths it has passed (references to its arrays: a forward replaces
    them and never writes into them), so a draft on another branch of the same prefix rewinds there
    instead of starting over. Rows and marks of another prompt are forgotten when a generation starts.
    """

    def __init__(self, desc, xp=np):
        self.stepper, self.xp = Stepper(desc), xp
        self.prompt: tuple[int, ...] = ()
        self.rows: dict[tuple[int, ...], object] = {}  # a context's next-token logits, on the run's device
        self.forwards = 0  # stepper forwards run (a timed run that follows its checked run adds none)
        self._restart()

    def _restart(self) -> None:
        self.stepper.reset()
        self.fed: list[int] = []
        self.marks = {0: (dict(self.stepper.kv), dict(self.stepper.states))}

    def start(self, prompt: list[int]) -> None:
        """A generation after `prompt` starts."""
        if tuple(prompt) != self.prompt:
            self.prompt, self.rows = tuple(prompt), {}
            self._restart()

    def row(self, context: tuple[int, ...], keep_from: int):
        """Logits [V] of the token after `context`; marks below `keep_from` (the committed length) are dropped."""
        got = self.rows.get(context)
        if got is None:  # marks grow only here: they are pruned here too, never on a timed run's lookups
            self._advance(context)
            floor = max((m for m in self.marks if m <= keep_from), default=0)  # the committed prefix stays above it
            for m in [m for m in self.marks if m < floor]:
                del self.marks[m]
            got = self.rows[context]
        return got

    def _advance(self, context: tuple[int, ...]) -> None:
        same = 0
        limit = min(len(self.fed), len(context) - 1)  # the last token is fed again to get its row
        while same < limit and self.fed[same] == context[same]:
            same += 1
        back = max((m for m in self.marks if m <= same), default=None)
        if back is None:  # the stepper is past this context everywhere (a run again from the start): start over
            self._restart()
            back = 0
        for m in [m for m in self.marks if m > back]:
            del self.marks[m]
        kv, states = self.marks[back]
        s = self.stepper
        s.kv, s.states, s.length = dict(kv), dict(states), back
        del self.fed[back:]
        new = list(context[back:])
        logits = s.forward(new)["logits"]
        self.forwards += 1
        self.fed += new
        self.marks[len(self.fed)] = (dict(s.kv), dict(s.states))
        # only the last row is ever looked up (a draft extends the context by one); a copy, so [M, V] is freed
        self.rows[context] = self.xp.asarray(np.array(logits[-1]))


def mixture_drafts(rule, rows: TargetRows, alpha: float, distractor: int, context: list[int], committed: int, k: int,
                   row: int = 0) -> list[int]:
    """k drafts after `context` (its first `committed` tokens committed), each from alpha * p + (1 - alpha) *
    [distractor] after the drafts before it, drawn by the rule's generator of batch row `row`."""
    context, drafts, xp = list(context), [], rows.xp
    for _ in range(k):
        p = rule.sampling.probs(xp, rows.row(tuple(context), committed))
        q = alpha * p
        q[distractor] += 1.0 - alpha
        token = int(rule.draft_from(xp, q, row) if row else rule.draft_from(xp, q))  # row 0: a batch-1 run's call
        drafts.append(token)
        context.append(token)
    return drafts


def row_target_rows(engine, row: int) -> TargetRows:
    """Batch row `row`'s TargetRows, kept by the engine between its runs (row 0's is a batch-1 run's)."""
    key = "target rows" if row == 0 else f"target rows {row}"
    rows = engine.drafter_memory.get(key)
    if rows is None:
        rows = engine.drafter_memory[key] = TargetRows(engine.desc, engine.xp)
    return rows
