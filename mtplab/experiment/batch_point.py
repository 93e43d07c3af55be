"""One batch point (run.batch = B > 1): greedy at [B, 1] against speculative with per-row acceptance and commit.

The checked pass (mtplab.check.batch) holds every row to its own greedy and its own lockstep reference; then
paired rounds, the order alternating, time greedy and speculative over the whole batch. Both sides count
every row's tokens after its prefill token up to the n-th (B * (n - 1)), so a round's speedup is greedy's
seconds over speculative's. Each timed run must repeat the checked run's tokens and accepted counts, row by
row, and do the work its side does (mtplab.check.batch.timed_problems); the published numbers are re-derived
from the rounds (mtplab.measure.published). The prediction comes from the batch calibration (T(B, M),
mtplab.experiment.batch_calibrate).
"""

from __future__ import annotations

import os
import time

import numpy as np

from mtplab.check import flags
from mtplab.check import verdict as oracle
from mtplab.check.audit import clock_problems, engine_problems
from mtplab.check.batch import batch_one_failed, checked_batch, finish_problems, timed_problems, timed_state_problems
from mtplab.check.expected import chosen_problems, oracle_draw_problems
from mtplab.check.trace import Trace
from mtplab.engine import speculative
from mtplab.engine.drafters import row_alphas
from mtplab.engine.engine import Engine
from mtplab.engine.greedy import decode_rows
from mtplab.engine.strategies import K_POLICIES
from mtplab.experiment.config import RunConfig
from mtplab.experiment.shared import acceptance_alpha, commit_memory, engine_for, step_costs
from mtplab.experiment.timing import floor_seconds, paired_rounds, plan_runs
from mtplab.measure import floor, stats, theory
from mtplab.measure import rounds as measure
from mtplab.measure.env import environment
from mtplab.measure.published import result_problems
from mtplab.measure.result import RunResult
from mtplab.model.prompts import run_prompt, run_prompts


def _counters(engine: Engine) -> dict:
    return engine.target.counters() | engine.mtp.counters()


def _record(sample: dict, side: str, rows: list[list[int]], n: int, seconds: float) -> None:
    measure.record_counted(sample, side, sum(measure.counted(t, n) for t in rows), seconds)


def row_prompt_problems(run: RunConfig, prompts: np.ndarray, vocab: int) -> list[str]:
    """Where a row's prompt is not the batch-1 prompt of its own seed (seed + row): the check would follow the rows
    through the prompts the engine was given, so each is held to the one a batch-1 run of its seed takes."""
    own = [run_prompt(run, vocab, run.seed + b) for b in range(run.batch)]
    return [f"row {b} decoded another prompt than its seed's ({run.seed + b}): {list(map(int, prompts[b]))[:6]}... "
            f"where a batch-1 run of that seed takes {own[b][:6]}..." for b in range(run.batch)
            if list(map(int, prompts[b])) != own[b]]


