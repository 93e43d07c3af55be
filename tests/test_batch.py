"""Batches (mtplab.engine.speculative, mtplab.check.lossless): B rows decoded together, each one lossless on its own."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import synthetic_calibration

from mtplab.check.lossless import checked_pass
from mtplab.check.verdict import verdict
from mtplab.engine import batch_commits, speculative, step_drafts
from mtplab.engine.engine import Engine
from mtplab.engine.fit import batch_problem
from mtplab.engine.greedy import decode_rows
from mtplab.engine.k_policies import StepCosts
from mtplab.experiment.calibrate import load_or_measure
from mtplab.experiment.config import ConfigError, RunConfig
from mtplab.experiment.point import row_lossless
from mtplab.experiment.point_ids import point_id
from mtplab.experiment.prediction import check_calibration
from mtplab.model.prompts import run_prompts

N = 40


def batch_run(B: int, commit: str = "select", schedule: str = "decode-verify", drafter: str = "oracle") -> RunConfig:
    extra = {"alpha": 0.6} if drafter == "oracle" else {}
    return RunConfig(model="tiny", k=3, drafter=drafter, commit=commit, schedule=schedule, batch=B, tokens=N,
                     threads=1, **extra)


@pytest.mark.parametrize("B", [2, 4])
def test_each_rows_greedy_is_its_own_batch_of_one(tiny, B):
    run = batch_run(B)
    engine = Engine(run, tiny)
    prompts = run_prompts(run, engine.desc.vocab_size)
    got = decode_rows(engine, prompts, 24, margins=False)
    one = Engine(run.replace(batch=1), tiny)
    assert [one.greedy([int(t) for t in prompts[b]], 24).tokens for b in range(B)] == got.tokens
    assert len({tuple(t) for t in got.tokens}) == B  # distinct prompts, distinct rows


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
@pytest.mark.parametrize("commit", ["select", "readvance-m1", "readvance-batched", "per-position"])
@pytest.mark.parametrize("B", [2, 4])
def test_every_commit_is_lossless_per_row(tiny, B, commit, schedule):
    run = batch_run(B, commit, schedule).replace(seed=1)  # a seed whose rows finish on different steps (asserted below)
    engine = Engine(run, tiny)
    checked = checked_pass(engine, run_prompts(run, engine.desc.vocab_size), N)
    ok, message = verdict(checked.identity)
    assert ok, message
    assert f"every token in each of its {B} rows" in message
    spec = checked.spec
    for b, row in enumerate(checked.rows):
        assert row["token_identical"] and spec.tokens[b][:N] == checked.greedy.tokens[b][:N]
        assert row["state_commits_checked"] == len(spec.accepted[b]) + 1  # after every commit, and at the end
        if commit == "readvance-m1":  # the reference's own M=1 kernels, row by row
            assert row["state_bitwise"]
    # rows accepted different counts in the same step, and some row had its tokens before the others
    assert any(len({a[i] for a in spec.accepted if i < len(a)}) > 1 for i in range(spec.steps))
    assert min(len(a) for a in spec.accepted) < spec.steps


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
@pytest.mark.parametrize("drafter", ["oracle", "mtp"])
def test_every_row_is_the_batch_of_one_run_of_its_seed(tiny, drafter, schedule):
    """Row b has the prompt and oracle seed of the batch-1 run at seed + b, and drafts at its own position: the same
    tokens and the same accepted counts, step by step."""
    run = batch_run(3, schedule=schedule, drafter=drafter)
    engine = Engine(run, tiny)
    prompts = run_prompts(run, engine.desc.vocab_size)
    greedy = decode_rows(engine, prompts, N + run.k + 1, margins=False)
    spec = speculative.generate(engine, prompts, N, greedy.tokens)
    for b in range(3):
        one = Engine(run.replace(batch=1, seed=run.seed + b), tiny)
        alone = one.speculative([int(t) for t in prompts[b]], N, reference=greedy.tokens[b])
        assert alone["tokens"] == spec.tokens[b] and alone["accepted"] == spec.accepted[b], f"row {b}"


@pytest.mark.parametrize("schedule, drafter", [("decode-verify", "mtp"), ("fused", "mtp"), ("fused", "oracle")])
def test_a_sampled_row_is_the_batch_of_one_run_of_its_seeds(tiny, schedule, drafter):
    """At temperature > 0 row b samples from a generator of its own at sample_seed + b, in a batch-1 run's order:
    its tokens and accepted counts are those of the batch-1 run at seed + b and sample_seed + b, and so are its
    plain-sampling baseline's; the check follows each row's own tokens. The oracle samples as a mixture of the
    target's rows and a distractor, each row its own (mtplab.engine.mixture), at its own alpha where given."""
    own = [{"alpha": a} for a in (0.5, 0.9, 0.7)] if drafter == "oracle" else [{}] * 3
    run = batch_run(3, "readvance-m1", schedule, drafter).replace(temperature=0.7, acceptance="rejection-sampling",
                                                                   **({"alpha": (0.5, 0.9, 0.7)} if own[0] else {}))
    engine = Engine(run, tiny)
    prompts = run_prompts(run, engine.desc.vocab_size)
    checked = checked_pass(engine, prompts, N)
    ok, message = verdict(checked.identity)
    assert ok and message.startswith("sampled (temperature 0.7") and "in each of its 3 rows bitwise" in message
    spec = checked.spec
    for b in range(3):
        one = Engine(run.replace(batch=1, seed=run.seed + b, sample_seed=run.sample_seed + b, **own[b]), tiny)
        prompt = [int(t) for t in prompts[b]]
        alone = one.speculative(prompt, N)
        assert alone["tokens"] == spec.tokens[b] and alone["accepted"] == spec.accepted[b], f"row {b}"
        assert one.greedy(prompt, N + run.k + 1).tokens == checked.greedy.tokens[b], f"row {b}'s baseline"
    assert len({tuple(t[:N]) for t in spec.tokens}) == 3


