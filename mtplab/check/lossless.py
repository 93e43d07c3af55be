"""The checked (untimed) pass of a point, at any batch size: what the lossless verdict is built from.

Every row is held to references of that row alone (mtplab.check.lockstep), never to the batch code that decoded it:
- the greedy reference decodes every row ([B, 1] forwards); the speculative run's row must equal its row token by
  token (a sampled row has no greedy to equal: its state and KV are checked, its distribution is the rule's
  guarantee, tests/test_sampling.py);
- a `Watch` on every forward of both runs: the first NaN or Inf, and where;
- a `Lockstep` per row: a plain `session.run` stepper of that row alone (batch 1), advanced to each length the
  speculative run commits the row to, where its state and KV rows are compared under the commit's rule (and the
  head's KV and drafts, where the head runs);
- an `anchor` per row: greedy's logits rows against the float64 numpy reference of that row alone;
- at batch > 1, a row that samples or that a drafter of the user's own drafts is decoded again by itself, at batch 1
  on its own seeds (nothing else holds it to its own row's inputs); a padded Verify plan under a draft-length policy
  is decoded again with a plan per length.
The verdict pools the rows and names the first row that fails.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from mtplab.check.lockstep import HeadCheck, Lockstep, Watch, anchor, anchor_tokens, reference_model
from mtplab.check.trace import Trace
from mtplab.check.verdict import batch_rule, first_difference, state_rule, token_identity
from mtplab.engine import sampling, speculative
from mtplab.engine.drafters import row_alphas
from mtplab.engine.engine import Engine
from mtplab.engine.greedy import GreedyRows, decode_rows
from mtplab.engine.strategies import DRAFTERS, SCHEDULES


class Checked(NamedTuple):
    """What the checked pass leaves for the verdict and for auditing the timed rounds (a list per row)."""

    greedy: GreedyRows  # every row's reference tokens and margins (n + k + 1 each)
    spec: speculative.SpeculativeRun  # the checked speculative run
    rows: list[dict]  # per row: its token identity, lockstep summary, anchor and batch-1 run
    identity: dict  # the rows pooled, in the form mtplab.check.verdict reads
    spec_trace: Trace  # what the checked speculative run executed (the timed runs must execute it too)
    spec_state: list[dict]  # per row, the state the checked speculative run left (a riding row: as it finished)
    greedy_state: list[dict]  # per row, the reference's state where an n-token greedy run ends (along its tokens)
    spec_lengths: list[int] = []  # per row, the length the checked speculative run left it at


def as_rows(prompts) -> np.ndarray:
    """Prompts as [B, P] token ids (ValueError otherwise): a list of token ids is a batch of one."""
    try:
        rows = np.asarray(prompts)
    except ValueError:  # rows of different lengths
        rows = None
    if rows is None or rows.dtype == object or rows.ndim not in (1, 2) or rows.shape[-1] == 0 or (
            rows.size and (rows.dtype.kind not in "iu" or rows.min() < 0)):
        raise ValueError("prompts must be token ids >= 0 of one length per batch, [B, prompt_len] (or one prompt's "
                         f"[prompt_len]), got {getattr(rows, 'shape', 'rows of different lengths')} of "
                         f"{getattr(rows, 'dtype', '?')}")
    rows = rows.astype(np.int64)
    return rows[None] if rows.ndim == 1 else rows


def checked_pass(engine, prompts, n: int) -> Checked:
    """The untimed greedy reference and checked speculative run of every row (see the module's docstring); prompts
    [B, P], or one prompt's token ids at batch 1."""
    run, art = engine.spec, engine.art
    prompts = as_rows(prompts)
    if n < 1:
        raise ValueError(f"n={n}: the checked pass decodes at least the prefill's token (n >= 1)")
    B = prompts.shape[0]
    rule = batch_rule(state_rule(run.commit, engine.desc.precision, engine.device.name == "cpu"), B,
                      engine.desc.precision)
    sampled = engine.acceptance.samples  # each row's reference follows its own emitted tokens
    row_prompts = [[int(t) for t in row] for row in prompts]
    kind = DRAFTERS.get(run.drafter)
    watch = engine.watch = Watch("greedy")
    try:
        greedy = decode_rows(engine, prompts, n + run.k + 1, margins=not sampled,
                             keep_logits=anchor_tokens(engine.desc, n))
        t0 = time.perf_counter()
        ref = reference_model(art)  # built-in models; a builder folder's reference is its lockstep stepper
        anchors = [anchor(art, row_prompts[b], greedy.logits[b], greedy.tokens[b], sampled, ref) if ref is not None
                   else None for b in range(B)]
        t1 = time.perf_counter()
        ends = [len(p) + n - 1 for p in row_prompts]  # where an n-token greedy run leaves each row
        locks = [Lockstep.start(art, row_prompts[b], [] if sampled else greedy.tokens[b], rule,
                                None if sampled else ends[b], sampled,
                                HeadCheck.start(engine.desc, run.k, HeadCheck.judges(engine))
                                if kind.uses_head(run) else None) for b in range(B)]
        checks = [time.perf_counter() - t1]
        extra = SCHEDULES.get(run.schedule).extra_tokens
        kv = engine.mtp_state.kv

        def check_row(step: int, b: int, emitted: list[int], drafted: int | None, after_step: bool) -> None:
            t = time.perf_counter()
            if sampled:
                locks[b].sequence = row_prompts[b] + list(emitted)
            locks[b].check(step, int(engine.state.lengths[b]), engine.state.snapshot(copy=False, row=b),
                           (kv[0][b : b + 1], kv[1][b : b + 1]), extra if after_step else None, drafted)
            checks[0] += time.perf_counter() - t

        def on_commit(step: int, rows, emitted: list[list[int]], ks: list[list[int]]) -> None:
            for b in rows:
                check_row(step, b, emitted[b], ks[b][-1], True)

        watch.start("speculative")
        trace = Trace.begin(engine)
        engine.acceptance.track(run.k)  # a sampling rule sums sum(min(p, q)) over the judged drafts
        spec = speculative.generate(engine, prompts, n, greedy.tokens, on_commit)
        spec.expected_acceptance = engine.acceptance.tracked()
        trace.end(engine, spec.tokens, spec.accepted, spec.ks)
        for b in range(B):  # what each row left behind, after its last commit
            check_row(spec.steps, b, spec.tokens[b], None, after_step=False)
        left = [engine.state.snapshot(row=b) for b in range(B)]
        lengths = [int(length) for length in engine.state.lengths]
    finally:
        engine.watch = None
    # the state where an n-token greedy run ends, along greedy's tokens: the lockstep's own stepper, or (sampled: it
    # follows the run's own tokens) one of its own
    along = locks if not sampled else [Lockstep.start(art, row_prompts[b], greedy.tokens[b], rule, ends[b], True)
                                       for b in range(B)]
    for lock, length in zip(along, ends):
        lock.advance_to(length)
    alone = batch_one_runs(engine, row_prompts, n, spec, None if sampled else greedy.tokens) if (
        B > 1 and (sampled or kind.per_row)) else [None] * B
    rows = [({"token_identical": None, "first_divergence": None, "sampled": sampling.settings(run)}
             if sampled else token_identity(spec.tokens[b][:n], greedy.tokens[b][:n], greedy.margins[b]))
            | locks[b].summary() | {"anchor": anchors[b], "batch_one": alone[b]} for b in range(B)]
    identity = pooled(rows, watch.non_finite)
    if run.verify_plans == "padded" and run.k_policy != "fixed":  # a fixed K never pads
        identity["padded_twin"] = padded_twin(engine, prompts, n, greedy.tokens, spec)
    identity["check_seconds"] = {"anchor": t1 - t0, "lockstep": checks[0], "speculative": spec.seconds}
    return Checked(greedy, spec, rows, identity, trace, left, [lock.kept for lock in along], lengths)


def padded_twin(engine, prompts: np.ndarray, n: int, references: list[list[int]],
                spec: speculative.SpeculativeRun) -> dict:
    """A run with one padded Verify plan decoded again with a plan per length, on the same seeds and prices: every
    row's tokens, accepted counts and K per step must be the same (padding adds positions nobody judges). Sampled,
    nothing else sees a padding that changed what was judged. exact: fp32, where the verify's rows round alike at
    any M."""
    twin = Engine(engine.spec.replace(verify_plans="per-length"), engine.art, engine.device)
    twin.k_costs = engine.k_costs
    out = speculative.generate(twin, prompts, n, references)
    found = [(b, *apart(out, b, spec, b)) for b in range(len(spec.tokens))]
    row, first, step = next(((b, f, s) for b, f, s in found if f is not None or s is not None), (None, None, None))
    return {"identical": row is None, "first_divergence": first, "first_step": step,
            "row": row if len(found) > 1 else None, "exact": engine.desc.precision == "fp32"}


def apart(one: speculative.SpeculativeRun, a: int, other: speculative.SpeculativeRun, b: int) -> tuple:
    """Where row a of one run parts from row b of another: (the first token that differs, the first step whose
    accepted count or K differs), each None where they agree."""
    return (first_difference(one.tokens[a], other.tokens[b]),
            first_difference(list(zip(one.accepted[a], one.ks[a])), list(zip(other.accepted[b], other.ks[b]))))


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
        by_itself = speculative.generate(one, as_rows(prompt), n, [references[b]] if references else None)
        first, step = apart(by_itself, 0, spec, b)
        out.append({"identical": first is None and step is None, "first_divergence": first, "first_step": step,
                    "seed": run.seed + b, "sample_seed": run.sample_seed + b,
                    "exact": engine.desc.precision == "fp32", "padded": run.verify_plans == "padded"})
    return out


def batch_one_failed(row: dict) -> bool:
    """A row that decoded otherwise than its batch-1 run, where the precision makes that a failure (exact)."""
    alone = row.get("batch_one")
    return bool(alone and not alone["identical"] and alone["exact"])


def row_failed(row: dict) -> bool:
    """A row that fails one of its own checks: its tokens, its committed state, its anchor, its head's KV or drafts,
    its batch-1 run."""
    return bool(row["token_identical"] is False or row["state_first_divergence"]
                or (row.get("anchor") and not row["anchor"]["ok"]) or row.get("head_kv_first_divergence")
                or row.get("head_draft_disagreements") or batch_one_failed(row))


def pooled(rows: list[dict], non_finite: dict | None) -> dict:
    """One identity for the batch: the first row that fails a check (its fields, with "row" where the batch has more
    than one), else the rows' worst differences; per-row fields stay in `rows`."""
    failing = next((b for b, r in enumerate(rows) if row_failed(r)), None)
    out = dict(rows[0 if failing is None else failing])
    out |= {"row": failing if len(rows) > 1 else None, "rows": len(rows), "non_finite": non_finite}
    if len(rows) == 1:
        return out
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
