"""Named warnings: what a point measured that is not an error, yet a careful reader must be told.

Each warning is {"name", "message"}; the names are stable (the report counts them):
- efficiency: measured speedup / the calibration's price of the steps the run made (a batch point's: of its
  alpha), outside EFFICIENCY_BAND (the cost model misses something, or the machine was busy);
- unaccounted: the timed wall time per step and the sum of the step's measured phases disagree by
  more than UNACCOUNTED_BAND allows (time spent outside the phases, or phases timed outside the clock);
- acceptance_below_calibration: the MTP head accepted fewer drafts than its calibration predicts, by
  more than both samples' noise explains (one-sided z-test, false-alarm rate ACCEPTANCE_FALSE_ALARM);
- oracle_acceptance: the oracle drafter's accepted counts are not what its alpha sets (an exact two-sided
  test on their sum, false-alarm rate at most ORACLE_FALSE_ALARM), or at temperature > 0 its judged drafts'
  expected acceptance is below alpha, which its mixture cannot go under (no false alarms): the drafter does
  not draft as configured;
- sampled_acceptance: at temperature > 0, the kept share of the judged drafts is not their expected
  acceptance sum(min(p, q)) (an exact two-sided binomial test, conservative here, false-alarm rate at
  most ORACLE_FALSE_ALARM): the rejection sampler does not keep drafts at the rate its rule sets;
- greedy_drift: the point's greedy cost per decode is outside GREEDY_DRIFT_BAND of the calibration's (the
  machine moved since the calibration, or the timed greedy does work the calibrated loop does not): the
  prediction and the efficiency assume the calibration's baseline;
- the timed-round audit's own (mtplab.check.audit): timed_fallbacks (a timed round ran eager where the checked run
  replayed: a declined capture, or its own recapture budget spent at another step), timed_invalidations (a timed
  round invalidated more plans than the checked run: an unpinned policy's workspace moved more often, or it spent
  its budget), timed_state_not_bitwise. Each lets a timed round only do costlier work than the checked run,
  never cheaper. (A timed window that does not hold exactly its run's work is a problem, not a warning:
  mtplab.check.audit.clock_problems.)
"""

from __future__ import annotations

import math

import numpy as np

from mtplab.engine.strategies import DRAFTERS

EFFICIENCY_BAND = (0.7, 1.3)
# (wall - sum of phases) / wall. A clean point's is the loop's own bookkeeping, a few percent at most; a phase
# timed outside the clock makes it negative, a slow host path between the phases large.
UNACCOUNTED_BAND = (-0.03, 0.15)
ACCEPTANCE_FALSE_ALARM = 0.01
# the point's greedy seconds per decode over the calibration's. Measured here: the demo's points 0.82-1.06 of their
# calibration (a machine whose speed moves 10-25% within a minute); a decode doing twice its work is far outside.
GREEDY_DRIFT_BAND = (0.67, 1.5)
_Z = 2.326  # one-sided 1% normal quantile


def warning(name: str, message: str) -> dict:
    return {"name": name, "message": message}


def expected_accepted(per_position: list[float], alpha: float, k: int) -> tuple[float, float]:
    """Mean and variance of the accepted count per step at k drafts, from calibrated P(accepted >= i)
    (geometric alpha^i beyond the calibrated positions)."""
    p = [per_position[i - 1] if i <= len(per_position) else alpha**i for i in range(1, k + 1)]
    mean = sum(p)
    second = sum((2 * i - 1) * pi for i, pi in enumerate(p, start=1))  # E[A^2] = sum (2i - 1) P(A >= i)
    return mean, max(second - mean * mean, 0.0)


def _z(accepted: list[int], mean: float, var: float, reference_steps: int | None = None) -> tuple[float, float]:
    """(the run's mean accepted drafts per step, its z against `mean`): the run's standard error, plus the
    reference's when the mean is itself an estimate over `reference_steps`; no variance: 0 or +-inf."""
    got = sum(accepted) / len(accepted)
    se = math.sqrt(var / len(accepted) + (var / reference_steps if reference_steps else 0.0))
    if se == 0:
        return got, 0.0 if got == mean else math.copysign(float("inf"), got - mean)
    return got, (got - mean) / se


