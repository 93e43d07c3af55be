"""One experiment point, at any batch size: the greedy baseline and a speculative run in one process, checked and
measured.

The checked pass (mtplab.check.lossless) holds every row to its own greedy and its own lockstep reference; then
paired rounds, the order alternating, time greedy and speculative over the whole batch (one row at batch 1). Both
sides count every row's tokens after its prefill token up to the n-th (B * (n - 1)), so a round's speedup is
greedy's seconds over speculative's. Each timed run is audited against the checked pass (mtplab.check.audit), row by
row; the published numbers are re-derived from the rounds (mtplab.measure.published); the prediction comes from the
calibration (mtplab.experiment.prediction), never from this run's times.
"""

from __future__ import annotations

import os
import time

import numpy as np

from mtplab.base.threads import use_global_pool
from mtplab.check import flags, lossless
from mtplab.check import verdict as oracle
from mtplab.check.audit import Audit, engine_problems
from mtplab.check.expected import checked_problems
from mtplab.check.lossless import Checked, row_failed
from mtplab.check.trace import Trace, plans_held
from mtplab.engine import speculative
from mtplab.engine.drafters import row_alphas
from mtplab.engine.engine import Engine
from mtplab.engine.greedy import decode_rows
from mtplab.engine.strategies import K_POLICIES
from mtplab.experiment.build import engine_for
from mtplab.experiment.config import RunConfig
from mtplab.experiment.prediction import (
    accounting,
    calibration_for,
    check_calibration,
    eager_share,
    predict_point,
    run_alpha,
    step_costs,
)
from mtplab.experiment.timing import floor_seconds, paired_rounds, plan_runs
from mtplab.measure import floor, stats, theory
from mtplab.measure import rounds as measure
from mtplab.measure.env import environment
from mtplab.measure.published import result_problems
from mtplab.measure.result import RunResult
from mtplab.model import Artifact
from mtplab.model.prompts import run_prompt, run_prompts
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
    return run_mtplab_point(run, artifact, engine, calibration)


def timed_rounds(engine: Engine, prompts: np.ndarray, n: int, plan: measure.RoundsPlan, checked: Checked) -> dict:
    """Paired rounds of greedy and speculative as the plan says, the order alternating (G S, S G, G S, ...).

    After each side (and its audit) its floor is timed: the plans it replayed, replayed bare (mtplab.measure.floor);
    while a side is beyond its band, up to floor.CONFIRM_ROUNDS more rounds run.
    Both sides count as mtplab.measure.rounds says (every row's n - 1 tokens after its prefill's token, timed from
    after the prefill; speculative's overshoot in its last step is not counted). Timed runs do only
    what their decoders do; each is audited afterwards against the checked pass (mtplab.check.audit): its
    tokens, forwards, slot activity, accepted counts, final state and clock.
    """
    audit = Audit.of(engine, n, prompts.shape[1], checked)
    got = {"spec": checked.spec, "split": {}, "row_seconds": [[] for _ in range(prompts.shape[0])]}

    def paired(r: int) -> dict:
        order = ("greedy", "speculative") if r % 2 == 0 else ("speculative", "greedy")
        sample = measure.paired_round(r, order)
        for side in order:
            trace, plans = Trace.begin(engine), plan_runs(engine)
            if side == "greedy":
                g = decode_rows(engine, prompts, n, margins=False)
                returned = time.perf_counter()
                measure.record_side(sample, side, g.tokens, n, g.seconds)
                audit.greedy(r, trace.end(engine, g.tokens), sample, g, returned)
                sample["greedy_floor_seconds"], sample["greedy_floor_share"] = floor_seconds(engine, plans, g.decodes)
            else:
                spec = got["spec"] = speculative.generate(engine, prompts, n, checked.greedy.tokens)
                returned = time.perf_counter()
                measure.record_side(sample, side, spec.tokens, n, spec.seconds)
                sample["steps"] = spec.steps
                audit.speculative(r, trace.end(engine, spec.tokens, spec.accepted, spec.ks), sample, spec, returned)
                sample["floor_seconds"], sample["floor_share"] = floor_seconds(engine, plans)
                got["split"] = {key: got["split"].get(key, 0.0) + v for key, v in spec.split.items()}
                for b, s in enumerate(spec.finished):
                    got["row_seconds"][b].append(s)
        return measure.close_round(sample)

    return {"samples": paired_rounds(plan, paired), "audit": audit, **got}


