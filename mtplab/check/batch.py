"""The checked pass of a batch: every row held to its own batch-1 greedy and to its own lockstep reference.

Each row's greedy tokens at [B, 1] are the reference its speculative tokens must equal (and the batch-1
greedy of the row's prompt must equal them in turn: tests/test_batch.py holds that); each row's greedy logits are
held to the float64 numpy reference of that row alone (the anchor, on the built-in models). After every commit,
each row the step committed is compared, state and KV rows, with a plain `session.run` stepper of that
row alone (batch 1) advanced to the row's committed length, under the commit's rule: the same Lockstep
the batch-1 pass uses, one per row. The verdict pools the rows and names the first row that fails.
The timed runs of a batch point are held to their side's work by timed_problems.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mtplab.check.audit import nonzero, state_problem
from mtplab.check.expected import greedy_forwards, head_forwards
from mtplab.check.lossless import HeadCheck, Lockstep, Watch, anchor, anchor_tokens, reference_model
from mtplab.check.trace import Trace
from mtplab.check.verdict import STATE_RTOL, StateRule, first_difference, state_rule, token_identity
from mtplab.engine import sampling, speculative
from mtplab.engine.drafters import row_alphas
from mtplab.engine.engine import Engine
from mtplab.engine.greedy import GreedyRows, decode_rows
from mtplab.engine.strategies import DRAFTERS, SCHEDULES
from mtplab.runtime.executor import Slot


class BatchChecked(NamedTuple):
    greedy: GreedyRows  # every row's reference tokens and margins (n + k + 1 each)
    spec: speculative.SpeculativeRun  # the checked speculative run
    rows: list[dict]  # per row: token identity and its lockstep summary
    identity: dict  # the rows pooled, in the form mtplab.check.verdict reads (the first failing row's, with "row")
    spec_forwards: dict = {}  # the forwards the checked speculative run made, by "slot/M=m" (the timed runs' too)
    spec_state: list = []  # per row, the state the checked speculative run left (each timed one must leave it too)


def checked_batch(engine, prompts: np.ndarray, n: int) -> BatchChecked:
    """The untimed reference and checked speculative run of a batch (see the module's docstring). Sampled (the rule
    samples), each row's reference follows the row's own emitted tokens: its state and KV are checked, its tokens'
    distribution is the rule's guarantee (tests/test_sampling.py, a batch's rows included)."""
    run, art = engine.spec, engine.art
    rule = batch_rule(state_rule(run.commit, engine.desc.precision, engine.device.name == "cpu"), engine)
    sampled = engine.acceptance.samples
    row_prompts = [[int(t) for t in row] for row in prompts]
    watch = engine.watch = Watch("greedy")
    try:
        greedy = decode_rows(engine, prompts, n + run.k + 1, margins=not sampled,
                              keep_logits=anchor_tokens(engine.desc, n))
        kind = DRAFTERS.get(run.drafter)
        locks = [Lockstep.start(art, row_prompts[b], [] if sampled else greedy.tokens[b], rule, sampled=sampled,
                                head=HeadCheck.start(engine.desc, run.k, HeadCheck.judges(engine))
                                if kind.uses_head(run) else None) for b in range(engine.batch)]
        extra = SCHEDULES.get(run.schedule).extra_tokens
        kv = engine.mtp_state.kv

        def head_kv(b: int) -> tuple:
            return kv[0][b : b + 1], kv[1][b : b + 1]

        def on_commit(step: int, rows, emitted: list[list[int]], ks: list[list[int]]) -> None:
            for b in rows:  # each row's state and KV, and its head's KV and drafts, against a reference of it alone
                if sampled:
                    locks[b].sequence = row_prompts[b] + emitted[b]
                locks[b].check(step, int(engine.state.lengths[b]), engine.state.snapshot(copy=False, row=b),
                               head_kv(b), extra, ks[b][-1])

        watch.start("speculative")
        before = dict(engine.forwards)
        engine.acceptance.track(run.k)  # a sampling rule sums sum(min(p, q)) over the judged drafts
        spec = speculative.generate(engine, prompts, n, greedy.tokens, on_commit)
        spec.expected_acceptance = engine.acceptance.tracked()
        spec_forwards = {key: d for key, v in engine.forwards.items() if (d := v - before.get(key, 0))}
        for b, lock in enumerate(locks):  # what each row left behind (a riding row: as it finished)
            lock.check(spec.steps, int(engine.state.lengths[b]), engine.state.snapshot(copy=False, row=b), head_kv(b))
        left = [engine.state.snapshot(row=b) for b in range(engine.batch)]
    finally:
        engine.watch = None
    settings, ref = sampling.settings(run), reference_model(art)
    # each row's greedy rows against the float64 reference of that row alone (built-in models; a builder folder's
    # reference is its lockstep stepper)
    anchors = [anchor(art, row_prompts[b], greedy.logits[b], greedy.tokens[b], sampled, ref) if ref is not None
               else None for b in range(engine.batch)]
    # sampled rows, and rows a drafter of the user's own drafts (nothing else holds it to its own row's inputs)
    alone = batch_one_runs(engine, row_prompts, n, spec, None if sampled else greedy.tokens) if (
        sampled or kind.per_row) else [None] * engine.batch
    rows = [({"token_identical": None, "first_divergence": None, "sampled": settings}
             if sampled else token_identity(spec.tokens[b][:n], greedy.tokens[b][:n], greedy.margins[b]))
            | locks[b].summary() | {"anchor": anchors[b], "batch_one": alone[b]} for b in range(engine.batch)]
    return BatchChecked(greedy, spec, rows, pooled(rows, watch.non_finite), spec_forwards, left)


def batch_one_runs(engine, row_prompts: list[list[int]], n: int, spec: speculative.SpeculativeRun,
                   references: list[list[int]] | None = None) -> list[dict]:
    """Each row decoded by itself, at batch 1 on an engine of its own seeds (seed + b, sample_seed + b): its tokens,
    accepted counts and K per step must be the row's. A sampled row that read another row's generator, drew once too
    often or sampled otherwise differs here (nothing else sees it: a sampled row has no greedy to equal); so does a
    row whose drafter of the user's own was given another row's inputs (its tokens are greedy's whatever it drafts).
    exact: the model's precision makes a [B, M] forward round as a [1, M] one to within a draw's resolution (fp32);
    in fp16 a draw at a boundary can go either way, and a difference is a warning, not a failure."""
    run, out = engine.spec, []
    alphas = row_alphas(run.alpha, run.batch)  # each row's own, as its batch-1 run takes it
    for b, prompt in enumerate(row_prompts):  # a padded batch's rows against a plan per length: padding held too
        one = Engine(run.replace(batch=1, seed=run.seed + b, sample_seed=run.sample_seed + b, alpha=alphas[b],
                                 verify_plans="per-length" if run.verify_plans == "padded" else run.verify_plans),
                     engine.art, engine.device)
        one.k_costs = engine.k_costs  # the batch's prices: a row's policy chooses as in the batch
        by_itself = one.speculative(prompt, n, reference=references[b] if references else None)
        first = first_difference(by_itself["tokens"], spec.tokens[b])
        step = first_difference(list(zip(by_itself["accepted"], by_itself["k"])),
                                list(zip(spec.accepted[b], spec.ks[b])))
        out.append({"identical": first is None and step is None, "first_divergence": first, "first_step": step,
                    "seed": run.seed + b, "sample_seed": run.sample_seed + b,
                    "exact": engine.desc.precision == "fp32", "padded": run.verify_plans == "padded"})
    return out


def finish_problems(spec: speculative.SpeculativeRun) -> list[str]:
    """Where a row's finishing time (its tokens/s) lies outside its run's window (0, seconds]."""
    return [f"row {b} had its tokens at {t * 1e3:.4g} ms, outside its run's (0, {spec.seconds * 1e3:.4g}] ms"
            for b, t in enumerate(spec.finished) if not 0 < t <= spec.seconds]


def timed_state_problems(engine, checked: BatchChecked) -> list[str]:
    """Where a timed speculative run left a row's state (recurrent states, KV rows) other than the checked run left
    it (audit.state_problem: the same computation on the same device gives the same bits on the CPU)."""
    same = StateRule(True, 0.0, "the timed run repeats the checked run's computation")
    rtol = STATE_RTOL.get(engine.desc.precision, STATE_RTOL["fp32"])
    out = []
    for b, ref in enumerate(checked.spec_state):
        problem, _ = state_problem(engine.state.snapshot(copy=False, row=b), ref, same, rtol, "the checked run's",
                                   bitwise_or_problem=engine.device.name == "cpu")
        if problem:
            out.append(f"row {b}'s " + problem.removeprefix("the "))
    return out


def timed_problems(engine, side: str, trace: Trace, n: int, prompt_len: int, checked: BatchChecked) -> list[str]:
    """Where one timed run of a batch did other work than its side does: greedy runs the batch's prefill and n - 1
    [B, 1] decodes through Primary's plan and nothing else; a speculative run makes the checked run's forwards, and
    the checked run makes one verify per step at its longest row's K and, where its drafter runs the head, K head
    steps (K - 1 fused) and one head commit per step; the slots' counts agree with the backend's own."""
    run, out = engine.spec, list(trace.honesty_problems())
    if side == "greedy":
        want = greedy_forwards(prompt_len, n)
        if trace.forwards != want:
            out.append(f"greedy's forwards {trace.forwards}, expected {want}")
        primary = engine.target.labels[Slot.PRIMARY]
        c = trace.activity.get(primary, {})
        through_plan = c.get("replays", 0) + c.get("captures", 0) + c.get("warmups", 0)
        if c.get("eager", 0) != 1 or c.get("fallbacks", 0) or through_plan != n - 1:
            out.append(f"greedy's primary slot ran {nonzero(c)}: expected the prefill eager and {n - 1} decodes through its plan")
        out += [f"greedy ran the {slot} slot ({nonzero(a)}): greedy runs only Primary" for slot, a in trace.activity.items()
                if slot != primary and any(a.values())]
        return out
    if trace.forwards != checked.spec_forwards:
        out.append(f"the speculative run's forwards {trace.forwards}, the checked run's {checked.spec_forwards}")
    steps, made, widths = checked.spec.steps, checked.spec_forwards, checked.spec.widths
    want: dict[str, int] = {}
    for K in widths:  # one verify per step at its longest row's drafts (padded: at k_max)
        key = f"verify/M={run.verified(K) + 1}"
        want[key] = want.get(key, 0) + 1
    want |= head_forwards(run, steps, widths)
    if any(made.get(key, 0) != v for key, v in want.items()):
        out.append(f"the checked speculative run's {steps} steps made {made}; its config makes {want} of them")
    return out


def batch_rule(rule: StateRule, engine) -> StateRule:
    """A bitwise rule is not one at batch B: the rows run [B, M] forwards, the reference [1, M] ones, and a kernel may
    take another path at B rows (MatMulNBits' int4 does; fp32 MatMul has been bitwise). The relative tolerance of
    the precision instead."""
    if not rule.bitwise or engine.batch == 1:
        return rule
    return StateRule(False, STATE_RTOL[engine.desc.precision],
                     rule.why + f"; at batch {engine.batch} its [B, M] forwards may round apart from the batch-1 "
                     "reference's [1, M] (another kernel path for more rows)")


def batch_one_failed(row: dict) -> bool:
    """A row that decoded otherwise than its batch-1 run, where the precision makes that a failure (exact)."""
    alone = row.get("batch_one")
    return bool(alone and not alone["identical"] and alone["exact"])


def pooled(rows: list[dict], non_finite: dict | None) -> dict:
    """One identity for the batch: the first row that fails a check (its fields, with "row"), else the rows'
    worst differences; per-row fields stay in `rows`."""
    failing = next((b for b, r in enumerate(rows) if r["token_identical"] is False or r["state_first_divergence"]
                    or (r.get("anchor") and not r["anchor"]["ok"]) or r.get("head_kv_first_divergence")
                    or r.get("head_draft_disagreements") or batch_one_failed(r)), None)
    chosen = rows[0 if failing is None else failing]
    out = dict(chosen) | {"row": failing, "rows": len(rows), "non_finite": non_finite}
    out["state_max_abs_diff"] = max(r["state_max_abs_diff"] or 0.0 for r in rows)
    out["state_max_rel_diff"] = max(r["state_max_rel_diff"] or 0.0 for r in rows)
    out["state_bitwise"] = all(r["state_bitwise"] for r in rows)
    out["state_commits_checked"] = sum(r["state_commits_checked"] for r in rows)
    out["token_identical"] = None if rows[0].get("sampled") else all(r["token_identical"] for r in rows)
    out["reference_disagreements"] = [d | {"row": b} for b, r in enumerate(rows) for d in r["reference_disagreements"]]
    if rows[0].get("head_kv_commits_checked") is not None:  # the head's checks, every row's
        out["head_kv_max_rel_diff"] = max(r["head_kv_max_rel_diff"] or 0.0 for r in rows)
        out["head_kv_commits_checked"] = sum(r["head_kv_commits_checked"] for r in rows)
        out["head_draft_disagreements"] = [d | {"row": b} for b, r in enumerate(rows)
                                           for d in r["head_draft_disagreements"]]
    return out