COSTS = StepCosts({j: 1.0 + 0.3 * j for j in range(1, 5)}, {n: 0.1 for n in range(1, 6)}, 1)  # made-up prices


@pytest.mark.parametrize("policy, drafter, sampled", [("probe", "oracle", False), ("goodput", "oracle", False),
                                                      ("confidence", "mtp", False), ("confidence", "mtp", True),
                                                      ("goodput", "mtp", True)])
def test_each_row_chooses_its_own_k_as_its_batch_of_one_run_would(tiny, policy, drafter, sampled):
    """A draft-length policy per row: row b's K at every step, its tokens and accepted counts are those of the
    batch-1 run of its seeds (its own acceptance drives its own policy; a row drafting fewer than the longest is
    judged on its own drafts, and a sampled row draws for its own drafts only); the verify runs the longest row's K."""
    extra = {"alpha": (0.95, 0.5, 0.1)} if drafter == "oracle" else {}
    if sampled:
        extra |= {"temperature": 0.7, "acceptance": "rejection-sampling"}
    if policy == "confidence":
        extra |= {"k_confidence": 0.9}
    run = batch_run(3, "readvance-m1", "fused", drafter).replace(k=4, k_policy=policy, **extra)
    engine = Engine(run, tiny)
    engine.k_costs = COSTS
    prompts = run_prompts(run, engine.desc.vocab_size)
    greedy = decode_rows(engine, prompts, N + run.k + 1, margins=False)
    spec = speculative.generate(engine, prompts, N, greedy.tokens)
    for b in range(3):
        own = ({"alpha": run.alpha[b]} if drafter == "oracle" else {}) | (
            {"sample_seed": run.sample_seed + b} if sampled else {})
        one = Engine(run.replace(batch=1, seed=run.seed + b, **own), tiny)
        one.k_costs = COSTS
        alone = one.speculative([int(t) for t in prompts[b]], N, reference=greedy.tokens[b])
        assert (alone["tokens"], alone["accepted"], alone["k"]) == (spec.tokens[b], spec.accepted[b], spec.ks[b]), b
    assert len({k for row in spec.ks for k in row}) > 1  # the rows' K varied
    assert spec.widths == [max(row[i] for row in spec.ks if i < len(row)) for i in range(spec.steps)]
    if policy == "confidence" and not sampled:  # a padded verify (M = k + 1 every step) keeps every row's run
        engine = Engine(run.replace(verify_plans="padded"), tiny)
        padded = speculative.generate(engine, prompts, N, greedy.tokens)
        assert (padded.tokens, padded.accepted, padded.ks) == (spec.tokens, spec.accepted, spec.ks)
        assert {key for key in engine.forwards if key.startswith(("verify/", "mtp-commit/"))} == {
            "verify/M=5", "mtp-commit/M=5"}