def run_mtplab_point(
    run: RunConfig, artifact: Artifact | None = None, engine: Engine | None = None, calibration: dict | None = None
) -> RunResult:
    """The checked pass, then `run.rounds` paired timed rounds of the whole batch, in one RunResult.

    The checked pass (untimed) runs first and warms every plan up; its counters are the point's
    slot counters. The speedup is the median of the rounds' paired ratios, with a bootstrap CI.
    """
    check_calibration(run, calibration)
    engine = engine_for(run, artifact, engine)
    desc, k, n = engine.desc, run.k, run.tokens
    prompts = run_prompts(run, desc.vocab_size)
    calibration = on_the_copy(engine, calibration if calibration is not None else calibration_for(run))
    if K_POLICIES.get(run.k_policy).needs_costs:  # the policy prices each K with the calibration, before any run
        engine.k_costs = step_costs(run, calibration)
    built = [f"the engine: {p}" for p in engine_problems(engine)]  # it runs what the config says
    built += row_prompt_problems(run, prompts, desc.vocab_size)
    # Untimed first: the greedy reference and the checked speculative run (it also warms every plan up).
    checked = lossless.checked_pass(engine, prompts, n)
    built += [f"the checked speculative run: {p}"
              for p in checked_problems(engine, checked.spec_trace, prompts.shape[1], checked.spec.widths)]
    # Timed: paired rounds; they do only what the decoders they measure do, and are audited after each run.
    primary = engine.target.state[Slot.PRIMARY]
    fallbacks = primary.fallbacks
    timed_before = _counters(engine)
    plan = measure.RoundsPlan.of(run)
    timed = timed_rounds(engine, prompts, n, plan, checked)
    timed_slots = _diff(_counters(engine), timed_before)
    audit = timed["audit"].summary()
    audit["problems"] = built + audit["problems"]
    audit["problem_count"] += len(built)
    samples, spec, slots = timed["samples"], timed["spec"], checked.spec_trace.counters()
    alpha, alpha_source = run_alpha(run, calibration, checked.spec)
    predicted, described = predict_point(run, calibration, alpha, alpha_source, spec,
                                         eager_share(slots, engine.target.labels))
    tracked = checked.spec.expected_acceptance  # a sampled run's sum(min(p, q)) per judged draft, rows pooled
    sampled = theory.sampled_acceptance(flat(checked.spec.accepted), k, tracked, run.schedule,
                                        flat(checked.spec.ks)) if tracked else None
    split = {key: v / len(samples) for key, v in timed["split"].items()}  # per speculative run
    accepted, ks = flat(spec.accepted), flat(spec.ks)  # rows pooled
    generated = sum(len(t) - 1 for t in spec.tokens)  # after each row's prefill token, overshoot included
    acceptance = measure.acceptance(len(accepted), int(sum(accepted)), int(sum(ks)), generated, accepted, k, ks)
    result = measure.run_result(
        samples,
        n,
        acceptance,
        predicted=predicted,
        config=run.to_dict(),
        model=engine.art.identity(),
        prompt=[int(t) for t in prompts[0]],
        tokens=checked.greedy.tokens[0][:n],
        forwards=checked.spec_trace.forwards,
        time_split=split,
        slots=slots,
        greedy_slots=checked.spec_trace.counters_before(),
        slot_reasons={engine.target.labels[s]: st.reason for s, st in engine.target.state.items()},
        arena={name: a.stats() for name, a in engine.arenas.items()}
        | ({"cuda_graphs": graphs} if (graphs := engine.device.graph_stats()) else {}),
        identity=checked.identity | {"timed_audit": audit} | ({"per_row": checked.rows} if run.batch > 1 else {}),
        theory=described | ({"sampled_acceptance": sampled} if sampled else {}),
        env=environment(run.backend, run.threads) | {"loadavg": list(os.getloadavg()), "measured_at": time.time()},
        extra={
            "greedy_baseline": baseline_words(run, engine, primary.fallbacks != fallbacks),
            "timed_slots": timed_slots,
            "calibration": calibration["key"],
            "calibration_measured": {"at": calibration.get("measured_at"), "load": calibration.get("load"),
                                     "source": calibration.get("source", "cached on this machine")},
            "accounting": accounting(samples, split, spec.steps),
            "rounds": plan.outcome,
            "floor": {side: floor.side_summary(samples, side) for side in floor.SIDES},
            **commit_memory(engine),
            "plans": plans_held(engine),
        } | ({"batch": batch_fields(run, prompts, checked, samples, timed["row_seconds"], acceptance)}
             if run.batch > 1 else {}),
    )
    result.suspect = floor.floor_problems(samples)
    published = [f"the published numbers: {p}" for p in result_problems(result, n, k, generated)]
    audit["problems"] += published
    audit["problem_count"] += len(published)
    ok, verdict = oracle.verdict(checked.identity)
    if ok and audit["problems"]:
        more = audit["problem_count"] - 1
        ok, verdict = False, "RUN CHECK FAILED: " + audit["problems"][0] + (
            f" (and {more} more difference{'s' if more > 1 else ''})" if more else "")
    if not ok:
        oracle.shout(verdict)
    result.lossless, result.verdict = ok, verdict
    result.warnings = point_warnings(run, engine, result, checked, calibration, audit, sampled)
    return result


