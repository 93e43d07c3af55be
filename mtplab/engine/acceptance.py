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
        """The target's token from one logits row [V]: the prefill's, each greedy decode's."""
        raise NotImplementedError

    def draft_token(self, xp, row):
        """A drafter's token from its own logits row [V]."""
        raise NotImplementedError

    def row_tokens(self, xp, rows):
        """The target's tokens [B] from a batch's logits rows [B, V], row b as a batch-1 run of it chooses (token()
        row by row, unless a rule does better)."""
        return xp.stack([xp.asarray(self.token(xp, row)) for row in rows])

    def draft_rows(self, xp, rows, drawing=None):
        """A drafter's tokens [B] from a batch's logits rows [B, V], row b as draft_token chooses for a batch-1 run;
        drawing: the rows that draft (default all), the others' tokens are placeholders that consume nothing."""
        drawn = range(len(rows)) if drawing is None else set(int(b) for b in drawing)
        return xp.stack([xp.asarray(self.draft_token(xp, row) if b in drawn else row.argmax())
                         for b, row in enumerate(rows)])

    def accept(self, xp, drafts, logits, rows=None):
        """(accepted count: a 0-d device array, an int on the host; the target's tokens t0..tk [k+1]) for drafts [k]
        and the verify's logits [k+1, V]; the bonus token is tokens[count]. With a batch axis first (drafts [B, k],
        logits [B, k+1, V]): counts [B], tokens [B, k+1]; rows: which of the batch's rows they are (default all)."""
        raise NotImplementedError


class GreedyMatch(AcceptanceRule):
    name = "greedy-match"
    summary = "keep the longest prefix of drafts equal to the target's argmax, then the target's argmax (lossless)"
    keeps_longest_match = True

    def token(self, xp, row):
        return row.argmax() if xp is np else xp.argmax(row)  # numpy: the method, without np.argmax's dispatch

    draft_token = token

    def row_tokens(self, xp, rows):
        return rows.argmax(-1) if xp is np else xp.argmax(rows, axis=-1)

    def draft_rows(self, xp, rows, drawing=None):
        return self.row_tokens(xp, rows)

    def accept(self, xp, drafts, logits, rows=None):
        targets = logits.argmax(-1) if xp is np else xp.argmax(logits, axis=-1)
        return accepted_count(xp, drafts, targets), targets


def accepted_count(xp, drafts, targets):
    """Longest prefix where drafts[i] equals targets[i] (leading_run's form); with a batch axis first (drafts
    [B, k], targets [B, k+1]), each row's."""
    return leading_run(xp, drafts == targets[..., : drafts.shape[-1]])


def leading_run(xp, kept):
    """How many of a boolean row's first entries are all true: the drafts kept (per row of a [B, k] array). On the
    device a 0-d array (nothing waits); on the host an int ([B] ints for rows)."""
    if xp is np:
        if kept.ndim > 1:
            if not kept.shape[-1]:  # no drafts (a reference-reading drafter past the reference's end)
                return np.zeros(kept.shape[:-1], dtype=np.int64)
            return np.where(kept.all(-1), kept.shape[-1], kept.argmin(-1))
        if not kept.size:
            return 0
        first = int(kept.argmin())  # the first false entry, in two calls
        return kept.size if kept[first] else first
    return xp.cumprod(kept.astype(np.int32), axis=-1).sum(-1)


def top2_margins_xp(xp, rows):
    """Each row's gap between its largest and second-largest value, [B] float64 on the rows' device (0 on a tie):
    nothing waits for the device."""
    rows = rows.astype(xp.float64)
    top = rows.max(axis=-1)
    is_top = rows == top[..., None]
    second = xp.where(is_top, -xp.inf, rows).max(axis=-1)
    return xp.where(is_top.sum(axis=-1) > 1, 0.0, top - second)


GREEDY_MATCH = ACCEPTANCE.register(GreedyMatch())