@pytest.mark.parametrize("plant", ["row 1 seeded as row 0", "rows 1 and 2 swap generators", "an extra draw"])
def test_a_sampled_row_that_does_not_decode_by_itself_is_caught_naming_the_row(tiny, monkeypatch, plant):
    """Each sampled row is decoded again by itself, at batch 1 on an engine of its own seeds: a row that draws from
    another row's generator, or once too often, fails the check, named (nothing else sees it: a sampled row has no
    greedy tokens to equal)."""
    from mtplab.engine.sampling import SampledRun

    real_new, real_accept = SampledRun.new_generation, SampledRun._accept

    def new_generation(self):
        real_new(self)
        if self.rows > 1 and plant == "row 1 seeded as row 0":
            self.rngs[1] = self.xp.random.default_rng(self.seed)
        elif self.rows > 2 and plant == "rows 1 and 2 swap generators":
            self.rngs[1], self.rngs[2] = self.rngs[2], self.rngs[1]

    def accept(self, xp, drafts, logits, row):
        if self.rows > 1 and row == 2 and plant == "an extra draw":
            self.rngs[row].random()
        return real_accept(self, xp, drafts, logits, row)

    monkeypatch.setattr(SampledRun, "new_generation", new_generation)
    monkeypatch.setattr(SampledRun, "_accept", accept)
    run = batch_run(3, "select", "fused", "mtp").replace(temperature=0.7, acceptance="rejection-sampling")
    engine = Engine(run, tiny)
    checked = checked_pass(engine, run_prompts(run, engine.desc.vocab_size), N)
    ok, message = verdict(checked.identity)
    row = 2 if plant == "an extra draw" else 1
    assert not ok and message.startswith(f"LOSSLESS CHECK FAILED: row {row} of 3: its sampled tokens differ from a "
                                         f"batch-1 run of its seeds (seed {row}, sample_seed {row})"), message


def _planted(monkeypatch, name: str, wrap) -> None:
    original = batch_commits.BATCH_COMMITS[name]
    monkeypatch.setitem(batch_commits.BATCH_COMMITS, name, lambda engine: wrap(original(engine)))


def test_a_commit_that_mixes_up_rows_is_caught_and_named(tiny, monkeypatch):
    """Planted: select replays row 0's count into row 1 and the other way round."""

    def swapped(commit):
        def wrong(ver, counts, rows, ids, start):
            counts = counts.copy()
            counts[[0, 1]] = counts[[1, 0]]
            commit(ver, counts, rows, ids, start)
        return wrong

    _planted(monkeypatch, "select", swapped)
    run = batch_run(2)
    engine = Engine(run, tiny)
    ok, message = verdict(checked_pass(engine, run_prompts(run, engine.desc.vocab_size), N).identity)
    assert not ok and "LOSSLESS CHECK FAILED: row " in message and "of 2" in message


def test_a_riding_row_keeps_the_state_it_finished_with(tiny, monkeypatch):
    """Planted: the state rows of finished rows are not put back; the end-of-run check of that row fails."""
    monkeypatch.setattr(batch_commits.RowKeeper, "put_back", lambda self, rows: None)
    run = batch_run(4)
    engine = Engine(run, tiny)
    checked = checked_pass(engine, run_prompts(run, engine.desc.vocab_size), N)
    ok, message = verdict(checked.identity)
    assert not ok and "committed state differs" in message


