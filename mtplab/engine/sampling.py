"""Sampling at temperature > 0, and speculative rejection sampling, lossless in distribution.

One transform turns logits into probabilities, the same for the target's rows and the drafter's:
temperature, then top-k (the k largest, ties kept), then top-p (the fewest largest whose mass
reaches p, ties at the edge kept). Rejection sampling (Leviathan et al. 2023, Chen et al. 2023):
the head drafts x ~ q; draft i is kept with probability min(1, p_i(x) / q_i(x)); at the first
rejection the token comes from norm(max(0, p_i - q_i)); when every draft passes, a bonus token from
p_k. The emitted tokens then have the target's distribution exactly (`step_distribution` computes
it; tests/test_sampling.py holds it to p and checks the whole loop statistically).

Random numbers are drawn where the logits are (numpy on the CPU, CuPy on CUDA) from one generator
per generation, seeded by the run's `sample_seed`: the same seed gives the same tokens on the same
build, and a paired round's greedy and speculative runs start from the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mtplab.base.arrays import to_numpy
from mtplab.engine.acceptance import AcceptanceRule
from mtplab.engine.strategies import ACCEPTANCE

KEPT_DRAFT_ROWS = 64  # the drafter's distributions kept for the next verify (a run's k is at most this)
FIELDS = ("temperature", "top_k", "top_p", "sample_seed")  # the RunConfig fields that shape sampling


def settings(run) -> dict:
    """A run's sampling fields by name (what a sampled point's identity records)."""
    return {f: getattr(run, f) for f in FIELDS}


def settings_text(values: dict) -> str:
    """Sampling fields in words: "temperature 0.7, top_k 0, top_p 1.0, sample_seed 0"."""
    return ", ".join(f"{k} {v}" for k, v in values.items())


@dataclass(frozen=True)
class Sampling:
    """The logits transform: temperature > 0, top_k (0: off), top_p (1: off)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0

    def probs(self, xp, logits):
        """Probabilities (float64) of logits [..., V], one distribution per row."""
        z = logits.astype(np.float64)
        with np.errstate(over="ignore"):  # the largest at 0 first: a tiny temperature sends the others to -inf,
            z = (z - z.max(axis=-1, keepdims=True)) / self.temperature  # never the largest to inf (inf - inf: NaN)
        if self.top_k and self.top_k < z.shape[-1]:
            kth = xp.sort(z, axis=-1)[..., -self.top_k, None]  # the k-th largest, per row
            z = xp.where(z >= kth, z, -xp.inf)
        z = z - z.max(axis=-1, keepdims=True)
        p = xp.exp(z)
        p /= p.sum(axis=-1, keepdims=True)
        if self.top_p < 1.0:
            s = -xp.sort(-p, axis=-1)  # descending
            before = xp.cumsum(s, axis=-1) - s  # the mass of the larger ones
            last = (before < self.top_p).sum(axis=-1, keepdims=True) - 1  # the smallest kept, by rank
            edge = xp.take_along_axis(s, last, axis=-1)
            p = xp.where(p >= edge, p, 0.0)
            p /= p.sum(axis=-1, keepdims=True)
        return p


def draw(xp, p, u):
    """The token of probability row p [V] at uniform u in [0, 1) (inverse CDF; zero-mass tokens never come out)."""
    c = xp.cumsum(p)
    return xp.minimum(xp.searchsorted(c, u * c[-1], side="right"), p.shape[-1] - 1)


def keep_probability(xp, p_x, q_x):
    """Rejection sampling's chance to keep a draft of target probability p_x and draft probability q_x."""
    return xp.minimum(1.0, p_x / q_x)


def residual(xp, p, q):
    """Where a rejected position's token comes from: norm(max(0, p - q)) per row ([.., V])."""
    r = xp.maximum(p - q, 0.0)
    total = r.sum(axis=-1, keepdims=True)
    return xp.where(total > 0, r / xp.where(total > 0, total, 1.0), p)  # p where q covers it (never rejected)


def bonus(xp, p, q):
    """Where the bonus token comes from when all k drafts pass: the target's row after them, p_k ([1, V])."""
    return p[-1:]


def step_distribution(p, q) -> np.ndarray:
    """The exact distribution of the token one accept-or-resample step emits at a position with target
    distribution p and draft distribution q (numpy, no sampling): what `SampledRun.accept` does, summed
    over the draft x ~ q."""
    keep = np.where(q > 0, keep_probability(np, p, np.where(q > 0, q, 1.0)), 0.0)
    return q * keep + (1.0 - float((q * keep).sum())) * residual(np, p, q)


class RejectionSampling(AcceptanceRule):
    name = "rejection-sampling"
    summary = ("draft x ~ q, keep it with probability min(1, p(x)/q(x)), resample the first rejection from "
               "norm(max(0, p - q)), a bonus token from p (lossless in distribution; temperature > 0)")
    samples = True

    def for_run(self, run, xp) -> SampledRun:
        return SampledRun(Sampling(run.temperature, run.top_k, run.top_p), run.sample_seed, xp, run.batch)