def run_batch_point(run: RunConfig, artifact=None, engine: Engine | None = None,
                    calibration: dict | None = None) -> RunResult:
    """The checked pass, `run.rounds` paired timed rounds of the whole batch, and the prediction at B."""
    if calibration is not None and calibration.get("batch", 1) != run.batch:
        raise ValueError(f"the calibration given was measured at batch {calibration.get('batch', 1)}; this point runs "
                         f"batch {run.batch}: pass its own (mtplab.experiment.batch_calibrate.load_or_measure_batch)")
    engine = engine_for(run, artifact, engine)
    B, k, n = run.batch, run.k, run.tokens
    prompts = run_prompts(run, engine.desc.vocab_size)
    problems: list[str] = [f"the engine: {p}" for p in engine_problems(engine)]
    problems += row_prompt_problems(run, prompts, engine.desc.vocab_size)
    if K_POLICIES.get(run.k_policy).needs_costs:  # each row's policy prices its K with the calibration at B
        calibration = calibration if calibration is not None else calibration_for_batch(run)
        engine.k_costs = step_costs(run, calibration)
    before = _counters(engine)
    checked = checked_batch(engine, prompts, n)
    slots = {s: {c: v - before.get(s, {}).get(c, 0) for c, v in cs.items()} for s, cs in _counters(engine).items()}
    forwards = dict(engine.forwards)
    plan = measure.RoundsPlan.of(run)
    row_seconds: list[list[float]] = [[] for _ in range(B)]
    got = {"spec": checked.spec, "split": {}}

    def paired(r: int) -> dict:
        order = ("greedy", "speculative") if r % 2 == 0 else ("speculative", "greedy")
        sample = measure.paired_round(r, order)
        for side in order:
            trace, plans = Trace.begin(engine), plan_runs(engine)
            if side == "greedy":
                g = timed = decode_rows(engine, prompts, n, margins=False)
                returned = time.perf_counter()
                trace.end(engine, g.tokens[0])
                _record(sample, side, g.tokens, n, g.seconds)
                if g.tokens != [t[:n] for t in checked.greedy.tokens]:
                    problems.append(f"round {r}: a timed greedy run's tokens differ from the checked run's")
            else:
                spec = got["spec"] = timed = speculative.generate(engine, prompts, n, checked.greedy.tokens)
                returned = time.perf_counter()
                trace.end(engine, spec.tokens[0])
                _record(sample, side, spec.tokens, n, spec.seconds)
                sample["steps"] = spec.steps
                got["split"] = {key: got["split"].get(key, 0.0) + v for key, v in spec.split.items()}
                for b, s in enumerate(spec.finished):
                    row_seconds[b].append(s)
                problems.extend(f"round {r}, speculative: {p}" for p in timed_state_problems(engine, checked)
                                + finish_problems(spec))
                if spec.tokens != checked.spec.tokens or spec.accepted != checked.spec.accepted:
                    problems.append(f"round {r}: a timed speculative run's tokens or accepted counts differ from the "
                                    "checked run's")
            problems.extend(f"round {r}, {side}: {p}" for p in timed_problems(engine, side, trace, n, prompts.shape[1],
                                                                               checked))
            problems.extend(f"round {r}, {side}: {p}" for p in clock_problems(engine, timed.started, timed.seconds,
                                                                               returned))
            prefix = "greedy_" if side == "greedy" else ""
            draws = timed.decodes if side == "greedy" else 0
            sample[f"{prefix}floor_seconds"], sample[f"{prefix}floor_share"] = floor_seconds(engine, plans, draws)
        return measure.close_round(sample)

    samples = paired_rounds(plan, paired)
    spec, split = got["spec"], got["split"]
    calibration = calibration if calibration is not None else calibration_for_batch(run)
    alpha, alpha_source = acceptance_alpha(run, calibration)
    if run.temperature > 0:  # a sampled batch's acceptance is measured: each row's own, from its checked steps
        fitted = [acceptance_alpha(run, calibration, spec.accepted[b], spec.ks[b]) for b in range(B)]
        alpha = [a for a, _ in fitted] if all(a is not None for a, _ in fitted) else None
        alpha_source = fitted[0][1] + ", each row's own"
    # priced at K = k every step: a draft-length policy's batch, whose rows choose apart, is not predicted
    fixed_k = K_POLICIES.get(run.k_policy).name == "fixed"
    predicted = theory.predict_batch(alpha, k, run.schedule, run.commit, calibration, n, B) if (
        alpha is not None and fixed_k and theory.covers(calibration, k, run.commit)) else None
    row_steps = [len(a) for a in spec.accepted]
    accepted = [a for row in spec.accepted for a in row]  # pooled over the rows
    alphas = row_alphas(run.alpha, B)
    # each row's K per step: what its own policy chooses on its own accepted counts
    problems += [f"the checked run's row {b}: {p}" for b in range(B) for p in chosen_problems(engine, spec.accepted[b],
                                                                                           spec.ks[b])]
    if run.drafter == "oracle" and run.temperature == 0:  # each row's oracle held to its own seeded draws
        problems += [f"row {b}: {p}" for b in range(B) for p in oracle_draw_problems(
            spec.accepted[b], spec.ks[b], run.seed + b, alphas[b], engine.desc.vocab_size)]
    tracked = checked.spec.expected_acceptance  # a sampled run's sum(min(p, q)) per judged draft, rows pooled
    sampled = theory.sampled_acceptance(accepted, k, tracked, run.schedule,
                                        [j for row in spec.ks for j in row]) if tracked else None
    steps = len(accepted)
    generated = sum(len(t) - 1 for t in spec.tokens)
    ks = [j for row in spec.ks for j in row]  # each row-step's drafts (k every step but under a draft-length policy)
    acceptance = measure.acceptance(steps, int(sum(accepted)), sum(ks), generated, accepted, k, ks)
    per_row = [{
        "row": b,
        "seed": run.seed + b,
        "alpha": alphas[b] if run.drafter == "oracle" else None,
        "prompt": [int(t) for t in prompts[b]],
        "tokens": checked.greedy.tokens[b][:n],
        "steps": len(spec.accepted[b]),
        "acceptance_length": 1.0 + (float(np.mean(spec.accepted[b])) if spec.accepted[b] else 0.0),
        "tokens_per_s": stats.median([measure.rate(n - 1, s) for s in row_seconds[b]]),
        "lossless": row_lossless(checked.rows[b]),
    } for b in range(B)]
    result = measure.run_result(
        samples, n, acceptance,
        predicted={key: predicted[key] for key in ("speedup", "alpha", "riding_share")} if predicted else None,
        config=run.to_dict(),
        model=engine.art.identity(),
        prompt=[int(t) for t in prompts[0]],
        tokens=checked.greedy.tokens[0][:n],
        forwards=forwards,
        time_split={key: v / len(samples) for key, v in split.items()},
        slots=slots,
        greedy_slots={},
        slot_reasons={engine.target.labels[s]: st.reason for s, st in engine.target.state.items()},
        arena={name: a.stats() for name, a in engine.arenas.items()},
        identity=checked.identity | {"per_row": checked.rows},  # its timed_audit once the published numbers are checked
        theory=(predicted or {}) | {"alpha_source": alpha_source} | ({"sampled_acceptance": sampled} if sampled else {}),
        env=environment(run.backend, run.threads) | {"loadavg": list(os.getloadavg()), "measured_at": time.time()},
        extra={
            "batch": {
                "rows": B,
                "steps": spec.steps,  # the batch's steps per timed run (each runs every row); `steps` counts row-steps
                # the share of the batch's row-steps spent on rows that had their tokens: the slowest row's cost
                "riding_share": 1.0 - sum(row_steps) / (B * spec.steps) if spec.steps else None,
                "per_row": per_row,
                "step_seconds": stats.median([s["seconds"] / s["steps"] for s in samples if s.get("steps")]),
                "pooled_acceptance_length": acceptance["acceptance_length"],
            },
            "greedy_baseline": f"paired rounds, {'greedy' if run.temperature == 0 else f'plain sampling at T={run.temperature:g}'} at [B={B}, 1]",
            "calibration": calibration["key"],
            "calibration_measured": {"at": calibration.get("measured_at"), "load": calibration.get("load"),
                                     "source": calibration.get("source", "cached on this machine")},
            "rounds": plan.outcome,
            "floor": {side: floor.side_summary(samples, side) for side in floor.SIDES},
            **commit_memory(engine),
        },
    )
    result.suspect = floor.floor_problems(samples)
    problems += [f"the published numbers: {p}" for p in result_problems(result, n, k, generated)]
    result.identity["timed_audit"] = {"problems": problems, "problem_count": len(problems)}
    ok, text = oracle.verdict(checked.identity)
    if ok and problems:
        ok, text = False, "RUN CHECK FAILED: " + problems[0]
    if not ok:
        oracle.shout(text)
    result.lossless, result.verdict = ok, text
    # As a batch-1 point's, less the phase accounting (a batch step's phases are not timed apart): the rows'
    # accepted counts pooled.
    result.warnings = flags.point_warnings(result.efficiency, float("nan"), run.drafter, accepted, k,
                                           None if sampled else calibration, {},
                                           alpha=alphas[0] if len(set(alphas)) == 1 else None, sampled=sampled,
                                           greedy_decode_seconds=measure.rate(B, result.greedy_tokens_per_s))
    for b, row in enumerate(checked.rows):  # in a precision whose [B, M] forward rounds apart, a draw may flip
        alone = row.get("batch_one")
        if alone and not alone["identical"] and not alone["exact"]:
            where = (f"tokens differ from its batch-1 run from token {alone['first_divergence']}"
                     if alone["first_divergence"] is not None else
                     f"accepted count or K differs from its batch-1 run's at step {alone['first_step'] + 1}")
            result.warnings.append(flags.warning(
                "row_apart_from_batch_one", f"row {b}'s {where} ({engine.desc.precision}: a [B, M] forward rounds "
                "apart from a [1, M] one, and a draw or a near-tie at a boundary can go either way)"))
    return result


def row_lossless(row: dict) -> bool:
    """A row's own checks passed: its tokens (none to compare where sampled), its committed state, its reference's
    argmax where not a near-tie, and its float64 anchor where the model has one."""
    return (row["token_identical"] is not False and row["state_first_divergence"] is None
            and not row["reference_disagreements"] and (row.get("anchor") is None or row["anchor"]["ok"])
            and not batch_one_failed(row))


def calibration_for_batch(run: RunConfig, say=print) -> dict:
    """The cached batch calibration for the run's model, threads and batch (measured when missing)."""
    from mtplab.experiment.batch_calibrate import load_or_measure_batch

    return load_or_measure_batch(run.model, run.batch, say=say, threads=run.threads, int4=run.int4)
