"""One definition of each rate a point reports, and the one RunResult builder every engine uses.

Counting: a run counts the tokens after the prefill's token up to the n-th, timed from after the
prefill (a speculative run's overshoot in its last step is not counted; a run that stops early, at
an EOS token, counts what it made). Tokens/s = counted tokens / seconds. A paired round's speedup =
its speculative tokens/s / its greedy tokens/s. A point's tokens/s, greedy tokens/s, speedup and
efficiency are medians over its paired rounds with 95% bootstrap CIs (mtplab.measure.stats).

Acceptance: tokens/step = tokens made after the prefill's token (overshoot included) / steps;
acceptance length = 1 + accepted / steps (vLLM's definition); draft acceptance = accepted / drafted;
per position, P(accepted >= i) over the steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from mtplab.measure import stats, theory
from mtplab.measure.result import RunResult

AUTO = "auto"
AUTO_MIN_ROUNDS = 5  # rounds before the interval is trusted to stop on (and before the budget may stop them)
AUTO_MAX_ROUNDS = 200


def rate(count: float, per: float) -> float:
    """count / per, NaN when either is 0 (nothing counted or nothing timed: nothing to say)."""
    return count / per if count and per else float("nan")


def counted(tokens: list[int], n: int) -> int:
    """How many of a run's tokens are timed: those after the prefill's token, up to the n-th."""
    return max(0, min(len(tokens), n) - 1)


def tokens_per_s(tokens: list[int], n: int, seconds: float) -> float:
    """A run's tokens/s: its counted tokens over its timed seconds."""
    return rate(counted(tokens, n), seconds)


def paired_round(r: int, order: tuple[str, str]) -> dict:
    """A paired round's sample before its sides ran: its number and the order of its sides."""
    return {"round": r, "order": "-".join(order)}


def record_side(sample: dict, side: str, rows: list[list[int]], n: int, seconds: float) -> None:
    """One side of a paired round from every row's tokens (one row at batch 1): `greedy` sets greedy_tokens_per_s,
    greedy_seconds and greedy_counted, any other side (the speculative one) tokens_per_s, seconds and counted; the
    count is every row's tokens after its prefill's token, up to the n-th."""
    prefix = "greedy_" if side == "greedy" else ""
    count = sum(counted(tokens, n) for tokens in rows)
    sample[f"{prefix}counted"] = count
    sample[f"{prefix}tokens_per_s"] = rate(count, seconds)
    sample[f"{prefix}seconds"] = seconds


def close_round(sample: dict) -> dict:
    """The round's speedup, once both sides ran."""
    sample["speedup"] = rate(sample["tokens_per_s"], sample["greedy_tokens_per_s"])
    return sample


def summary_of(samples: list[dict], key: str) -> dict:
    """Median, 95% CI and the stable flag of one rate over the rounds."""
    return stats.summarize([s[key] for s in samples])


def paired_ratio(a: list[float], b: list[float]) -> dict:
    """Median and CI of the per-round ratios a / b (rounds paired)."""
    return stats.summarize([rate(x, y) for x, y in zip(a, b)])


def acceptance(
    steps: int, accepted: int, drafted: int, generated: int, per_step: list[int] | None = None, k: int = 0,
    ks: list[int] | None = None,
) -> dict:
    """The RunResult's acceptance fields; per-position acceptance only where every step's count is known (ks: each
    step's drafts where a draft-length policy chose them)."""
    per_position = [] if per_step is None else theory.measured_per_position(per_step, k, ks)
    return {
        "steps": steps,
        "tokens_per_step": generated / steps if steps else float("nan"),
        "acceptance_length": 1.0 + (accepted / steps if steps else 0.0),
        "draft_acceptance": accepted / drafted if drafted else 0.0,
        "acceptance_per_position": per_position,
        "drafted": drafted,
        "accepted": accepted,
        "accepted_per_step": [int(a) for a in per_step or []],
        "k_per_step": [int(j) for j in ks] if ks is not None and any(j != k for j in ks) else [],
    }


