"""One experiment point: the greedy baseline and a speculative run in one process, checked and measured."""

from __future__ import annotations

import os
import time

import numpy as np

from mtplab.base.threads import use_global_pool
from mtplab.check import flags, lossless
from mtplab.check import verdict as oracle
from mtplab.check.audit import Audit, engine_problems
from mtplab.check.expected import checked_problems
from mtplab.check.trace import Trace, plans_held
from mtplab.engine.engine import Engine
from mtplab.engine.strategies import K_POLICIES
from mtplab.experiment.config import RunConfig
from mtplab.experiment.shared import acceptance_alpha, commit_memory, engine_for, step_costs
from mtplab.experiment.timing import floor_seconds, paired_rounds, plan_runs
from mtplab.measure import floor, theory
from mtplab.measure import rounds as measure
from mtplab.measure.env import environment
from mtplab.measure.published import result_problems
from mtplab.measure.result import RunResult
from mtplab.model import Artifact
from mtplab.model.prompts import run_prompt
from mtplab.runtime.executor import Slot


def _diff(after: dict, before: dict) -> dict:
    return {slot: {k: v - before.get(slot, {}).get(k, 0) for k, v in c.items()} for slot, c in after.items()}


def _counters(engine: Engine) -> dict:
    return engine.target.counters() | engine.mtp.counters()


def dedicate_process(run: RunConfig) -> None:
    """This process runs `run` only (a sweep point's kernel, `mtplab run`): mtplab's sessions then share one
    onnxruntime thread pool (mtplab.base.threads). So do those of the greedy a peer point times beside
    onnxruntime-genai's, as in mtplab's own points (on per-session pools it ran 0.78-0.85x genai's on small at 2
    threads instead of 0.96-0.97x); genai's sessions keep their own pools."""
    use_global_pool(run.threads)


def run_point(
    run: RunConfig, artifact: Artifact | None = None, engine: Engine | None = None, calibration: dict | None = None
) -> RunResult:
    """One point on the engine the config names: mtplab's own, or the onnxruntime-genai peer."""
    if run.engine == "ort-genai":
        from mtplab.experiment.genai_point import run_genai_point

        return run_genai_point(run, artifact)
    if run.batch > 1:
        from mtplab.experiment.batch_point import run_batch_point

        return run_batch_point(run, artifact, engine, calibration)
    return run_mtplab_point(run, artifact, engine, calibration)


def timed_rounds(engine: Engine, prompt: list[int], n: int, plan: measure.RoundsPlan, checked: lossless.Checked) -> dict:
    """Paired rounds of greedy and speculative as the plan says, the order alternating (G S, S G, G S, ...).

    After each side (and its audit) its floor is timed: the plans it replayed, replayed bare (mtplab.measure.floor);
    while a side is beyond its band, up to floor.CONFIRM_ROUNDS more rounds run.
    Both sides count as mtplab.measure.rounds says (the n - 1 tokens after the prefill's token, timed from
    after the prefill; speculative's overshoot in its last step is not counted). Timed runs do only
    what their decoders do; each is audited afterwards against the checked pass (mtplab.check.audit): its
    tokens, forwards, slot activity, accepted counts, final state and clock.
    """
    audit = Audit(
        engine, n, len(prompt), checked.greedy.tokens, checked.spec_trace, checked.spec_state, checked.greedy_state,
        oracle.state_rule(None, engine.desc.precision, engine.device.name == "cpu"),
        oracle.STATE_RTOL[engine.desc.precision],
    )
    got = {"split": {}, "accepted": [], "ks": [], "generated": 0}

    def paired(r: int) -> dict:
        order = ("greedy", "speculative") if r % 2 == 0 else ("speculative", "greedy")
        sample = measure.paired_round(r, order)
        for side in order:
            trace, plans = Trace.begin(engine), plan_runs(engine)
            if side == "greedy":
                g = engine.greedy(prompt, n, margins=False)
                returned = time.perf_counter()
                measure.record_side(sample, side, g.tokens, n, g.seconds)
                audit.greedy(r, trace.end(engine, g.tokens), sample, g, returned)
                sample["greedy_floor_seconds"], sample["greedy_floor_share"] = floor_seconds(engine, plans, g.decodes)
            else:
                spec = engine.speculative(prompt, n, reference=checked.greedy.tokens)
                returned = time.perf_counter()
                measure.record_side(sample, side, spec["tokens"], n, spec["seconds"])
                sample["steps"] = len(spec["accepted"])
                got["accepted"], got["ks"] = spec["accepted"], spec.get("k", [engine.k] * len(spec["accepted"]))
                audit.speculative(r, trace.end(engine, spec["tokens"], got["accepted"], got["ks"]), sample,
                                  spec["started"], spec["seconds"], returned)
                sample["floor_seconds"], sample["floor_share"] = floor_seconds(engine, plans)
                got["split"] = {key: got["split"].get(key, 0.0) + v for key, v in spec["split"].items()}
                got["generated"] = len(spec["tokens"]) - 1  # after the prefill's token, overshoot included
        return measure.close_round(sample)

    return {"samples": paired_rounds(plan, paired), "audit": audit, **got}