def test_batch_refusals_say_what_is_allowed(tiny):
    with pytest.raises(ConfigError, match="refuses any batch size but 1"):
        RunConfig(model="tiny", batch=2, engine="ort-genai")
    with pytest.raises(ConfigError, match="batch=2 runs on backend='cpu'"):
        RunConfig(model="tiny", batch=2, backend="cuda")
    with pytest.raises(ConfigError, match="batch"):
        RunConfig(model="tiny", batch=0)
    desc = tiny.description
    no_query = dataclasses.replace(desc, target=dataclasses.replace(desc.target, query_seqlens=False))
    assert batch_problem(1, no_query) is None
    assert "query_seqlens" in batch_problem(2, no_query)
    engine = Engine(batch_run(2), tiny)
    with pytest.raises(ValueError, match=r"prompts must be \[B=2, prompt_len\]"):
        decode_rows(engine, np.zeros((3, 8), dtype=np.int64), 4)
    with pytest.raises(ValueError, match="this engine holds batch=2 rows"):
        engine.speculative([1, 2, 3], 4)
    for ragged in ([[1, 2, 3], [4, 5]], [[1, -2, 3], [4, 5, 6]], [[1.5, 2, 3], [4, 5, 6]]):
        with pytest.raises(ValueError, match=r"prompts must be token ids >= 0 of one length per batch"):
            checked_pass(engine, ragged, 4)
    with pytest.raises(ValueError, match="a calibration is measured at a whole number of rows, 1 or more"):
        load_or_measure("tiny", batch=0)
    cal = synthetic_calibration()
    with pytest.raises(ValueError, match=r"measured at batch 1; this point runs batch 2"):
        check_calibration(batch_run(2), cal)
    with pytest.raises(ValueError, match=r"measured at batch 2/3; this point runs batch 2"):
        check_calibration(batch_run(2), cal | {"batch": 2, "key": {"batch": 3}})
    no_head = {k: v for k, v in cal.items() if k != "mtp_acceptance"} | {"batch": 2}
    with pytest.raises(ValueError, match=r"carries no head acceptance \(mtp_acceptance\) to price drafter='mtp'"):
        check_calibration(batch_run(2, drafter="mtp"), no_head)


def test_batch_one_keeps_its_point_id():
    assert point_id(RunConfig(model="tiny")) == point_id(RunConfig(model="tiny", batch=1))
    assert point_id(RunConfig(model="tiny", batch=4)).endswith("-b4")


def test_a_batch_point_reports_rows_and_its_prediction(tiny):
    from mtplab.experiment.point import run_point
    from mtplab.experiment.result_text import result_text

    run = batch_run(2).replace(rounds=2, tokens=24)
    result = run_point(run, tiny)
    assert result.lossless, result.verdict
    detail = result.extra["batch"]
    assert [r["row"] for r in detail["per_row"]] == [0, 1] and all(r["lossless"] for r in detail["per_row"])
    assert result.predicted["speedup"] > 0 and result.theory["batch"] == 2
    assert all(s["counted"] == 2 * (24 - 1) == s["greedy_counted"] for s in result.round_samples)
    assert "batch of 2" in result_text(result) and result.identity["timed_audit"]["problems"] == []
    # a step of the batch runs both rows: the time split per step is per batch step, as the step time beside it
    assert result.steps == sum(r["steps"] for r in detail["per_row"]) > detail["steps"] == max(
        r["steps"] for r in detail["per_row"])
    line = next(t for t in result_text(result).splitlines() if "time split, ms per step" in t)
    printed = sum(float(part.split("=")[1]) for part in line.split(":")[1].split())
    assert printed == pytest.approx(sum(result.time_split.values()) / detail["steps"] * 1e3, rel=1e-2)