def point_warnings(run: RunConfig, engine: Engine, result: RunResult, checked: Checked, calibration: dict,
                   audit: dict, sampled: dict | None) -> list[dict]:
    """The point's named warnings (mtplab.check.flags), and those of a row or a padded plan that a precision's
    rounding can take apart from its twin."""
    k = run.k
    # the acceptance warnings' laws are a fixed k's: a draft-length policy's steps are not held to them
    fixed_k = all(j == k for j in flat(checked.spec.ks))
    alphas = row_alphas(run.alpha, run.batch)
    out = flags.point_warnings(
        result.efficiency, result.extra["accounting"]["unaccounted"], run.drafter,
        flat(checked.spec.accepted) if fixed_k else [], k,
        None if run.temperature > 0 else calibration, audit,  # the calibration's acceptance is greedy's
        # sampled: alpha bounds the mixture's acceptance; else alpha^i is its law (one for every row, or none)
        alpha=alphas[0] if len(set(alphas)) == 1 else None, sampled=sampled,
        greedy_decode_seconds=measure.rate(run.batch, result.greedy_tokens_per_s),
    )
    twin = checked.identity.get("padded_twin")  # in fp16 an M = k + 1 verify may round a draw's boundary apart
    if twin and not twin["identical"] and not twin["exact"]:
        out.append(flags.warning("padded_apart", "its padded Verify plan's run differs from a plan per "
                                 f"length's from token {twin['first_divergence']} ({engine.desc.precision})"))
    for b, row in enumerate(checked.rows):  # in a precision whose [B, M] forward rounds apart, a draw may flip
        alone = row.get("batch_one")
        if alone and not alone["identical"] and not alone["exact"]:
            where = (f"tokens differ from its batch-1 run from token {alone['first_divergence']}"
                     if alone["first_divergence"] is not None else
                     f"accepted count or K differs from its batch-1 run's at step {alone['first_step'] + 1}")
            out.append(flags.warning(
                "row_apart_from_batch_one", f"row {b}'s {where} ({engine.desc.precision}: a [B, M] forward rounds "
                "apart from a [1, M] one, and a draw or a near-tie at a boundary can go either way)"))
    return out