class SampledRun(AcceptanceRule):
    """Rejection sampling bound to one run: its transform, and per row of a batch its generator and the drafts'
    distributions. Row b draws from a generator of its own seeded sample_seed + b, in the order a batch-1 run of the
    row draws (its token, its drafts, its verify's k + 1 uniforms), so its tokens are those of the batch-1 run at
    sample_seed + b, whatever the other rows do."""

    name = RejectionSampling.name
    summary = RejectionSampling.summary
    samples = True

    def __init__(self, sampling: Sampling, seed: int, xp, rows: int = 1):
        self.sampling, self.seed, self.xp, self.rows = sampling, seed, xp, rows
        self.draft_sampling = sampling  # the drafter's rows go through the same transform
        self.expected = None  # per-position sums of min(p, q) and judged counts, while tracked (see track)
        self.new_generation()

    def new_generation(self) -> None:
        self.rngs = [self.xp.random.default_rng(self.seed + b) for b in range(self.rows)]
        self.qs: list[list] = [[] for _ in range(self.rows)]

    @property
    def rng(self):
        """Row 0's generator (a batch-1 run's only one)."""
        return self.rngs[0]

    @rng.setter
    def rng(self, value) -> None:
        self.rngs[0] = value

    @property
    def q(self) -> list:
        """Row 0's drafts' distributions not judged yet."""
        return self.qs[0]

    def token(self, xp, row):
        return draw(xp, self.sampling.probs(xp, row), self.rng.random())

    def row_tokens(self, xp, rows, greedy):
        p = self.sampling.probs(xp, rows)
        return xp.stack([draw(xp, p[b], self.rngs[b].random()) for b in range(p.shape[0])])

    def draft_token(self, xp, row):
        return self.draft_from(xp, self.draft_sampling.probs(xp, row))

    def draft_rows(self, xp, rows, greedy, drawing=None):
        q = self.draft_sampling.probs(xp, rows)
        drawn = range(q.shape[0]) if drawing is None else drawing
        out = greedy.copy() if drawing is not None else xp.empty(q.shape[0], dtype=np.int64)
        for b in drawn:
            out[b] = self.draft_from(xp, q[b], int(b))
        return out

    def draft_from(self, xp, q, row: int = 0):
        """A draft drawn from the distribution q [V] by a row's generator (kept for the verify that judges it)."""
        kept = self.qs[row]
        kept.append(q)
        if len(kept) > KEPT_DRAFT_ROWS:  # drafts no verify judged (a calibration's timed head steps)
            del kept[0]
        return draw(xp, q, self.rngs[row].random())

    def track(self, k: int) -> None:
        """From now on, sum each judged draft's expected acceptance, sum(min(p, q)), per draft position (device
        arrays; the checked pass tracks, timed runs do not pay for it)."""
        self.expected = {"sum": self.xp.zeros(k), "judged": self.xp.zeros(k)}

    def tracked(self) -> dict | None:
        """Since `track`, per draft position: "judged" (drafts a verify judged) and "expected" (their mean
        sum(min(p, q)), None where none was judged); tracking stops."""
        if self.expected is None:
            return None
        total, judged = (to_numpy(a) for a in self.expected.values())
        self.expected = None
        return {"judged": [int(j) for j in judged], "expected": [float(s / j) if j else None for s, j in zip(total, judged)]}

    def accept(self, xp, drafts, logits, greedy, kept, rows=None):
        if drafts.ndim == 1:
            return self._accept(xp, drafts, logits, 0)
        rows = range(drafts.shape[0]) if rows is None else rows
        judged = [self._accept(xp, drafts[i], logits[i], int(b)) for i, b in enumerate(rows)]
        return np.array([int(n) for n, _ in judged]), xp.stack([t for _, t in judged])

    def _accept(self, xp, drafts, logits, row: int):
        """One row's verdict: drafts [k], the verify's logits [k+1, V]."""
        k, kept = int(drafts.shape[0]), self.qs[row]
        if len(kept) < k:
            raise ValueError(f"rejection sampling needs the drafter's distributions: {k} drafts, {len(kept)} "
                             "distributions (the drafter must draft with the rule's draft_token)")
        p = self.sampling.probs(xp, logits)  # [k+1, V]
        q = xp.stack(kept[-k:])
        kept.clear()
        rows = xp.arange(k)
        u = self.rngs[row].random(k + 1)
        accepted = u[:k] < keep_probability(xp, p[rows, drafts], q[rows, drafts])
        n = leading_run(xp, accepted)
        if self.expected is not None:  # a draft is judged up to and including the first rejection
            judged = rows <= n
            self.expected["sum"][:k] += xp.where(judged, xp.minimum(p[:k], q).sum(axis=-1), 0.0)
            self.expected["judged"][:k] += judged
        # row n: the residual of the first rejected position, or p_k when every draft passed (the bonus)
        source = xp.concatenate([residual(xp, p[:k], q), bonus(xp, p, q)])[n]
        targets = xp.concatenate([drafts, drafts[:1]])
        targets[n] = draw(xp, source, u[k])
        return n, targets


def leading_run(xp, accepted):
    """How many of a boolean row's first entries are all true: the drafts kept. On the device a 0-d array (nothing
    waits); on the host an int."""
    if xp is np:
        if not accepted.size:
            return 0
        first = int(accepted.argmin())  # the first false entry, in two calls
        return accepted.size if accepted[first] else first
    return xp.cumprod(accepted.astype(np.int32), axis=-1).sum(-1)


REJECTION_SAMPLING = ACCEPTANCE.register(RejectionSampling())
