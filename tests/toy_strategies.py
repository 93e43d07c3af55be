"""Strategies of a user's own, written against mtplab's public classes and registered as a plugin.

Importing this module registers them (MTPLAB_PLUGINS=toy_strategies makes every process import it):
- commit "readvance-eager": restore, then re-advance each accepted token with an eager M=1 forward (outside the
  Primary slot's plan: the reference's own kernels, so bitwise);
- drafter "copy-reference": drafts the greedy reference's next k tokens (perfect drafts, no head);
- acceptance rule "first-only": greedy match, but at most the first draft is kept.
"""

from __future__ import annotations

import numpy as np

from mtplab.engine.acceptance import AcceptanceRule
from mtplab.engine.commits import CommitStrategy
from mtplab.engine.drafters import DrafterKind
from mtplab.engine.strategies import ACCEPTANCE, COMMITS, DRAFTERS
from mtplab.runtime.executor import Slot


class ReadvanceEager(CommitStrategy):
    name = "readvance-eager"
    summary = "restore the state, re-advance the accepted tokens one eager M=1 forward each"
    bitwise = True
    why = "advances one token at a time with the reference's kernels"

    def prepare(self, engine):
        def commit(ver, consumed, start):
            engine.restore_state()
            for j, tok in enumerate(consumed):
                engine.state.length = start + j
                engine.forward(Slot.PRIMARY, [tok], eager=True)

        return commit

    def forwards(self, accepted):
        return {"primary/M=1": sum(a + 1 for a in accepted)} if accepted else {}


class CopyReference:
    def __init__(self, reference, xp):
        self.reference, self.xp, self.offset = reference, xp, 0

    def prefill(self, tokens, hidden):
        self.offset = len(tokens)  # position p's next token is reference[p - offset + 1]

    def draft(self, first, hidden, position, k):
        index = position - self.offset + 1
        ahead = self.reference[index + 1 : index + 1 + k]
        return self.xp.asarray(np.asarray(ahead + [0] * (k - len(ahead)), dtype=np.int64))


class CopyReferenceKind(DrafterKind):
    name = "copy-reference"
    summary = "the greedy reference's next k tokens"
    needs_reference = True

    def build(self, engine, reference):
        return CopyReference(reference, engine.xp)


class FirstOnly(AcceptanceRule):
    name = "first-only"
    summary = "greedy match, keeping at most the first draft"

    def row_tokens(self, xp, rows, greedy):
        return greedy

    def draft_rows(self, xp, rows, greedy, drawing=None):
        return greedy

    def accept(self, xp, drafts, logits, greedy, kept):  # one sequence: refused at batch > 1
        return xp.minimum(kept, 1), greedy


TOYS = (COMMITS.register(ReadvanceEager()), DRAFTERS.register(CopyReferenceKind()), ACCEPTANCE.register(FirstOnly()))


def unregister() -> None:
    COMMITS.unregister("readvance-eager")
    DRAFTERS.unregister("copy-reference")
    ACCEPTANCE.unregister("first-only")
