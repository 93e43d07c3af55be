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
from mtplab.check.trace import Trace
from mtplab.engine.engine import Engine
from mtplab.engine.k_policies import StepCosts
from mtplab.engine.strategies import DRAFTERS, K_POLICIES, SCHEDULES
from mtplab.experiment import config
from mtplab.experiment.config import RunConfig
from mtplab.experiment.shared import acceptance_alpha, engine_for
from mtplab.measure import rounds as measure
from mtplab.measure import theory
from mtplab.measure.env import environment
from mtplab.measure.published import result_problems
from mtplab.measure.result import RunResult, engine_steps
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
    samples, split, accepted, ks, generated = [], {}, [], [], 0
    for r in plan.rounds(samples):
        order = ("greedy", "speculative") if r % 2 == 0 else ("speculative", "greedy")
        sample = measure.paired_round(r, order)
        for side in order:
            trace = Trace.begin(engine)
            if side == "greedy":
                g = engine.greedy(prompt, n, margins=False)
                returned = time.perf_counter()
                measure.record_side(sample, side, g.tokens, n, g.seconds)
                audit.greedy(r, trace.end(engine, g.tokens), sample, g, returned)
            else:
                spec = engine.speculative(prompt, n, reference=checked.greedy.tokens)
                returned = time.perf_counter()
                measure.record_side(sample, side, spec["tokens"], n, spec["seconds"])
                sample["steps"] = len(spec["accepted"])
                accepted, ks = spec["accepted"], spec.get("k", [engine.k] * len(spec["accepted"]))
                audit.speculative(r, trace.end(engine, spec["tokens"], accepted, ks), sample, spec["started"],
                                  spec["seconds"], returned)
                split = {key: split.get(key, 0.0) + v for key, v in spec["split"].items()}
                generated = len(spec["tokens"]) - 1  # after the prefill's token, overshoot included
        samples.append(measure.close_round(sample))
    return {"samples": samples, "audit": audit, "split": split, "accepted": accepted, "ks": ks, "generated": generated}


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
        engine.k_costs = step_costs(run, calibration if not engine.primary_runs_copy else theory.on_the_copy(calibration))
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
    if engine.desc.original_target is not None:  # the target is mtplab's copy with select's outputs
        baseline += ("; greedy on mtplab's copy of your graph (one session holds both slots), paying for its extra "
                     "outputs" if engine.primary_runs_copy else "; greedy on your own graph")
    samples = timed["samples"]
    steps = len(timed["accepted"])
    calibration = calibration if calibration is not None else calibration_for(run)
    if engine.primary_runs_copy:
        calibration = theory.on_the_copy(calibration)
    alpha, alpha_source = acceptance_alpha(run, calibration, checked.spec["accepted"], checked.spec["k"])
    # k beyond the calibration's verify sizes (1..8, a builder model's k may exceed them): no prediction
    share = eager_share(slots, engine.target.labels)
    predicted = theory.predict(alpha, k, run.schedule, run.commit, calibration, tokens=n, eager_share=share) if (
        alpha is not None and theory.covers(calibration, k, run.commit)) else None
    # the efficiency's prediction: the same costs for the steps the timed rounds made (the audit holds every round
    # to the checked run's accepted counts)
    varied = timed["ks"] if any(j != k for j in timed["ks"]) else k  # each step priced at its own K
    priced = theory.predict_steps(timed["accepted"], varied, run.schedule, run.commit, calibration, n, share) if (
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
        } if alpha is not None else {"alpha_source": alpha_source}) | ({"sampled_acceptance": sampled} if sampled else {}),
        env=environment(run.backend, run.threads) | {"loadavg": list(os.getloadavg()), "measured_at": time.time()},
        extra={
            "greedy_baseline": baseline,
            "timed_slots": timed_slots,
            "calibration": calibration["key"],
            "calibration_measured": {"at": calibration.get("measured_at"), "load": calibration.get("load"),
                                     "source": calibration.get("source", "cached on this machine")},
            "accounting": accounting(samples, split, steps),
            "rounds": plan.outcome,
        },
    )
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
    return result


def k_histogram_text(ks: list[int]) -> str:
    """A run's drafts per step as counts: 'K=1 x3, K=4 x11'."""
    return ", ".join(f"K={j} x{ks.count(j)}" for j in sorted(set(ks)))