def acceptance_warning(accepted: list[int], k: int, calibration: dict) -> dict | None:
    """The acceptance_below_calibration warning, or None: the run's mean accepted drafts per step against
    the calibration's, a one-sided z-test on both samples' standard errors."""
    acc = calibration.get("mtp_acceptance") or {}
    steps_cal = acc.get("steps") or 0
    if not accepted or not steps_cal:
        return None
    mean, var = expected_accepted(acc.get("per_position", []), acc.get("alpha", 0.0), k)
    got, z = _z(accepted, mean, var, steps_cal)
    if z >= -_Z:
        return None
    return warning(
        "acceptance_below_calibration",
        f"the MTP head accepted {got:.2f} drafts per step over {len(accepted)} steps, its calibration predicts "
        f"{mean:.2f} (alpha {acc.get('alpha', 0):.2f} over {steps_cal} steps); z = {z:.1f}, "
        f"below the {ACCEPTANCE_FALSE_ALARM:.0%} false-alarm line: the head drafts worse here than calibrated",
    )


ORACLE_FALSE_ALARM = 0.001


def accepted_sum_p_value(accepted: list[int], k: int, alpha: float) -> float:
    """The exact two-sided p-value (twice the smaller tail, at most 1) of the total accepted drafts over the run's
    steps, each step's count independent with P(accepted = i) = alpha^i (1 - alpha) for i < k and alpha^k at k:
    the steps' counts convolved. The counts are skewed at high alpha, where a normal approximation raises false
    alarms ten to twenty times more often than it states."""
    step = np.array([alpha**i * (1 - alpha) for i in range(k)] + [alpha**k])
    total = np.ones(1)
    for _ in accepted:
        total = np.convolve(total, step)
    s = int(sum(accepted))
    if not 0 <= s < len(total):
        return 0.0
    return float(min(1.0, 2 * min(total[: s + 1].sum(), total[s:].sum())))


def oracle_warning(accepted: list[int], k: int, alpha: float) -> dict | None:
    """The oracle_acceptance warning, or None: the oracle drafter's accepted counts against the distribution
    its alpha sets (P(accepted >= i) = alpha^i), an exact two-sided test at ORACLE_FALSE_ALARM."""
    if not accepted:
        return None
    p_value = accepted_sum_p_value(accepted, k, alpha)
    if p_value >= ORACLE_FALSE_ALARM:
        return None
    mean, _ = expected_accepted([], alpha, k)
    return warning(
        "oracle_acceptance",
        f"the oracle drafter accepted {sum(accepted) / len(accepted):.2f} drafts per step over {len(accepted)} steps, "
        f"alpha {alpha:g} sets {mean:.2f}; exact two-sided p = {p_value:.2g}, below the {ORACLE_FALSE_ALARM:.1%} "
        "false-alarm line: it does not draft as configured",
    )


def binomial_two_sided(k: int, n: int, p: float) -> float:
    """The exact two-sided p-value of k successes in n trials at rate p (twice the smaller tail, at most 1). For a
    sum of Bernoulli(p_j) with mean p it is conservative: such a sum is more concentrated than the binomial."""
    p = min(max(p, 0.0), 1.0)
    if p in (0.0, 1.0):
        return 1.0 if k == round(n * p) else 0.0

    def pmf(i: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                        + i * math.log(p) + (n - i) * math.log1p(-p))

    low = sum(pmf(i) for i in range(0, k + 1))
    high = sum(pmf(i) for i in range(k, n + 1))
    return min(1.0, 2 * min(low, high))


def sampled_warning(sampled: dict) -> dict | None:
    """The sampled_acceptance warning, or None: kept drafts against their expected acceptance. The kept count is a
    sum of Bernoulli(e_j) over the judged drafts; the exact binomial test at their mean e is conservative for it
    (such a sum is more concentrated than the binomial), so it raises at most ORACLE_FALSE_ALARM false alarms."""
    judged, e = sampled.get("judged") or 0, sampled.get("expected")
    if not judged or e is None:
        return None
    if not math.isfinite(e):
        return warning("sampled_acceptance", f"the judged drafts' expected acceptance sum(min(p, q)) is {e}: the "
                                             "probabilities the rule drew from were not finite")
    e = min(max(e, 0.0), 1.0)
    p_value = binomial_two_sided(int(sampled["kept"]), int(judged), e)
    if p_value >= ORACLE_FALSE_ALARM:
        return None
    return warning(
        "sampled_acceptance",
        f"rejection sampling kept {sampled['kept']} of {judged} judged drafts ({sampled['measured']:.1%}), their "
        f"expected acceptance sum(min(p, q)) sets {e:.1%}; binomial p = {p_value:.2g}, below the "
        f"{ORACLE_FALSE_ALARM:.1%} false-alarm line: drafts are not kept at the rate the rule sets",
    )


