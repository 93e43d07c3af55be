"""What a point's cost model predicts, from the calibration alone (never from the point's own times): the speedup at
the acceptance its drafter is set or calibrated to, and what the calibration prices for the steps its timed rounds
made (the efficiency divides the measured speedup by it). Batch 1 prices T(1, M); a batch B the calibration at B,
T(B, M), whose steps wait for the slowest row."""

from __future__ import annotations

import numpy as np

from mtplab.engine.k_policies import StepCosts
from mtplab.engine.speculative import SpeculativeRun
from mtplab.engine.strategies import DRAFTERS, K_POLICIES, SCHEDULES
from mtplab.experiment.config import RunConfig
from mtplab.measure import theory
from mtplab.runtime.executor import Slot


def acceptance_alpha(run: RunConfig, calibration: dict, accepted: list[int] | None = None,
                     ks: list[int] | None = None) -> tuple[float | None, str]:
    """The per-position acceptance a prediction uses, and where it comes from (the run's drafter says; a sampled
    run's own, measured: the calibration measures greedy acceptance, and sampling accepts otherwise; ks: each step's
    drafts where a draft-length policy chose them)."""
    if run.temperature > 0:
        if not accepted:
            return None, "none (a sampled run's acceptance is its own, and it has no steps)"
        per_position = theory.measured_per_position(accepted, run.k, ks)
        return theory.fit_alpha(per_position), f"measured in the checked run (temperature {run.temperature:g})"
    source = DRAFTERS.get(run.drafter).acceptance
    if source == "setting":
        return run.alpha, "oracle setting"
    if source == "calibration":
        return calibration["mtp_acceptance"]["alpha"], "acceptance calibration"
    return None, f"none (the {run.drafter} drafter's acceptance is neither set nor calibrated)"


def step_costs(run: RunConfig, calibration: dict) -> StepCosts:
    """What a draft-length policy prices a step at K (1..k) with: the calibration's decode, draft and verify at K and
    its commit of n tokens (ValueError where it did not measure k + 1 tokens)."""
    if not theory.covers(calibration, run.k, run.commit):
        raise ValueError(f"k_policy={run.k_policy!r} prices steps of up to k={run.k} drafts, beyond what the "
                         f"calibration measured (its verify sizes {sorted(int(m) for m in calibration['target'])}): "
                         "give a smaller k, or k_policy='fixed'")
    commits = {int(m): float(s) for m, s in calibration["commit"][run.commit].items()}
    verified = run.k if run.verify_plans == "padded" else None  # a padded verify costs k + 1 tokens whatever K drafts
    return StepCosts({j: theory.step_seconds(j, run.schedule, run.commit, calibration, verified)
                      for j in range(1, run.k + 1)},
                     commits, SCHEDULES.get(run.schedule).extra_tokens)


def calibration_for(run: RunConfig, say=print) -> dict:
    """The cached cost-model calibration for the run's model, this machine, threads and batch (measured when
    missing)."""
    from mtplab.experiment.calibrate import load_or_measure

    return load_or_measure(run.model, say=say, threads=run.threads, int4=run.int4, batch=run.batch)


def check_calibration(run: RunConfig, calibration: dict | None) -> None:
    """ValueError, before any work, where a calibration given for a point was measured at another batch than the point
    runs (its "batch" and its key's), or lacks the head's acceptance the run's drafter is priced at."""
    if calibration is None:
        return
    key = calibration.get("key") or {}
    batches = {calibration.get("batch", 1)} | ({key["batch"]} if "batch" in key else set())
    if batches != {run.batch}:
        raise ValueError(f"the calibration given was measured at batch {'/'.join(map(str, sorted(batches)))}; this "
                         f"point runs batch {run.batch}: pass its own (mtplab.experiment.calibrate.load_or_measure("
                         "model, batch=B))")
    if DRAFTERS.get(run.drafter).acceptance == "calibration" and "mtp_acceptance" not in calibration:
        raise ValueError(f"the calibration given carries no head acceptance (mtp_acceptance) to price drafter="
                         f"{run.drafter!r} at: a batch's calibration takes batch 1's "
                         "(mtplab.experiment.calibrate.load_or_measure(model, batch=B) adds it)")


