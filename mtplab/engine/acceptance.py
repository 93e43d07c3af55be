"""Acceptance rules: which drafts a verify keeps, and how the target's and a drafter's tokens are chosen.

The built-in rule, greedy-match, is exact greedy decoding: the target's token is its argmax, a
draft is kept while it equals the target's argmax at its position, and the verdict is token
identity with greedy decoding. A rule is an object in `mtplab.engine.strategies.ACCEPTANCE`.
"""

from __future__ import annotations

import numpy as np

from mtplab.engine.strategies import ACCEPTANCE


class AcceptanceRule:
    """name: the RunConfig `acceptance` value; summary: what it keeps, one line.

    Every method takes the array module (numpy or CuPy) and device arrays, and returns device arrays:
    nothing here waits for the device (the verify reads its result once).
    """

    name: str = ""
    summary: str = ""
    samples: bool = False  # draws at temperature > 0 (its verdict is the target's distribution, not greedy's tokens)
    keeps_longest_match: bool = False  # keeps every draft up to the first that differs from the target's argmax

    def for_run(self, run, xp) -> AcceptanceRule:
        """The rule as one run uses it (a sampling rule binds its transform and generator; greedy-match is itself)."""
        return self

    def new_generation(self) -> None:
        """A new generation starts (a sampling rule reseeds its generator)."""

    def track(self, k: int) -> None:
        """Start summing the expected acceptance of judged drafts (a sampling rule; see `tracked`)."""

    def tracked(self) -> dict | None:
        """Judged drafts and their mean expected acceptance per draft position since `track`, and tracking stops
        (None: not defined)."""
        return None

    def token(self, xp, row):
        """The target's token from one logits row [V] (a rule that chooses row by row; greedy-match chooses in the
        graph)."""
        raise NotImplementedError

    def draft_token(self, xp, row):
        """A drafter's token from its own logits row [V] (as token())."""
        raise NotImplementedError

    def row_tokens(self, xp, rows, greedy):
        """The target's tokens [B] from a batch's logits rows [B, V], row b as a batch-1 run of it chooses (token()
        row by row, unless a rule does better); greedy [B]: the graph's argmax of each row (greedy_outputs)."""
        return xp.stack([xp.asarray(self.token(xp, row)) for row in rows])

    def draft_rows(self, xp, rows, greedy, drawing=None):
        """A drafter's tokens [B] from a batch's logits rows [B, V] (greedy: the head graph's argmax of each), row b
        as draft_token chooses for a batch-1 run; drawing: the rows that draft (default all), the others take their
        argmax as a placeholder that consumes nothing."""
        drawn = range(len(rows)) if drawing is None else set(int(b) for b in drawing)
        return xp.stack([xp.asarray(self.draft_token(xp, row) if b in drawn else greedy[b])
                         for b, row in enumerate(rows)])

    def accept(self, xp, drafts, logits, greedy, kept, rows=None):
        """(accepted count: a 0-d device array, an int on the host; the target's tokens t0..tk [k+1]) for drafts [k]
        and the verify's logits [k+1, V]; the bonus token is tokens[count]. greedy [k+1], kept: the graph's argmax
        and how many leading drafts equal it (greedy_outputs). With a batch axis first (drafts [B, k], logits
        [B, k+1, V], greedy [B, k+1], kept [B]): counts [B], tokens [B, k+1]; rows: which of the batch's rows they
        are (default all)."""
        raise NotImplementedError


class GreedyMatch(AcceptanceRule):
    """Greedy decoding: the graph's own choice (its ArgMax, and its count of the drafts equal to it), taken as it is:
    the host computes nothing."""

    name = "greedy-match"
    summary = "keep the longest prefix of drafts equal to the target's argmax, then the target's argmax (lossless)"
    keeps_longest_match = True

    def token(self, xp, row):  # a logits row from outside mtplab's graphs (a drafter of the user's own)
        return row.argmax() if xp is np else xp.argmax(row)

    draft_token = token

    def row_tokens(self, xp, rows, greedy):
        return greedy

    def draft_rows(self, xp, rows, greedy, drawing=None):
        return greedy

    def accept(self, xp, drafts, logits, greedy, kept, rows=None):
        return kept, greedy


def top2_margins_xp(xp, rows):
    """Each row's gap between its largest and second-largest value, [B] float64 on the rows' device (0 on a tie):
    nothing waits for the device."""
    rows = rows.astype(xp.float64)
    top = rows.max(axis=-1)
    is_top = rows == top[..., None]
    second = xp.where(is_top, -xp.inf, rows).max(axis=-1)
    return xp.where(is_top.sum(axis=-1) > 1, 0.0, top - second)


GREEDY_MATCH = ACCEPTANCE.register(GreedyMatch())