def calibration_for(run: RunConfig, say=print) -> dict:
    """The cached cost-model calibration for the run's model, this machine and threads (measured when missing)."""
    from mtplab.experiment.calibrate import load_or_measure

    return load_or_measure(run.model, say=say, threads=run.threads, int4=run.int4)


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


def run_mtplab_point(
    run: RunConfig, artifact: Artifact | None = None, engine: Engine | None = None, calibration: dict | None = None
) -> RunResult:
    """The lossless check, then `run.rounds` paired timed rounds, in one RunResult.

    The checked pass (untimed) runs first and warms every plan up; its counters are the point's
    slot counters. The speedup is the median of the rounds' paired ratios, with a bootstrap CI.
    The prediction comes from the calibration (`mtplab.experiment.calibrate`), never from this run's times.
    A batch (run.batch > 1) runs mtplab.experiment.batch_point instead.
    """
    if run.batch > 1:
        raise ValueError(f"batch={run.batch}: run_point runs it (mtplab.experiment.batch_point); this runs batch 1")
    engine = engine_for(run, artifact, engine)
    desc, k, n = engine.desc, run.k, run.tokens
    prompt = run_prompt(run, desc.vocab_size)
    if K_POLICIES.get(run.k_policy).needs_costs:  # the policy prices each K with the calibration, before any run
        calibration = calibration if calibration is not None else calibration_for(run)
        engine.k_costs = step_costs(run, calibration if not engine.primary_runs_copy else theory.on_the_copy(calibration,
                                                                                                            run.commit))
    built = [f"the engine: {p}" for p in engine_problems(engine)]  # it runs what the config says
    # Untimed first: the greedy reference and the checked speculative run (it also warms every plan up).
    checked = lossless.checked_pass(engine, prompt, n)
    built += [f"the checked speculative run: {p}" for p in checked_problems(engine, checked.spec_trace, len(prompt))]
    reference, identity = checked.greedy, checked.identity
    greedy_slots = checked.spec_trace.counters_before()
    slots = checked.spec_trace.counters()
    forwards = checked.spec_trace.forwards
    # Timed: paired rounds; they do only what the decoders they measure do, and are audited after each run.
    primary = engine.target.state[Slot.PRIMARY]
    fallbacks = primary.fallbacks
    timed_before = _counters(engine)
    plan = measure.RoundsPlan.of(run)
    timed = timed_rounds(engine, prompt, n, plan, checked)
    timed_slots = _diff(_counters(engine), timed_before)
    audit = timed["audit"].summary()
    audit["problems"] = built + audit["problems"]
    audit["problem_count"] += len(built)
    baseline = "paired rounds"
    if primary.fallbacks != fallbacks:  # the Primary slot lost its plan for good (CUDA graph ids spent)
        baseline = "paired rounds; the Primary slot ran eager in some of them"
    if engine.primary_runs_copy:  # the target is mtplab's copy (select's outputs, or per-position's If)
        baseline += "; greedy on mtplab's copy of the graph (one session holds both slots), paying for what it adds"
    elif engine.desc.original_target is not None:
        baseline += "; greedy on your own graph"
    samples = timed["samples"]
    steps = len(timed["accepted"])
    calibration = calibration if calibration is not None else calibration_for(run)
    if engine.primary_runs_copy:
        calibration = theory.on_the_copy(calibration, run.commit)
    alpha, alpha_source = acceptance_alpha(run, calibration, checked.spec["accepted"], checked.spec["k"])
    # k beyond the calibration's verify sizes (1..8, a builder model's k may exceed them): no prediction
    share = eager_share(slots, engine.target.labels)
    predicted = theory.predict(alpha, k, run.schedule, run.commit, calibration, tokens=n, eager_share=share) if (
        alpha is not None and theory.covers(calibration, k, run.commit)) else None
    not_predicted = None if predicted else (
        f"no acceptance to price it at: {alpha_source}" if alpha is None else
        f"the calibration measured verifies of up to M={max(int(m) for m in calibration['target'])} and commits "
        f"{', '.join(sorted(calibration['commit']))}; this run verifies at M={k + 1} with commit={run.commit}")
    # the efficiency's prediction: the same costs for the steps the timed rounds made (the audit holds every round
    # to the checked run's accepted counts)
    varied = timed["ks"] if any(j != k for j in timed["ks"]) else k  # each step priced at its own K
    priced = theory.predict_steps(timed["accepted"], varied, run.schedule, run.commit, calibration, n, share,
                                  k if run.verify_plans == "padded" else None) if (
        predicted and timed["accepted"] and n > 1) else None
    tracked = checked.spec.get("expected_acceptance")  # a sampled run's sum(min(p, q)) per judged draft
    sampled = theory.sampled_acceptance(checked.spec["accepted"], k, tracked, run.schedule,
                                        checked.spec["k"]) if tracked else None
    split = {key: v / len(samples) for key, v in timed["split"].items()}  # per speculative run
    acceptance = measure.acceptance(
        steps, int(sum(timed["accepted"])), int(sum(timed["ks"])), timed["generated"], timed["accepted"], k, timed["ks"]
    )
    result = measure.run_result(
        samples,
        n,
        acceptance,
        predicted=predicted_fields(priced, predicted, alpha),
        config=run.to_dict(),
        model=engine.art.identity(),
        prompt=prompt,
        tokens=reference.tokens[:n],
        forwards=forwards,
        time_split=split,
        slots=slots,
        greedy_slots=greedy_slots,
        slot_reasons={engine.target.labels[s]: st.reason for s, st in engine.target.state.items()},
        arena={name: a.stats() for name, a in engine.arenas.items()}
        | ({"cuda_graphs": graphs} if (graphs := engine.device.graph_stats()) else {}),
        identity=identity | {"timed_audit": audit},
        theory=(predicted or {}) | ({
            "acceptance_length": theory.acceptance_length(alpha, k),
            "acceptance_per_position": theory.per_position(alpha, k),
            "alpha_source": alpha_source,
        } if alpha is not None else {"alpha_source": alpha_source}) | ({"sampled_acceptance": sampled} if sampled else {})
        | ({"not_predicted": not_predicted} if not_predicted else {}),
        env=environment(run.backend, run.threads) | {"loadavg": list(os.getloadavg()), "measured_at": time.time()},
        extra={
            "greedy_baseline": baseline,
            "timed_slots": timed_slots,
            "calibration": calibration["key"],
            "calibration_measured": {"at": calibration.get("measured_at"), "load": calibration.get("load"),
                                     "source": calibration.get("source", "cached on this machine")},
            "accounting": accounting(samples, split, steps),
            "rounds": plan.outcome,
            "floor": {side: floor.side_summary(samples, side) for side in floor.SIDES},
            **commit_memory(engine),
            "plans": plans_held(engine),
        },
    )
    result.suspect = floor.floor_problems(samples)
    published = [f"the published numbers: {p}" for p in result_problems(result, n, k, timed["generated"])]
    audit["problems"] += published
    audit["problem_count"] += len(published)
    ok, verdict = oracle.verdict(identity)
    if ok and audit["problems"]:
        more = audit["problem_count"] - 1
        ok, verdict = False, "RUN CHECK FAILED: " + audit["problems"][0] + (
            f" (and {more} more difference{'s' if more > 1 else ''})" if more else "")
    if not ok:
        oracle.shout(verdict)
    result.lossless, result.verdict = ok, verdict
    # the acceptance warnings' laws are a fixed k's: a draft-length policy's steps are not held to them
    fixed_k = not any(j != k for j in checked.spec["k"])
    result.warnings = flags.point_warnings(
        result.efficiency, result.extra["accounting"]["unaccounted"], run.drafter,
        checked.spec["accepted"] if fixed_k else [], k,
        None if run.temperature > 0 else calibration, audit,  # the calibration's acceptance is greedy's
        alpha=run.alpha, sampled=sampled,  # sampled: alpha bounds the mixture's acceptance; else alpha^i is its law
        greedy_decode_seconds=measure.rate(1, result.greedy_tokens_per_s),
    )
    twin = checked.identity.get("padded_twin")  # in fp16 an M = k + 1 verify may round a draw's boundary apart
    if twin and not twin["identical"] and not twin["exact"]:
        result.warnings.append(flags.warning("padded_apart", "its padded Verify plan's run differs from a plan per "
                                             f"length's from token {twin['first_divergence']} ({engine.desc.precision})"))
    return result


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