@pytest.mark.parametrize("plant, words", [
    ("greedy twice", "timed round 0, greedy: forwards {'prefill/M=8': 2, 'primary/M=1': 30}"),
    ("another policy", "the engine: its arena policy is 'shared-max', the config says 'sibling-pinned'"),
    ("faster tokens/s", "the published numbers: round 0's tokens_per_s"),
    ("free drafts", "the checked speculative run: its forwards are not what"),  # the head never runs, checked too
    ("timed head skipped", "timed round 0, speculative: forwards differ from the checked run's"),  # timed only
    ("clock shifted", "timed round 0, greedy: the timed window opened"),  # a third of the greedy run left uncounted
    ("timed state drift", "timed round 0, speculative: row 1: the state it ends in differs from the checked run's"),
    ("row 1 done early", "timed round 0, speculative: row 1 had its tokens at "),  # its tokens/s inflated
    ("sampled greedy drift", "timed round 0, greedy: row 1: the state it ends in differs from the lockstep reference's"),
])
def test_a_batch_points_timed_rounds_and_published_numbers_are_audited(tiny, monkeypatch, plant, words):
    from mtplab.check import lossless
    from mtplab.experiment import point
    from mtplab.experiment.point import run_point

    if plant == "timed state drift":  # the timed runs (after the checked pass) leave row 1's recurrent state off;
        # they also say row 0 had its tokens at 0 s, and a phase of the split below zero
        real_spec, runs = speculative.generate, []

        def drifting(engine, *a, **kw):
            out = real_spec(engine, *a, **kw)
            runs.append(1)
            if len(runs) > 1 and engine.batch > 1:
                next(iter(engine.state.recurrent().values()))[1] *= 1.001
                out.finished[0] = 0.0
                out.split["verify"] = -out.split["verify"]
            return out

        monkeypatch.setattr(speculative, "generate", drifting)
    elif plant == "clock shifted":
        real = decode_rows

        def shifted(e, p, n, margins=False, **kw):
            g = real(e, p, n, margins=margins, **kw)
            if not margins:  # the timed runs'
                g.started, g.seconds = g.started + g.seconds / 3, g.seconds * 2 / 3
            return g

        monkeypatch.setattr(point, "decode_rows", shifted)
    elif plant == "greedy twice":  # the timed greedy does its work twice
        real = decode_rows
        monkeypatch.setattr(point, "decode_rows", lambda e, p, n, margins=False, **kw: (
            real(e, p, n, margins=False), real(e, p, n, margins=False))[1])
    elif plant in ("free drafts", "timed head skipped"):
        real_draft = step_drafts.draft_head
        checked = []

        def draft_head(engine, first, hidden, position, k, *rest):
            if plant == "free drafts" or checked[-1:] == ["done"]:
                return np.zeros((engine.batch, k), dtype=np.int64)
            return real_draft(engine, first, hidden, position, k, *rest)

        real_checked = lossless.checked_pass
        monkeypatch.setattr(lossless, "checked_pass", lambda *a: (real_checked(*a), checked.append("done"))[0])
        monkeypatch.setattr(step_drafts, "draft_head", draft_head)
    elif plant == "row 1 done early":  # the timed runs say row 1 had its tokens sooner than the step it had them at
        real_spec = speculative.generate

        def early(engine, prompts, n, references=None, on_commit=None):
            out = real_spec(engine, prompts, n, references, on_commit)
            if on_commit is None and engine.batch > 1:  # the timed runs (not the calibration's)
                out.finished[1] *= 0.3
            return out

        monkeypatch.setattr(speculative, "generate", early)
    elif plant == "sampled greedy drift":  # the timed plain-sampling greedy leaves row 1's state off
        real = decode_rows

        def drifting(e, p, n, margins=True, **kw):
            g = real(e, p, n, margins=margins, **kw)
            e.state.recurrent_arrays()[-1][1] += 1e-3
            return g

        monkeypatch.setattr(point, "decode_rows", drifting)
    elif plant == "another policy":  # the engine builds another policy than its config names
        from mtplab.engine import engine as engine_mod
        from mtplab.runtime.policy import policy

        monkeypatch.setattr(engine_mod, "policy", lambda name: policy("shared-max"))
    else:
        real_close = point.measure.close_round
        monkeypatch.setattr(point.measure, "close_round",
                            lambda s: real_close(s | {"tokens_per_s": s["tokens_per_s"] * 1.2}))
    drafter = "mtp" if plant in ("free drafts", "timed head skipped") else "oracle"
    run = batch_run(2, drafter=drafter).replace(rounds=2, tokens=16)
    if plant == "sampled greedy drift":
        run = run.replace(temperature=0.7, acceptance="rejection-sampling")
    result = run_point(run, tiny, calibration=synthetic_calibration() | {"batch": 2})
    # free drafts: the head that never drafts leaves its KV rows unwritten, which the head check sees first
    first = "LOSSLESS CHECK FAILED: row 0 of 2: the MTP head's KV" if plant == "free drafts" else "RUN CHECK FAILED: "
    assert not result.lossless and result.verdict.startswith(first), result.verdict
    problems = " | ".join(result.identity["timed_audit"]["problems"])
    assert words in problems, problems
    if plant == "timed state drift":
        assert "timed round 0, speculative: row 0 had its tokens at 0 ms, outside its run's (0, " in problems, problems
        assert "the published numbers: time split " in problems and "a phase below zero" in problems, problems