def greedy_warning(decode_seconds: float, calibration: dict | None) -> dict | None:
    """The greedy_drift warning, or None: the point's greedy seconds per decode against the calibration's."""
    calibrated = (calibration or {}).get("greedy_token")
    if not calibrated or math.isnan(decode_seconds):
        return None
    ratio, (lo, hi) = decode_seconds / calibrated, GREEDY_DRIFT_BAND
    if lo <= ratio <= hi:
        return None
    return warning("greedy_drift", f"greedy took {decode_seconds * 1e3:.3g} ms per decode here, the calibration "
                                   f"{calibrated * 1e3:.3g} ms ({ratio:.2f}x, outside [{lo}, {hi}]): the machine moved "
                                   "since the calibration, or the timed greedy does work the calibrated loop does not")


# How far the verify's distribution p and the one the mixture drew from (the same target, another forward) may be
# apart in total variation: the mixture's acceptance is then at least alpha - this. Measured: 4e-7 on fp32 builds.
MIXTURE_TOLERANCE = 0.02


def mixture_warning(sampled: dict, alpha: float) -> dict | None:
    """The oracle_acceptance warning at temperature > 0, or None. The mixture drafts from q = alpha * p' + (1 - alpha)
    * [d], p' the target's distribution as its own forward computed it; against the verify's p its acceptance
    sum(min(p, q)) >= alpha * (1 - TV(p, p')), draft by draft: judged drafts whose expected acceptance is below alpha
    by more than MIXTURE_TOLERANCE were not drafted from that mixture (no false alarms)."""
    e = sampled.get("expected")
    if not sampled.get("judged") or e is None or not e < alpha - MIXTURE_TOLERANCE:
        return None
    return warning("oracle_acceptance", f"the judged drafts' expected acceptance sum(min(p, q)) is {e:.1%}, below the "
                                        f"alpha {alpha:g} the mixture alpha * p + (1 - alpha) * [d] cannot go under: it "
                                        "does not draft as configured")


def point_warnings(efficiency: float, unaccounted: float, drafter: str, accepted: list[int], k: int,
                   calibration: dict | None, audit: dict, alpha: float | None = None,
                   sampled: dict | None = None, greedy_decode_seconds: float = float("nan")) -> list[dict]:
    """Every named warning of one point (see the module docstring)."""
    out = []
    if (w := greedy_warning(greedy_decode_seconds, calibration)) is not None:
        out.append(w)
    lo, hi = EFFICIENCY_BAND
    if efficiency == efficiency and not lo <= efficiency <= hi:
        out.append(warning("efficiency", f"efficiency {efficiency:.2f} is outside [{lo}, {hi}]: the measured "
                                         "speedup is not what the calibrated cost model prices"))
    lo, hi = UNACCOUNTED_BAND
    if unaccounted == unaccounted and not lo <= unaccounted <= hi:
        out.append(warning("unaccounted", f"{unaccounted:.1%} of the timed wall time per step is outside the "
                                          f"measured phases (allowed [{lo:.0%}, {hi:.0%}]): "
                                          + ("phases timed outside the clock" if unaccounted < lo
                                             else "host work between the phases")))
    source = DRAFTERS.get(drafter).acceptance  # where the drafter's acceptance comes from decides the test
    if source == "calibration" and calibration is not None and (w := acceptance_warning(accepted, k, calibration)):
        out.append(w)
    if sampled is not None and (w := sampled_warning(sampled)):
        out.append(w)
    if source == "setting" and alpha is not None and (
            w := oracle_warning(accepted, k, alpha) if sampled is None else mixture_warning(sampled, alpha)):
        out.append(w)
    for name, w in audit.get("warnings", {}).items():
        out.append(warning(name, w["message"] + (f" ({w['count']} runs)" if w["count"] > 1 else "")))
    return out