def run_result(samples: list[dict], n: int, acceptance_fields: dict, predicted: dict | None = None, **fields) -> RunResult:
    """A point's RunResult from its paired rounds (see record_side, close_round) and acceptance fields.

    Every rate comes from here; `fields` are the rest (config, model, identity, slots, ...).
    predicted: the calibration's prediction ({"speedup", ...}: the price of the steps the run made, or a batch
    point's at its alpha); efficiency = measured / predicted["speedup"] per round.
    """
    speedup = summary_of(samples, "speedup")
    spec_tps = summary_of(samples, "tokens_per_s")
    greedy_tps = summary_of(samples, "greedy_tokens_per_s")
    if predicted:
        efficiency = [rate(s["speedup"], predicted["speedup"]) for s in samples]
        fields |= {
            "predicted": predicted,
            "efficiency": stats.median(efficiency),
            "efficiency_ci": stats.bootstrap_ci(efficiency),
        }
    return RunResult(
        seconds=stats.median([s["seconds"] for s in samples]),
        tokens_per_s=spec_tps["median"],
        greedy_seconds=rate(n - 1, greedy_tps["median"]),
        greedy_tokens_per_s=greedy_tps["median"],
        speedup=speedup["median"],
        round_samples=samples,
        speedup_ci=speedup["ci"],
        tokens_per_s_ci=spec_tps["ci"],
        greedy_tokens_per_s_ci=greedy_tps["ci"],
        stable=speedup["stable"],
        **acceptance_fields,
        **fields,
    )


@dataclass
class RoundsPlan:
    """How many paired rounds a point runs: `fixed` of them, or, when fixed is None (rounds: auto), at least
    AUTO_MIN_ROUNDS and then more until the speedup's 95% interval is within `target` of its centre, or until the
    next round would end past `budget_s` seconds of timed rounds, or AUTO_MAX_ROUNDS (pyperf and criterion size
    their repetitions the same way). It stops on the wider of two intervals: the t interval of the rounds' ratios
    (stats.ratio_interval), wider than the bootstrap of the median at a few rounds and honest there, and the
    bootstrap of the median the point publishes, up to a quarter wider at many rounds (a median is a less
    efficient estimate than a mean): a point that stops within target publishes an interval within it. Checking
    after every round still makes it a little optimistic (optional stopping), which the minimum bounds. `outcome`
    says which happened, once the rounds are over."""

    fixed: int | None
    target: float = 0.03
    budget_s: float = 60.0
    outcome: dict = field(default_factory=dict)

    @classmethod
    def of(cls, run) -> RoundsPlan:
        """A RunConfig's plan (its rounds, rounds_target and rounds_budget)."""
        fixed = None if run.rounds == AUTO else int(run.rounds)
        return cls(fixed, float(run.rounds_target), float(run.rounds_budget))

    def rounds(self, samples: list[dict], key: str = "speedup") -> Iterator[int]:
        """Round numbers 0, 1, ... while another round is due; `samples` is the caller's list of closed rounds."""
        start, r = time.perf_counter(), 0
        while True:
            elapsed = time.perf_counter() - start
            reason, width = self._stop(samples, r, elapsed, key)
            if reason is not None:
                self.outcome = {"mode": "fixed" if self.fixed is not None else AUTO, "stopped": reason, "rounds": r,
                                "half_width": width, "target": None if self.fixed is not None else self.target,
                                "budget_s": None if self.fixed is not None else self.budget_s, "seconds": elapsed}
                return
            yield r
            r += 1

    def _stop(self, samples: list[dict], r: int, elapsed: float, key: str) -> tuple[str | None, float | None]:
        if self.fixed is not None:  # its interval is read once, when it stops
            return ("fixed", interval_half_width([s[key] for s in samples])) if r >= self.fixed else (None, None)
        if r < AUTO_MIN_ROUNDS:
            return None, None
        ratios = [s[key] for s in samples]
        width = interval_half_width(ratios)
        if width <= self.target:  # and the interval the point publishes (the median's), often wider at many rounds
            width = max(width, stats.summarize(ratios)["half_width"])
            if width <= self.target:
                return "within target", width
        if r >= AUTO_MAX_ROUNDS:
            return f"cap of {AUTO_MAX_ROUNDS} rounds reached", width
        if elapsed * (r + 1) / r > self.budget_s:  # the next round, at the mean round's length, would not fit
            return "budget spent", width
        return None, width


def interval_half_width(ratios) -> float:
    """The t interval's half-width over its centre (stats.ratio_interval); NaN from fewer than two rounds."""
    got = stats.ratio_interval(ratios)
    if got is None:
        return float("nan")
    lo, hi = got
    return (hi - lo) / (hi + lo)