def test_a_rows_logits_off_the_float64_reference_are_caught_naming_the_row(tiny, monkeypatch):
    """A bug greedy and speculative share (row 1's logits shifted by 0.5: the same argmax, so the same tokens on both
    sides and at the stepper) is the float64 anchor's to catch, row by row."""
    run = batch_run(2)
    engine = Engine(run, tiny)
    real = engine.forward

    def shifted(*args, **kwargs):
        out = real(*args, **kwargs)
        out["logits"][1] += 0.5
        return out

    monkeypatch.setattr(engine, "forward", shifted)
    checked = checked_pass(engine, run_prompts(run, engine.desc.vocab_size), N)
    ok, message = verdict(checked.identity)
    assert not ok and message.startswith("LOSSLESS CHECK FAILED: row 1 of 2: greedy disagrees with the float64 "
                                         "reference"), message
    assert checked.rows[0]["anchor"]["ok"] and not checked.rows[1]["anchor"]["ok"]


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
def test_a_head_commit_that_writes_a_rows_kv_wrong_is_caught_naming_the_row(tiny, monkeypatch, schedule):
    """Each row's MTP-head KV is held to a teacher-forced head of that row alone, and each row's drafts are judged
    against it: a head commit that feeds row 1 row 0's hidden states (rows mixed up) fails, named."""
    from mtplab.engine import batch_head

    real = batch_head.mtp_io

    def stale(desc, state, tokens, hidden, position):
        if np.ndim(hidden) == 3 and hidden.shape[1] > 1:  # the commit's rows: row 1 given row 0's hidden states
            hidden = hidden.copy()
            hidden[1] = hidden[0]
        return real(desc, state, tokens, hidden, position)

    monkeypatch.setattr(batch_head, "mtp_io", stale)
    run = batch_run(2, "select", schedule, "mtp")
    engine = Engine(run, tiny)
    checked = checked_pass(engine, run_prompts(run, engine.desc.vocab_size), N)
    ok, message = verdict(checked.identity)
    assert not ok and message.startswith("LOSSLESS CHECK FAILED: row 1 of 2: the MTP head's KV differs"), message
    assert checked.rows[0]["head_kv_first_divergence"] is None and checked.rows[0]["head_kv_commits_checked"] > 0
    assert [row_lossless(row) for row in checked.rows] == [True, False]  # what the point publishes per row


def test_a_row_drafting_other_than_its_policy_chooses_is_caught_naming_the_row(tiny, monkeypatch):
    """Each row's K per step is its own policy's on its own accepted counts: a batch whose row 1 reads row 0's
    chooser fails the run check, named."""
    from mtplab.experiment import point
    from mtplab.experiment.point import run_point

    made, real = [], speculative.k_chooser

    def shared(engine):  # every row after the first gets row 0's chooser back (one chooser's history for two rows)
        made.append(real(engine) if len(made) % engine.batch == 0 else made[-1])
        return made[-1]

    monkeypatch.setattr(speculative, "k_chooser", shared)
    monkeypatch.setattr(point, "calibration_for", lambda run: synthetic_calibration() | {"batch": 2})
    run = batch_run(2, "select", "fused").replace(k=4, k_policy="probe", alpha=(0.95, 0.1), rounds=1, tokens=48)
    result = run_point(run, tiny)
    assert not result.lossless and result.verdict.startswith("RUN CHECK FAILED: the checked speculative run: row "), result.verdict


def test_rows_given_row_0s_prompt_are_caught_naming_the_row(tiny, monkeypatch):
    from mtplab.experiment import point
    from mtplab.experiment.point import run_point

    real = run_prompts
    monkeypatch.setattr(point, "run_prompts", lambda run, vocab: np.repeat(real(run, vocab)[:1], run.batch, axis=0))
    result = run_point(batch_run(2).replace(rounds=1, tokens=16), tiny)
    assert not result.lossless and result.verdict.startswith("RUN CHECK FAILED: row 1 decoded another prompt than its "
                                                             "seed's (1)"), result.verdict
    rows = result.extra["batch"]["per_row"]
    assert rows[0]["prompt"] == rows[1]["prompt"] and len(rows[1]["tokens"]) == 16  # what each row was given, kept


