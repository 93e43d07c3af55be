"""The published numbers of a point re-derived from its rounds and accepted counts, apart from the code that made them
(mtplab.measure.rounds and its statistics, mtplab.measure.stats): a point whose RunResult says anything else is a
mismatch (the run check).

The recheck's statistics are its own, written apart on purpose: the median with numpy, the percentile bootstrap of
the median at 95% over 2000 resamples from seed 0, the stable rule (half-width at most 5% of the median). A change in
mtplab.measure.stats (another centre, another level, fewer resamples) shows as a difference here, where a recheck
through the same helpers would repeat it.
"""

from __future__ import annotations

import math

import numpy as np

from mtplab.measure.floor import floor_problems

LEVEL, RESAMPLES, SEED, STABLE = 0.95, 2000, 0, 0.05  # what a published interval and its stable flag are


def _finite(values) -> np.ndarray:
    return np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def _median(values) -> float:
    x = _finite(values)
    return float(np.median(x)) if x.size else float("nan")


def _interval(values) -> list[float]:
    """The seeded percentile bootstrap interval of the median; NaNs below two finite values."""
    x = _finite(values)
    if x.size < 2:
        return [float("nan"), float("nan")]
    resampled = x[np.random.default_rng(SEED).integers(0, x.size, (RESAMPLES, x.size))]
    lo, hi = np.quantile(np.median(resampled, axis=1), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(lo), float(hi)]


def _stable(ci: list[float], centre: float) -> bool:
    lo, hi = ci
    return all(math.isfinite(v) for v in (lo, hi, centre)) and centre != 0 and (hi - lo) / 2 / abs(centre) <= STABLE


def result_problems(result, n: int, k: int, generated: int | None) -> list[str]:
    """Every published rate and count of a point recomputed from its rounds and accepted counts: each round's rates
    from its counts and seconds, the medians of the finite rounds, the CIs with the same seeded bootstrap, the
    stable flag, whether it is suspect (mtplab.measure.floor), the efficiency and its CI, the acceptance fields
    (tokens per step where `generated`, the tokens the timed runs made, is given). A stored result holds null for what was NaN. (The seconds fields are what the rates
    are made of, and are not published as a finding.)"""
    out, samples = [], result.round_samples

    def off(a, b) -> bool:
        a, b = (float("nan") if v is None else float(v) for v in (a, b))
        return not (a == b or (np.isnan(a) and np.isnan(b)) or abs(a - b) <= 1e-9 * max(abs(a), abs(b)))

    def ratio(a, b) -> float:
        return a / b if a and b else float("nan")

    def ci_off(published: list, ci: list) -> bool:
        return len(published) != 2 or any(off(a, b) for a, b in zip(published, ci))

    for s in samples:
        for side in ("", "greedy_"):  # each side's rate from its own count and seconds
            if off(s[f"{side}tokens_per_s"], ratio(s[f"{side}counted"], s[f"{side}seconds"])):
                out.append(f"round {s['round']}'s {side}tokens_per_s {s[f'{side}tokens_per_s']:.6g} is not its "
                           f"{s[f'{side}counted']} counted tokens over its {s[f'{side}seconds']:.6g} s")
        if off(s["speedup"], ratio(s["tokens_per_s"], s["greedy_tokens_per_s"])):
            out.append(f"round {s['round']}'s speedup {s['speedup']:.6g} is not its tokens/s over greedy's")
    for name in ("speedup", "tokens_per_s", "greedy_tokens_per_s"):
        values = [s[name] for s in samples]
        centre = _median(values)  # of the finite rounds, as a point's medians are taken
        if off(getattr(result, name), centre):
            out.append(f"{name} {getattr(result, name):.6g} is not the median of its rounds ({centre:.6g})")
        ci = _interval(values)
        if ci_off(getattr(result, f"{name}_ci"), ci):
            out.append(f"{name}_ci {getattr(result, f'{name}_ci')} is not its rounds' bootstrap CI {ci}")
        if name == "speedup" and bool(result.stable) != _stable(ci, centre):
            out.append(f"stable={result.stable}, but its rounds' CI {ci} around {centre:.6g} says otherwise")
    floors = floor_problems(samples)  # a suspect point stays one: its rounds' floors say so, whatever its fields say
    if bool(floors) != bool(getattr(result, "suspect", None)):
        out.append(f"suspect={getattr(result, 'suspect', None)!r}, but its rounds' timing floors say "
                   + (f"{floors[0]!r}" if floors else "every side is within its band"))
    predicted = (result.predicted or {}).get("speedup")
    if predicted is not None:
        efficiency = [ratio(s["speedup"], predicted) for s in samples]
        if off(result.efficiency, centre := _median(efficiency)):
            out.append(f"efficiency {result.efficiency:.6g} is not its rounds' speedups over the prediction "
                       f"{predicted:.6g} ({centre:.6g})")
        ci = _interval(efficiency)
        if ci_off(result.efficiency_ci, ci):
            out.append(f"efficiency_ci {result.efficiency_ci} is not its rounds' bootstrap CI {ci}")
    split = result.time_split or {}
    seconds = float(np.mean([s["seconds"] for s in samples])) if samples else float("nan")
    if any(v < 0 for v in split.values()) or sum(split.values()) > seconds * (1 + 1e-9):
        out.append(f"time split {', '.join(f'{p}={v * 1e3:.4g} ms' for p, v in split.items())} per run: a phase "
                   f"below zero, or more than its run's {seconds * 1e3:.4g} ms in all")
    acc = np.asarray(result.accepted_per_step, dtype=float)
    steps = len(acc)
    ks = np.asarray(result.k_per_step or [k] * steps, dtype=float)  # a draft-length policy's K per step
    if steps and len(ks) != steps:
        out.append(f"k_per_step holds {len(ks)} steps, accepted_per_step {steps}")
    elif steps:
        expect = {
            "steps": steps,
            "accepted": acc.sum(),
            "drafted": ks.sum(),
            "draft_acceptance": acc.sum() / ks.sum(),
            "acceptance_length": 1 + acc.mean(),
            **({"tokens_per_step": generated / steps} if generated is not None else {}),
        }
        for name, value in expect.items():
            if off(getattr(result, name), value):
                out.append(f"{name} {getattr(result, name):.6g}, its accepted counts give {value:.6g}")
        per_position = [float((acc[ks >= i] >= i).mean()) if (ks >= i).any() else 0.0 for i in range(1, k + 1)]
        if len(result.acceptance_per_position) != k or any(
                off(a, b) for a, b in zip(result.acceptance_per_position, per_position)):
            out.append(f"per-position acceptance {result.acceptance_per_position}, its accepted counts give {per_position}")
    return out
