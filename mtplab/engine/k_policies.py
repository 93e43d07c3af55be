"""Draft-length policies: how many drafts each step makes, K_t in 1..k (the run's k is the maximum).

A policy (KPolicy, registered in K_POLICIES) makes a fresh chooser per generation. Each step asks it
next_k(); after the verify it is told observe(k, accepted). A chooser with a `stop` also ends a step's
drafting early: stop(row) after each draft but the last, on the head's logits row of that draft.

- fixed: K_t = k (every run before policies existed).
- probe: onnxruntime-genai's adaptive K (its docs/SpeculativeDecoding.md, "Adaptive proposal width"): smoothed
  acceptance and throughput (each observation weighted 0.25); probe K-1 when acceptance < 50% and K-1 >= the floor,
  K+1 when acceptance >= 75% and K < k; keep a probe after two observations when throughput is >= 97% of the width
  it left (an upward probe also keeping acceptance >= 75%), drop it at once below 80%; wait one step after a kept
  probe, six after a dropped one. Start and floor min(2, k) (genai's advice, min_adaptive_k=2); its optional
  cooldown is left out. Throughput is tokens per step over the calibration's price of the step at K, not the wall
  clock, so that the same seed gives the same K sequence (the checked pass and the timed rounds decode alike).
- goodput: each step the K that maximises expected tokens per second, E[tokens | K] / E[cost | K], from the
  calibration's prices and a running estimate of the acceptance at each position given the one before it (counts
  decayed by 0.95 a step; each position's estimate shrunk toward the one before it with a weight of two steps, the
  first toward 0.5: a position seldom or never tried reads as its neighbour, not as a coin).
- confidence: draft until the head's top probability falls below `k_confidence` (Hugging Face's assisted
  generation, its assistant_confidence_threshold, default 0.4); the first draft is always made.
At temperature > 0 each is lossless in distribution: a step's length depends only on what came before the verify
(and on the drafts themselves), never on the target's distribution at that step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mtplab.engine.strategies import K_POLICIES


@dataclass(frozen=True)
class StepCosts:
    """A step's price from the calibration: `step[K]` its decode, draft and verify at K drafts, `commit[n]` the commit
    of n tokens (seconds); the tokens a step makes beyond its accepted drafts (`extra`: the schedule's)."""

    step: dict[int, float]
    commit: dict[int, float]
    extra: int

    def of(self, k: int, accepted: int) -> float:
        return self.step[k] + self.commit[accepted + 1]


class Fixed:
    stop = None

    def __init__(self, kmax: int):
        self.kmax = kmax

    def next_k(self) -> int:
        return self.kmax

    def observe(self, k: int, accepted: int) -> None:
        pass


WEIGHT, DOWN_BELOW, UP_FROM, KEEP_AT, DROP_BELOW, WAIT_KEPT, WAIT_DROPPED, PROBE_STEPS = (
    0.25, 0.5, 0.75, 0.97, 0.8, 1, 6, 2)


class Probe:
    """genai's adaptive K on priced throughput (module docstring)."""

    stop = None

    def __init__(self, kmax: int, costs: StepCosts):
        self.kmax, self.costs = kmax, costs
        self.floor = self.k = min(2, kmax)
        self.acceptance: float | None = None
        self.throughput: float | None = None
        self.probe: tuple[int, float, float, int] | None = None  # (width left, its throughput, acceptance, steps)
        self.wait = 0

    def next_k(self) -> int:
        return self.k

    def observe(self, k: int, accepted: int) -> None:
        evaluated = accepted + (accepted < k)  # genai's: the kept prefix and the first rejected draft
        acc = accepted / evaluated
        tp = (accepted + self.costs.extra) / self.costs.of(k, accepted)
        first = self.acceptance is None or (self.probe is not None and self.probe[3] == 0)
        self.acceptance = acc if first else (1 - WEIGHT) * self.acceptance + WEIGHT * acc
        self.throughput = tp if first else (1 - WEIGHT) * self.throughput + WEIGHT * tp
        if self.probe is not None:
            left, was, was_acc, steps = self.probe
            steps += 1
            if self.throughput < DROP_BELOW * was:
                return self._end(left, was, was_acc, kept=False)
            if steps >= PROBE_STEPS:
                up = self.k > left
                kept = self.throughput >= KEEP_AT * was and (not up or self.acceptance >= UP_FROM)
                return self._end(left, was, was_acc, kept)
            self.probe = (left, was, was_acc, steps)
            return
        if self.wait:
            self.wait -= 1
        elif self.acceptance < DOWN_BELOW and self.k - 1 >= self.floor:
            self._start(self.k - 1)
        elif self.acceptance >= UP_FROM and self.k < self.kmax:
            self._start(self.k + 1)

    def _start(self, k: int) -> None:
        self.probe = (self.k, self.throughput, self.acceptance, 0)
        self.k = k

    def _end(self, left: int, was: float, was_acc: float, kept: bool) -> None:
        self.probe = None
        if kept:
            self.wait = WAIT_KEPT
        else:
            self.k, self.throughput, self.acceptance, self.wait = left, was, was_acc, WAIT_DROPPED


DECAY = 0.95


class Goodput:
    """The K of the most expected tokens per second, from running per-position acceptance (module docstring). Plain
    Python floats: k is a handful, and a step's host time is what a small model's speedup is made of."""

    stop = None

    def __init__(self, kmax: int, costs: StepCosts):
        self.kmax, self.costs = kmax, costs
        self.hits = [0.0] * kmax
        self.trials = [0.0] * kmax

    def conditional(self) -> list[float]:
        """P(draft i kept | draft i-1 kept), i = 1..k: each position's decayed counts with a prior of two steps at
        the estimate of the position before it (0.5 for the first)."""
        out, prior = [], 0.5
        for h, t in zip(self.hits, self.trials):
            prior = (h + 2 * prior) / (t + 2)
            out.append(prior)
        return out

    def next_k(self) -> int:
        reach, best, best_rate = [1.0], 1, -1.0  # reach[i] = P(accepted >= i)
        for a in self.conditional():
            reach.append(reach[-1] * a)
        commit, step, extra = self.costs.commit, self.costs.step, self.costs.extra
        for k in range(1, self.kmax + 1):
            tokens = extra + sum(reach[1 : k + 1])
            cost = step[k] + sum((reach[n] - reach[n + 1]) * commit[n + 1] for n in range(k)) + reach[k] * commit[k + 1]
            if tokens / cost > best_rate:
                best, best_rate = k, tokens / cost
        return best

    def observe(self, k: int, accepted: int) -> None:
        judged = min(accepted + 1, k)  # positions 1..accepted kept, accepted + 1 rejected (if drafted)
        for i in range(self.kmax):
            self.hits[i] = DECAY * self.hits[i] + (i < accepted)
            self.trials[i] = DECAY * self.trials[i] + (i < judged)


class Confidence:
    """Draft until the head's top probability falls below the threshold (module docstring)."""

    def __init__(self, kmax: int, threshold: float, temperature: float):
        self.kmax, self.threshold, self.temperature = kmax, threshold, temperature

    def next_k(self) -> int:
        return self.kmax

    def observe(self, k: int, accepted: int) -> None:
        pass

    def stop(self, row) -> bool:
        """After a draft: its logits row's top probability (at the run's temperature) below the threshold."""
        z = np.asarray(row, dtype=np.float64) / (self.temperature or 1.0)
        return 1.0 / float(np.exp(z - z.max()).sum()) < self.threshold


@dataclass(frozen=True)
class KPolicy:
    """name: the RunConfig `k_policy` value; make(spec, costs) a chooser for one generation; needs_costs: it prices
    steps with the calibration (StepCosts); needs_confidence: it stops a step's drafting on the drafter's own top
    probability (a drafter that can: DrafterKind.confident)."""

    name: str
    summary: str
    make: Callable
    needs_costs: bool = False
    needs_confidence: bool = False


FIXED = K_POLICIES.register(KPolicy("fixed", "k drafts every step", lambda spec, costs: Fixed(spec.k)))
K_POLICIES.register(KPolicy("probe", "onnxruntime-genai's adaptive K: probe K-1 / K+1 from smoothed acceptance, "
                                     "keep the probe if throughput holds", lambda spec, costs: Probe(spec.k, costs),
                            needs_costs=True))
K_POLICIES.register(KPolicy("goodput", "each step the K of the most expected tokens per second (calibrated costs, "
                                       "running per-position acceptance)", lambda spec, costs: Goodput(spec.k, costs),
                            needs_costs=True))
K_POLICIES.register(KPolicy("confidence", "draft until the head's top probability falls below k_confidence",
                            lambda spec, costs: Confidence(spec.k, spec.k_confidence, spec.temperature),
                            needs_confidence=True))