def step_costs(run: RunConfig, calibration: dict) -> StepCosts:
    """What a draft-length policy prices a step at K (1..k) with: the calibration's decode, draft and verify at K and
    its commit of n tokens (ValueError where it did not measure k + 1 tokens)."""
    if not theory.covers(calibration, run.k, run.commit):
        raise ValueError(f"k_policy={run.k_policy!r} prices steps of up to k={run.k} drafts, beyond what the "
                         f"calibration measured (its verify sizes {sorted(int(m) for m in calibration['target'])}): "
                         "give a smaller k, or k_policy='fixed'")
    commits = {int(m): float(s) for m, s in calibration["commit"][run.commit].items()}
    return StepCosts({j: theory.step_seconds(j, run.schedule, run.commit, calibration) for j in range(1, run.k + 1)},
                     commits, SCHEDULES.get(run.schedule).extra_tokens)


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


def drafter_text(c: dict) -> str:
    """A stored config's drafter with its parameters, in words (the name alone for a drafter not registered here)."""
    kind = DRAFTERS.find(c["drafter"])
    return kind.text(c) if kind is not None else c["drafter"]


def _ci(ci, fmt: str) -> str:
    lo, hi = (float("nan") if v is None else v for v in ci) if ci else (float("nan"), float("nan"))
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def rounds_outcome_text(plan: dict) -> str:
    """How an auto-sized point's rounds ended, in words."""
    width = plan.get("half_width")
    reached = f"{width:.1%}" if width is not None and width == width else "none (one round)"
    seconds = plan["seconds"]
    took = f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
    return (f"{plan['stopped']} after {plan['rounds']} rounds in {took} (speedup interval "
            f"half-width {reached}, target {plan['target']:.0%}, budget {plan['budget_s']:.0f} s)")


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def result_text(r: RunResult, verbose: bool = False) -> str:
    """One RunResult as text: throughput, acceptance, per-slot counters in the seed's form, identity (verbose: the
    identity check's details under its one line)."""
    c = r.config
    # the baseline is what the target alone decodes: greedy, or plain sampling at the run's temperature
    baseline = f"sampling T={c['temperature']:g}" if c.get("temperature", 0) > 0 else "greedy"
    lines = [
        f"mtplab run  engine={c['engine']} model={r.model.get('name', config.upgrade(c)['model'])} k={c['k']} "
        + (f"k_policy={c['k_policy']} " if c.get("k_policy", "fixed") != "fixed" else "")
        + f"drafter={drafter_text(c)}"
        + (f" policy={c['policy']} commit={c['commit']} schedule={c['schedule']}" if c["engine"] == "mtplab" else "")
        + f" tokens={c['tokens']} backend={c['backend']}"
        + (f" batch={c['batch']}" if c.get("batch", 1) > 1 else "")
        + (f" acceptance={c['acceptance']} temperature={c['temperature']:g} top_k={c['top_k']} top_p={c['top_p']:g} "
           f"sample_seed={c['sample_seed']}" if c.get("temperature", 0) > 0 else ""),
        f"  {baseline:<16} {r.greedy_tokens_per_s:8.1f} tok/s {_ci(r.greedy_tokens_per_s_ci, '.1f')}",
        f"  {'speculative':<16} {r.tokens_per_s:8.1f} tok/s {_ci(r.tokens_per_s_ci, '.1f')}",
        f"  speedup {r.speedup:.2f}x {_ci(r.speedup_ci, '.2f')}   {len(r.round_samples)} paired "
        + ("round" if len(r.round_samples) == 1 else "rounds")
        + ("" if r.stable else "   no CI from one round" if len(r.round_samples) < 2
           else "   UNSTABLE (CI half-width > 5% of the median)"),
    ]
    if (plan := r.extra.get("rounds") or {}).get("mode") == "auto":
        lines.append(f"  rounds auto: {rounds_outcome_text(plan)}")
    if r.predicted:
        when = r.extra.get("calibration_measured") or {}
        at_alpha = r.predicted.get("at_alpha")  # absent: a batch point's, priced at alpha alone
        source = r.theory.get("alpha_source", "its source unrecorded")
        lines.append(
            (f"  predicted {r.predicted['speedup']:.2f}x from the calibration for the steps it made ({at_alpha:.2f}x at "
             f"alpha {r.predicted['alpha']:.2f}, {source})" if at_alpha is not None else
             f"  predicted {r.predicted['speedup']:.2f}x from the calibration at alpha {r.predicted['alpha']:.2f} ({source})")
            + f"   efficiency {r.efficiency:.2f} {_ci(r.efficiency_ci, '.2f')}"
            + (f"   (calibration: {when.get('source', 'cached on this machine')}, measured {when.get('at')}, load "
               f"{when.get('load')})" if when else "")
        )
    lines += [
        f"  tokens/step {r.tokens_per_step:.2f}"
        + (f" (theory{' at K=k every step' if r.k_per_step else ''} {r.theory['tokens_per_step']:.2f}"
           + (", from the alpha fitted to this run" if "sampled_acceptance" in r.theory else "") + ")"
           if "tokens_per_step" in r.theory else "")
        + "   acceptance length "
        f"{r.acceptance_length:.2f}   draft acceptance {r.draft_acceptance:.1%}",
        "    (tokens/step: tokens emitted per step, a decode-verify step's decode included; acceptance length: 1 + the"
        " drafts a verify keeps, vLLM's measure; draft acceptance: drafts kept / drafted)",
    ]
    if r.acceptance_per_position:  # the peer reports neither
        deepest = max(r.k_per_step) if r.k_per_step else len(r.acceptance_per_position)  # "-": no step drafted it
        lines.append("  per position P(accepted>=i): " + " ".join(
            f"{p:.2f}" if i < deepest else "-" for i, p in enumerate(r.acceptance_per_position))
                     + (" (over the steps that drafted position i)" if r.k_per_step else ""))
    if r.k_per_step:
        lines.append(f"  drafts per step (k_policy {c.get('k_policy')}, last timed run): {k_histogram_text(r.k_per_step)};"
                     f" mean K {sum(r.k_per_step) / len(r.k_per_step):.2f}")
    if sa := r.theory.get("sampled_acceptance"):
        lines.append(f"  rejection sampling (checked run): kept {sa['kept']} of {sa['judged']} judged drafts (a draft is "
                     "judged when the ones before it were kept: the per-position rate), "
                     f"{_share(sa['measured'])} against an expected sum(min(p, q)) of {_share(sa['expected'])}; "
                     f"tokens/step {sa['measured_tokens_per_step']:.2f} against {sa['expected_tokens_per_step']:.2f} "
                     "from the expected per-position rates")
    if rows := (r.extra.get("batch") or {}).get("per_row"):
        lines.append(f"  batch of {len(rows)}: a step takes {r.extra['batch']['step_seconds'] * 1e3:.2f} ms; per row "
                     "(its own prompt seed, acceptance and commit; greedy's tokens/s above count every row):")
        lines += [f"    row {p['row']} seed {p['seed']}: {p['tokens_per_s']:.1f} tok/s until it had its tokens, "
                  f"{p['steps']} steps, acceptance length {p['acceptance_length']:.2f}"
                  + ("" if p["lossless"] else "   NOT LOSSLESS") for p in rows]
    if r.time_split:
        steps = engine_steps(r)
        per_step = 1e3 / steps if steps else 1e3
        lines.append(f"  time split, ms per {'step' if steps else 'run'}: "
                     + " ".join(f"{k}={v * per_step:.3f}" for k, v in r.time_split.items()))
    if r.slots and r.extra.get("batch"):
        lines.append("  slot counters of the checked pass (its greedy reference and speculative run, every row):")
    elif r.slots:
        lines.append("  slot counters of the checked speculative run (the greedy reference run before it had already "
                     "captured the Primary plan: primary captures=0):")
    for slot, counters in r.slots.items():
        lines.append(
            f"  {slot}: "
            + " ".join(f"{k}={v}" for k, v in counters.items())
            + (f"   [{r.slot_reasons[slot]}]" if r.slot_reasons.get(slot) else "")
        )
    for w in r.warnings:
        lines.append(f"  WARNING {w['name']}: {w['message']}")
    lines.append(("  OK: " if r.lossless else "  FAIL: ") + r.verdict)
    if verbose:
        lines += [f"    {line}" for line in oracle.details(r.identity)]
    return "\n".join(lines)