def run_alpha(run: RunConfig, calibration: dict, spec: SpeculativeRun) -> tuple[float | list[float] | None, str]:
    """The per-position acceptance a prediction prices, and where it comes from: the drafter's setting or the
    calibration's; a sampled run's is measured, each row's own from its checked steps."""
    if run.temperature == 0:
        return acceptance_alpha(run, calibration)
    fitted = [acceptance_alpha(run, calibration, a, k) for a, k in zip(spec.accepted, spec.ks)]
    if len(fitted) == 1:
        return fitted[0]
    alphas = [a for a, _ in fitted]
    return (alphas if all(a is not None for a in alphas) else None), fitted[0][1] + ", each row's own"


def predict_point(run: RunConfig, calibration: dict, alpha, alpha_source: str, timed: SpeculativeRun,
                  share: dict) -> tuple[dict | None, dict]:
    """(the RunResult's `predicted`, its `theory`) for a point: at batch 1 the speedup at alpha (theory.predict) and
    the calibration's price of the steps the timed run made; at batch B, theory.predict_batch (a draft-length
    policy's batch, whose rows choose apart, is not predicted). `predicted` is None where there is nothing to price
    it at (`theory` says why)."""
    k, n = run.k, run.tokens
    if alpha is None:
        return None, {"alpha_source": alpha_source, "not_predicted": f"no acceptance to price it at: {alpha_source}"}
    described = {"alpha_source": alpha_source} if run.batch > 1 else {
        "acceptance_length": theory.acceptance_length(alpha, k), "acceptance_per_position": theory.per_position(alpha, k),
        "alpha_source": alpha_source}
    if not theory.covers(calibration, k, run.commit):  # a builder model's k may exceed the calibration's sizes
        return None, described | {"not_predicted": (
            f"the calibration measured verifies of up to M={max(int(m) for m in calibration['target'])} and commits "
            f"{', '.join(sorted(calibration['commit']))}; this run verifies at M={k + 1} with commit={run.commit}")}
    if run.batch > 1:
        if K_POLICIES.get(run.k_policy).name != "fixed":
            return None, {"alpha_source": alpha_source,
                          "not_predicted": "a draft-length policy's batch: its rows choose their K apart"}
        at = theory.predict_batch(alpha, k, run.schedule, run.commit, calibration, n, run.batch)
        return {key: at[key] for key in ("speedup", "alpha", "riding_share")}, at | described
    at = theory.predict(alpha, k, run.schedule, run.commit, calibration, tokens=n, eager_share=share)
    accepted, ks = timed.accepted[0], timed.ks[0]
    varied = ks if any(j != k for j in ks) else k  # each step priced at its own K
    priced = theory.predict_steps(accepted, varied, run.schedule, run.commit, calibration, n, share,
                                  k if run.verify_plans == "padded" else None) if (accepted and n > 1) else None
    return predicted_fields(priced, at, alpha), at | described


def predicted_fields(priced: dict | None, at_alpha: dict | None, alpha: float | None) -> dict | None:
    """A RunResult's `predicted`: "speedup", what the calibration prices for the steps the timed rounds made (the
    efficiency divides it: how the run executed, its acceptance as it fell); "at_alpha" and "alpha", the
    prediction at the alpha the drafter was set or calibrated to (theory.speedup); "phases" and
    "greedy_seconds_per_token", the prices the report sets each timed phase against. None where either is missing."""
    if priced is None or at_alpha is None:
        return None
    return {"speedup": priced["speedup"], "steps": priced["steps"], "tokens_per_step": priced["tokens_per_step"],
            "phases": priced["phases"], "greedy_seconds_per_token": priced["greedy_seconds_per_token"],
            "at_alpha": at_alpha["speedup"], "alpha": alpha}


def eager_share(slots: dict, labels: dict) -> dict:
    """The share of the Primary and Verify slots' forwards that ran outside a plan in the checked run (counts)."""
    out = {}
    for slot in (Slot.PRIMARY, Slot.VERIFY):
        c = slots.get(labels.get(slot, ""), {})
        runs = c.get("replays", 0) + c.get("captures", 0) + c.get("fallbacks", 0)
        out[slot.name.lower()] = c.get("fallbacks", 0) / runs if runs else 0.0
    return out


def accounting(samples: list[dict], split: dict, steps: int) -> dict:
    """Accounting check (not a prediction): wall time per step against the sum of the measured split."""
    if not steps:
        return {"wall_per_step": float("nan"), "split_per_step": float("nan"), "unaccounted": float("nan")}
    wall = float(np.mean([s["seconds"] for s in samples])) / steps
    summed = sum(split.values()) / steps
    return {"wall_per_step": wall, "split_per_step": summed, "unaccounted": (wall - summed) / wall}