def test_a_row_drafting_at_another_alpha_than_its_own_is_caught_naming_the_row(tiny, monkeypatch):
    """Each row's oracle is held to its own seeded draws at its own alpha: a row drafting at 0.98 where its alpha is
    0.5 fails the run check, named, while the other rows keep theirs."""
    from mtplab.engine.drafters import OracleDrafter
    from mtplab.experiment.point import run_point

    real = OracleDrafter.__init__

    def planted(self, reference, alpha, seed, *a, **kw):
        real(self, reference, 0.98 if seed == 1 else alpha, seed, *a, **kw)

    monkeypatch.setattr(OracleDrafter, "__init__", planted)
    result = run_point(batch_run(2).replace(alpha=(0.6, 0.5), rounds=1, tokens=48), tiny)
    assert not result.lossless and result.verdict.startswith(
        "RUN CHECK FAILED: the checked speculative run: row 1: the oracle (alpha 0.5, seed 1) accepted"), result.verdict
    assert [p["alpha"] for p in result.extra["batch"]["per_row"]] == [0.6, 0.5]


def test_rows_with_alphas_of_their_own_are_each_the_batch_of_one_run_at_theirs(tiny):
    """alpha may be a list, one per row: row b is the batch-1 run at seed + b and its own alpha, step by step, and the
    batch reports the share of its row-steps spent on rows already done (the slowest row's cost) beside its
    prediction."""
    run = batch_run(3).replace(alpha=(0.9, 0.6, 0.1))
    engine = Engine(run, tiny)
    prompts = run_prompts(run, engine.desc.vocab_size)
    greedy = decode_rows(engine, prompts, N + run.k + 1, margins=False)
    spec = speculative.generate(engine, prompts, N, greedy.tokens)
    for b, alpha in enumerate(run.alpha):
        one = Engine(run.replace(batch=1, seed=run.seed + b, alpha=alpha), tiny)
        alone = one.speculative([int(t) for t in prompts[b]], N, reference=greedy.tokens[b])
        assert alone["tokens"] == spec.tokens[b] and alone["accepted"] == spec.accepted[b], f"row {b}"
    assert len(spec.accepted[2]) == spec.steps > len(spec.accepted[0])  # the low row is the slowest
    with pytest.raises(ConfigError, match=r"alpha=\(0.9, 0.6, 0.1\) sets each row's own acceptance: give one value "
                                          r"per row of a batch, batch=3 \(got batch=2\)"):
        run.replace(batch=2)
    with pytest.raises(ConfigError, match=r"alpha=\(0.9,\) sets each row's own acceptance"):  # no batch of one
        run.replace(batch=1, alpha=(0.9,))
    with pytest.raises(ConfigError, match=r"seed=9223372036854775807 with batch=3: row b runs at seed \+ b"):
        run.replace(seed=2**63 - 1)


def test_break_even_is_where_the_speedup_falls_through_one():
    from mtplab.report.batches import break_even

    at, text = break_even([1, 2, 4, 8], [1.5, 1.2, 0.9, 0.7])
    assert 2 < at < 4 and at == pytest.approx(2 ** (1 + 0.2 / 0.3)) and text.startswith("B ~ 3.2")
    assert break_even([1, 2, 4], [0.9, 0.8, 0.7]) == (None, "below greedy from B=1")
    assert break_even([1, 2, 4], [1.9, 1.5, 1.1]) == (None, "still ahead at B=4")
    from mtplab.report.batches import break_even_interval

    ci = [[1.4, 1.6], [1.0, 1.4], [0.8, 1.0], [0.6, 0.8]]  # low ends cross 1 between 2 and 4, high ends at 4
    assert break_even_interval([1, 2, 4, 8], ci) == " [95% CI 2.0, 4.0]"
    assert break_even_interval([1, 2, 4], [[0.9, 1.2], [0.8, 1.1], [0.7, 1.05]]) == " [95% CI <= 1, > 4]"
    assert break_even_interval([1, 2], [[1.1, 1.2], None]) == ""  # a median of repeats has no interval