def batch_fields(run: RunConfig, prompts: np.ndarray, checked: Checked, samples: list[dict],
                 row_seconds: list[list[float]], acceptance: dict) -> dict:
    """A batch's own fields: its steps per run, the share of its row-steps spent on rows that had their tokens (the
    slowest row's cost), and every row's seed, alpha, prompt, tokens, acceptance, tokens/s and checks."""
    spec, n, alphas = checked.spec, run.tokens, row_alphas(run.alpha, run.batch)
    row_steps = [len(a) for a in spec.accepted]
    return {
        "rows": run.batch,
        "steps": spec.steps,  # the batch's steps per timed run (each runs every row); `steps` counts row-steps
        "riding_share": 1.0 - sum(row_steps) / (run.batch * spec.steps) if spec.steps else None,
        "per_row": [{
            "row": b,
            "seed": run.seed + b,
            "alpha": alphas[b] if run.drafter == "oracle" else None,
            "prompt": [int(t) for t in prompts[b]],
            "tokens": checked.greedy.tokens[b][:n],
            "steps": row_steps[b],
            "acceptance_length": 1.0 + (float(np.mean(spec.accepted[b])) if spec.accepted[b] else 0.0),
            "tokens_per_s": stats.median([measure.rate(n - 1, s) for s in row_seconds[b]]),
            "lossless": row_lossless(checked.rows[b]),
        } for b in range(run.batch)],
        "step_seconds": stats.median([s["seconds"] / s["steps"] for s in samples if s.get("steps")]),
        "pooled_acceptance_length": acceptance["acceptance_length"],
    }


def baseline_words(run: RunConfig, engine: Engine, went_eager: bool) -> str:
    """How the greedy baseline ran, in words."""
    words = "paired rounds" + (f", {'greedy' if run.temperature == 0 else f'plain sampling at T={run.temperature:g}'}"
                               f" at [B={run.batch}, 1]" if run.batch > 1 else "")
    if went_eager:  # the Primary slot lost its plan for good (CUDA graph ids spent)
        words += "; the Primary slot ran eager in some of them"
    if engine.primary_runs_copy:  # the target is mtplab's copy (select's outputs, or per-position's If)
        words += "; greedy on mtplab's copy of the graph (one session holds both slots), paying for what it adds"
    elif engine.desc.original_target is not None:
        words += "; greedy on your own graph"
    return words


def on_the_copy(engine: Engine, calibration: dict) -> dict:
    """The calibration as the point's engine runs it: where its Primary slot runs mtplab's copy of the graph, the
    copy's costs (theory.on_the_copy)."""
    return theory.on_the_copy(calibration, engine.spec.commit) if engine.primary_runs_copy else calibration


def flat(rows: list[list]) -> list:
    """Every row's values, pooled in row order."""
    return [x for row in rows for x in row]


def commit_memory(engine) -> dict:
    """What the run's commit holds beyond what every commit does: per-position's states, written by each verify."""
    from mtplab.model.per_position import states_bytes

    io = engine.desc.target
    if not io.position_states:
        return {}
    layers = len(io.position_states)
    return {"per_position": {"states_per_verify": engine.spec.k, "layers": layers,
                             "state_bytes": states_bytes(engine.desc, 1) // layers,  # one layer's, one row's
                             "bytes": states_bytes(engine.desc, engine.spec.k, engine.batch)}}


def row_prompt_problems(run: RunConfig, prompts: np.ndarray, vocab: int) -> list[str]:
    """Where a row's prompt is not the batch-1 prompt of its own seed (seed + row): the check would follow the rows
    through the prompts the engine was given, so each is held to the one a batch-1 run of its seed takes."""
    own = [run_prompt(run, vocab, run.seed + b) for b in range(run.batch)]
    return [f"row {b} decoded another prompt than its seed's ({run.seed + b}): {list(map(int, prompts[b]))[:6]}... "
            f"where a batch-1 run of that seed takes {own[b][:6]}..." for b in range(run.batch)
            if list(map(int, prompts[b])) != own[b]]


def row_lossless(row: dict) -> bool:
    """A row's own checks passed (lossless.row_failed: its tokens, committed state, anchor, head, batch-1 run), and its
    reference's argmax agreed with its tokens where not a near-tie."""
    return not row_failed(row) and not row["reference_disagreements"]