def test_the_report_draws_speedup_against_batch(tiny):
    import pandas as pd

    from mtplab.experiment.point import run_point
    from mtplab.report import batches, selection

    rows = [run_point(batch_run(B).replace(rounds=1, tokens=16), tiny).row() for B in (1, 2)]
    # store.load's form: the model record aside, the generated ids renamed, config fields by name
    df = pd.DataFrame(rows).drop(columns="model").rename(columns={"tokens": "generated_tokens"})
    df = df.rename(columns=lambda c: c.split(".", 1)[1] if c.startswith("config.") else c)
    assert selection.figures_for(df)["batch"] and len(selection.batch_one(df)) == 1
    table = batches.break_even_table(df)
    assert list(table.batches) == ["1, 2"] and table.setting[0] == "oracle alpha=0.6"
    # the dashed line is the prediction at alpha at every B: batch 1's own speedup prices the steps it made
    merged, _ = batches.series_rows(df)
    one = df[df.batch == 1].iloc[0]
    assert one["predicted.at_alpha"] != one["predicted.speedup"]
    assert merged[merged.batch == 1]["predicted.speedup"].iloc[0] == one["predicted.at_alpha"]
    assert len(batches.per_row_spread(df)) == 1
    fig = batches.speedup_vs_batch(df)
    assert [ax.get_xlabel() for ax in fig.axes if ax.get_visible()] == ["batch B (rows decoded together)"]
    # points repeated at one B are one median per B; a field that varies (tokens) splits the series
    twice = pd.concat([df, df.assign(speedup=df.speedup * 2)])
    assert list(batches.break_even_table(twice).batches) == ["1, 2"]
    other = pd.concat([df, df.assign(tokens=17)])
    assert len(batches.break_even_table(other)) == 2 and "tokens" in batches.break_even_table(other)
    assert batches.break_even_table(df[df.batch == 1]).empty  # one batch size: nothing to draw against B


def test_a_batch_engine_refuses_the_one_sequence_calls(tiny):
    engine = Engine(batch_run(2), tiny)
    with pytest.raises(ValueError, match=r"decode them with mtplab.engine.greedy.decode_rows and "
                                         r"mtplab.engine.speculative.generate \(prompts \[B, P\]\)"):
        engine.greedy([1, 2, 3], 4)


def test_select_commits_when_the_states_are_not_stacked(tiny, monkeypatch):
    """States in buffers of their own (a preset whose state rows would lose alignment in one buffer): the carries go
    layer by layer, and select's commit is lossless too."""
    from mtplab.runtime.state import TargetState

    monkeypatch.setattr(TargetState, "stacked", lambda self, kind, layers: None)
    run = batch_run(2)
    engine = Engine(run, tiny)
    ok, message = verdict(checked_pass(engine, run_prompts(run, engine.desc.vocab_size), N).identity)
    assert ok, message


def test_a_bitwise_commit_is_held_to_a_tolerance_at_batch_b():
    """int4 weights: MatMulNBits rounds a [4, 1] decode apart from a [1, 1] one, so readvance-m1's state is not
    bitwise against the batch-1 reference at B = 4, and the rule says why instead of failing the run."""
    run = RunConfig(model="tiny", int4=True, k=3, drafter="mtp", commit="readvance-m1", schedule="fused", batch=4,
                    tokens=N, threads=1)
    engine = Engine(run)
    assert engine.desc.name == "tiny-int4"  # another model than tiny's fp32 build: named, timed and calibrated apart
    checked = checked_pass(engine, run_prompts(run, engine.desc.vocab_size), N)
    ok, message = verdict(checked.identity)
    assert ok, message
    assert "at batch 4 its [B, M] forwards may round apart" in checked.identity["state_rule"]
    assert checked.identity["state_max_rel_diff"] <= 1e-5


def test_a_result_stored_before_batches_still_matches_its_point():
    from mtplab.sweep.store import same_config

    run = RunConfig(model="tiny")
    before = {k: v for k, v in run.to_dict().items() if k != "batch"}  # a result.json from before the field
    assert same_config(before, run.to_dict()) and not same_config(before, run.replace(batch=2).to_dict())
