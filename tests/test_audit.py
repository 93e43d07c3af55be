"""The timed rounds are audited against the checked pass: each planted bug below ends where it is reported.

Every plant is a test double of a few lines (monkeypatching the engine), the bugs an adversary
tried on the point's published numbers: a mismatch names the round, the side and what differed;
a surprise that is no error is a named warning.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from conftest import synthetic_calibration

from mtplab.check import audit
from mtplab.engine.drafters import OracleDrafter
from mtplab.engine.engine import Engine
from mtplab.engine.greedy import decode_rows
from mtplab.engine.speculative import SpeculativeRun
from mtplab.engine.strategies import COMMITS, SCHEDULES, Registry
from mtplab.experiment import point
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.measure import rounds as measure
from mtplab.runtime.executor import Slot

RUN = dict(model="tiny", k=3, drafter="oracle", alpha=0.7, commit="select", tokens=48, rounds=2)


def _point(tiny, **changes):
    return run_point(RunConfig(**(RUN | changes)), tiny, calibration=synthetic_calibration(1e-4))


def _run_check_failed(r, *words, where: str = ""):
    """The point is a mismatch whose verdict starts with the run check (and `where`), its problems holding `words`."""
    assert not r.lossless and r.verdict.startswith("RUN CHECK FAILED: " + where), r.verdict
    problems = " | ".join(r.identity["timed_audit"]["problems"])
    for word in words:
        assert word in problems, problems


def _mismatch(r, *words):
    _run_check_failed(r, *words, where="timed round 0")


def _warned(r, name):
    assert r.lossless, r.verdict
    names = [w["name"] for w in r.warnings]
    assert name in names, r.warnings
    return next(w["message"] for w in r.warnings if w["name"] == name)


def _timed_greedy(monkeypatch, change):
    """Plant `change(real, engine, prompts, n)` into the timed greedy runs only (the point's; the checked pass decodes
    its greedy reference in mtplab.check.lossless)."""
    real = decode_rows
    monkeypatch.setattr(point, "decode_rows", lambda engine, prompts, n, margins=True: change(real, engine, prompts, n))


# A one-token prompt: the head's prefill is M=1 too. A short readvance-batched run ends with Primary's plan at M=n
# (its last commit's forward): the next greedy round's first decode replaces it, which is no problem.
@pytest.mark.parametrize("commit, changes", [(c, {}) for c in COMMITS] + [("select", {"prompt_len": 1}),
                                                                          ("readvance-batched", {"tokens": 8})])
def test_clean_points_pass_the_audit_without_warnings(tiny, commit, changes):
    r = _point(tiny, commit=commit, rounds=3, **changes)
    assert r.lossless and r.identity["timed_audit"] == {"problems": [], "problem_count": 0, "warnings": {}}
    assert not [w for w in r.warnings if w["name"] != "efficiency"], r.warnings


def test_an_unpinned_workspace_moving_more_often_in_a_timed_round_is_told_not_failed(tiny):
    """Under `sibling` the Verify workspace lands where the pool puts it: a short run (before max_recaptures) can
    invalidate more plans in a timed round than in the checked run. That is what the policy measures: a warning."""
    r = _point(tiny, policy="sibling", k=1, tokens=8, rounds=1)
    assert r.lossless and r.identity["timed_audit"]["problems"] == [], r.verdict
    (w,) = [w for w in r.warnings if w["name"] == "timed_invalidations"]
    assert "the verify slot invalidated" in w["message"] and "policy 'sibling'" in w["message"]


def test_a_recapture_budget_the_timed_round_spends_at_another_step_is_told_not_failed(tiny):
    """readvance-batched invalidates Primary's M=1 plan at every re-advance; a timed round starts from the plan the
    run before it left, so its max_recaptures runs out at another step than the checked run's: told, not failed."""
    r = _point(tiny, k=2, commit="readvance-batched", schedule="fused", tokens=24, seed=2)
    assert r.lossless and r.identity["timed_audit"]["problems"] == [], r.verdict
    (w,) = [w for w in r.warnings if w["name"] == "timed_fallbacks"]
    assert "the primary slot" in w["message"] and "max_recaptures=3 reached in the timed run" in w["message"]


def test_fewer_invalidations_from_a_timed_round_that_began_with_no_plan_are_told_not_failed(tiny):
    """shared-jit without retain: a timed round that follows a speculative run begins with no Primary plan ready, so it
    warms up where the checked run (after greedy, its M=1 plan ready) invalidated: two invalidations fewer, no replay
    more. That follows from where it began: told, not failed."""
    r = _point(tiny, commit="readvance-batched", schedule="fused", policy="shared-jit",
               retain_decode_graph_across_spec=False, tokens=24, seed=2)
    assert r.lossless and r.identity["timed_audit"]["problems"] == [], r.verdict
    (w,) = [w for w in r.warnings if w["name"] == "timed_invalidations"]
    assert "the primary slot invalidated 2 plans, the checked run 4" in w["message"], w["message"]
    assert "it began with no plan ready on that slot, the checked run with its plan at M=1 ready" in w["message"]


def test_a_timed_round_that_began_elsewhere_explains_fewer_invalidations_only_without_more_replays():
    began = {"none": audit.Trace({}, {}, {}, {"primary": False, "verify": True}),
             "M=1": audit.Trace({}, {}, {}, {"primary": True, "verify": True}, primary_tokens_before=1)}
    checked, fewer = {"invalidations": 4, "replays": 10}, {"invalidations": 2, "replays": 10}
    assert "it began with no plan ready" in audit._other_start("primary", True, began["none"], began["M=1"], fewer,
                                                               checked)
    assert audit._other_start("primary", True, began["M=1"], began["M=1"], fewer, checked) is None  # the same start
    assert audit._other_start("primary", True, began["none"], began["M=1"], fewer | {"replays": 11}, checked) is None
    assert audit._other_start("primary", True, began["none"], began["M=1"], checked, fewer) is None  # more, not fewer
    # Primary's M says nothing of another slot's start
    assert audit._other_start("verify", False, began["none"], began["M=1"], fewer, checked) is None


def _timed_rounds_only(monkeypatch, change):
    """Planted: `change(engine)` (returning its undo) applies to the timed speculative rounds only, not the checked run."""
    real = point.speculative.generate

    def generate(engine, prompts, n, references=None, on_commit=None):
        if on_commit is not None:  # the checked run
            return real(engine, prompts, n, references, on_commit)
        undo = change(engine)
        try:
            return real(engine, prompts, n, references, on_commit)
        finally:
            undo()

    monkeypatch.setattr(point.speculative, "generate", generate)


def test_timed_rounds_held_still_under_an_unpinned_policy_fail_the_run_check(tiny, monkeypatch):
    """Timed rounds that pin the Verify workspace publish sibling-pinned's speed as `sibling`'s: fewer invalidations
    than the checked run is never the policy's doing."""
    def pin(engine):
        memory = engine.target.memory[Slot.VERIFY]
        memory.pinned = True
        return lambda: setattr(memory, "pinned", False)

    _timed_rounds_only(monkeypatch, pin)
    r = _point(tiny, policy="sibling", tokens=128, rounds=2)
    _run_check_failed(r, "the verify slot")


def test_timed_rounds_beyond_their_recapture_budget_fail_the_run_check(tiny, monkeypatch):
    def unbounded(engine):
        limit = engine.target.max_recaptures
        engine.target.max_recaptures = 10**9
        return lambda: setattr(engine.target, "max_recaptures", limit)

    _timed_rounds_only(monkeypatch, unbounded)
    r = _point(tiny, k=2, commit="readvance-batched", schedule="fused", tokens=48, seed=2)
    _run_check_failed(r, "the primary slot invalidated")


def test_timed_rounds_with_a_smaller_recapture_budget_fail_the_run_check(tiny, monkeypatch):
    """A timed round that runs eager after fewer recaptures than max_recaptures allows is another config's timing,
    even where its counts stay within the checked run's tolerance (here: a round that began with no plan ready)."""
    def stingy(engine):
        limit = engine.target.max_recaptures
        engine.target.max_recaptures = 1
        return lambda: setattr(engine.target, "max_recaptures", limit)

    _timed_rounds_only(monkeypatch, stingy)
    r = _point(tiny, commit="readvance-batched", schedule="fused", policy="shared-jit",
               retain_decode_graph_across_spec=False, tokens=24, seed=0)
    _run_check_failed(r, "the primary slot ran eager for the rest of the run after 2 invalidations (a budget of "
                         "max_recaptures=1); the config's max_recaptures=3 allows 4")


def test_a_replay_into_memory_another_owner_holds_with_the_check_on_fails_the_run_check(tiny, monkeypatch):
    """Planted: the replay check forgets the workspace block its plan was bound to, so under `sibling` a plan replays
    into a block the pool gave to another owner. The executor counts such replays as hazards; with the signature
    check on there must be none."""
    from mtplab.runtime.signature import ReplayCheck

    real = ReplayCheck.stage

    def stage_ignoring_the_block(self, memory, feeds, outputs, bound):
        self.block = memory.block
        return real(self, memory, feeds, outputs, bound)

    monkeypatch.setattr(ReplayCheck, "stage", stage_ignoring_the_block)
    r = _point(tiny, policy="sibling", tokens=40)
    _run_check_failed(r, "the verify slot replayed a plan into memory another owner held",
                      "with the signature check on")


def test_timed_greedy_running_every_decode_eager_is_a_mismatch_not_a_speedup(tiny, monkeypatch):
    _timed_greedy(monkeypatch, lambda real, self, p, n: real(self, p, n, eager=True, margins=False))
    _mismatch(_point(tiny), "greedy: primary ran 48 eager forwards and 0 through its plan")


def test_timed_greedy_doing_two_forwards_per_token_is_a_mismatch(tiny, monkeypatch):
    def twice(real, self, p, n):
        decoder = self._decoder

        def doubled(eager):
            decode, ids, feeds = decoder(eager)

            def run():
                decode()
                return decode()

            return run, ids, feeds

        self._decoder = doubled
        try:
            return real(self, p, n, margins=False)
        finally:
            del self._decoder

    _timed_greedy(monkeypatch, twice)
    _mismatch(_point(tiny), "greedy: primary ran 1 eager forwards and 94 through its plan")


@pytest.mark.parametrize("label, words", [("primary", ("LOSSLESS CHECK FAILED: ", "the recurrent state first differed")),
                                          ("mtp", ("RUN CHECK FAILED: the checked speculative run", "the mtp slot ran 79 forwards, the engine counted 40"))])
def test_a_replayer_replaying_twice_per_run_is_a_mismatch(tiny, monkeypatch, label, words):
    from mtplab.runtime.executor import Executor

    real = Executor.replayer

    def twice(self, slot, *args):  # greedy's decodes (the target's Primary) or the head's drafts
        replay = real(self, slot, *args)
        if self.labels[slot] != label:
            return replay

        def run():
            replay()
            return replay()

        return run

    monkeypatch.setattr(Executor, "replayer", twice)
    r = _point(tiny)
    assert not r.lossless and words[0] in r.verdict, r.verdict
    text = r.verdict + " | ".join(r.identity.get("timed_audit", {}).get("problems", []))
    assert all(word in text for word in words[1:]), text


@pytest.mark.parametrize("bug", ["wrong token", "half the tokens"])
def test_timed_greedy_computing_wrong_or_fewer_tokens_is_a_mismatch(tiny, monkeypatch, bug):
    def planted(real, self, p, n):
        if bug == "half the tokens":
            return real(self, p, n // 2, margins=False)
        g = real(self, p, n, margins=False)
        g.tokens[0][30] = (g.tokens[0][30] + 1) % tiny.config.vocab_size
        return g

    _timed_greedy(monkeypatch, planted)
    _mismatch(_point(tiny), "token 30 is" if bug == "wrong token" else "made 24 tokens, asked for 48")


def test_timed_greedy_ending_one_position_short_with_its_state_thrown_away_is_a_mismatch(tiny, monkeypatch):
    def planted(real, self, p, n):
        g = real(self, p, n, margins=False)
        self.state.length -= 1  # the last decode's advance dropped, and its state with it
        for a in self.state.recurrent_arrays():
            a[...] = 0
        return g

    _timed_greedy(monkeypatch, planted)
    _mismatch(_point(tiny), "its state ends at length 54, expected 55 (the prompt's 8 tokens and 47 decodes)")


def test_a_timed_speculative_run_returning_the_reference_without_forwards_is_a_mismatch(tiny, monkeypatch):
    real = point.speculative.generate

    def generate(engine, prompts, n, references=None, on_commit=None):
        if on_commit is not None:  # the checked run
            return real(engine, prompts, n, references, on_commit)
        t = time.perf_counter()
        split = dict.fromkeys(("decode", "draft", "verify", "commit"), 0.0)
        return SpeculativeRun([references[0][:n]], [[3] * 12], 12, 1e-5, [1e-5], split, t, ks=[[3] * 12],
                              widths=[3] * 12)

    monkeypatch.setattr(point.speculative, "generate", generate)
    _mismatch(_point(tiny), "speculative: accepted counts differ", "forwards differ from the checked run's")


def test_an_oracle_drafter_skipping_the_head_after_the_first_generation_is_a_mismatch(tiny, monkeypatch):
    from mtplab.engine import step_drafts

    real, calls = step_drafts.prefill_head, []

    def prefill(engine, tokens, hidden):  # from the second generation on, the oracle's head never drafts
        calls.append(1)
        if len(calls) > 1:
            monkeypatch.setattr(step_drafts, "draft_head", lambda engine, first, hidden, position, k, *rest: np.zeros(
                (engine.batch, k), dtype=np.int64))
        return real(engine, tokens, hidden)

    monkeypatch.setattr(step_drafts, "prefill_head", prefill)
    _mismatch(_point(tiny), "forwards differ from the checked run's", "'mtp/M=1': (0,")


def test_a_timed_only_state_drift_is_a_mismatch(tiny, monkeypatch):
    real = Engine.commit

    def commit(self, *args):
        real(self, *args)
        if self.watch is None:  # timed runs only: the checked pass watches every forward
            for a in self.state.gdn.values():
                a *= 1.01

    monkeypatch.setattr(Engine, "commit", commit)
    r = _point(tiny)
    assert not r.lossless and "timed round 0, speculative" in r.verdict


def test_a_greedy_clock_that_includes_the_prefill_is_a_mismatch(tiny, monkeypatch):
    def from_before_the_prefill(real, self, p, n):
        t = time.perf_counter()
        g = real(self, p, n, margins=False)
        g.seconds, g.started = g.started + g.seconds - t, t
        return g

    _timed_greedy(monkeypatch, from_before_the_prefill)
    _run_check_failed(_point(tiny), "before the untimed setup (the prefill) ended", where="timed round 0, greedy")


def test_untimed_commits_are_a_mismatch(tiny, monkeypatch):
    real = point.speculative.generate

    def generate(*a, **kw):
        out = real(*a, **kw)
        out.seconds -= out.split["commit"] + out.split["verify"]
        return out

    monkeypatch.setattr(point.speculative, "generate", generate)
    r = _point(tiny, rounds=2)
    _run_check_failed(r, "before its last forward ended")
    assert "phases timed outside the clock" in next(w["message"] for w in r.warnings if w["name"] == "unaccounted")


def test_a_speculative_side_counting_its_overshoot_is_a_mismatch(tiny, monkeypatch):
    real = measure.record_side

    def record_side(sample, side, rows, n, seconds):
        real(sample, side, rows, max(map(len, rows)) if side == "speculative" else n, seconds)

    monkeypatch.setattr(measure, "record_side", record_side)
    _mismatch(_point(tiny), "speculative: counted")


def test_an_mtp_head_drafting_worse_than_calibrated_is_flagged_and_a_clean_one_is_not(tiny):
    from mtplab.experiment import calibrate

    # The head's real acceptance on the calibration's own prompts, at the run's length (200 tokens: ~130 steps).
    measured = calibrate._acceptance("tiny", 200, 0)
    calib = synthetic_calibration(1e-4) | {"mtp_acceptance": measured}
    run = RunConfig(**(RUN | {"drafter": "mtp", "alpha": 0.8, "tokens": 200, "rounds": 1}))
    clean = run_point(run, tiny, calibration=calib)
    assert "acceptance_below_calibration" not in [w["name"] for w in clean.warnings], clean.warnings
    # a calibration that promises a better head than this one: the same run, lossless, draws the warning
    better = measured | {"per_position": [min(1.0, p + 0.3) for p in measured["per_position"]],
                         "alpha": min(1.0, measured["alpha"] + 0.3)}
    flagged = run_point(run, tiny, calibration=calib | {"mtp_acceptance": better})
    assert flagged.lossless  # the output is still greedy's: only the warning tells
    assert "below the 1% false-alarm line" in _warned(flagged, "acceptance_below_calibration")


def test_a_head_drafting_from_a_lost_hidden_state_fails_the_head_check(tiny, monkeypatch):
    from mtplab.engine import step_drafts

    real = step_drafts.draft_head
    monkeypatch.setattr(step_drafts, "draft_head", lambda engine, first, hidden, position, k, *rest: real(
        engine, first, hidden * 0, position, k, *rest))  # the head loses its hidden-state input: its KV row is wrong
    planted = _point(tiny, drafter="mtp", alpha=0.8, tokens=24, rounds=1)
    assert not planted.lossless
    assert "the MTP head's KV differs from a teacher-forced head's" in planted.verdict


# -- plants shared by the checked and the timed runs: the checked run is held to what its config implies --------


def test_an_executor_that_runs_eager_but_counts_a_replay_is_caught_by_the_backends_own_count(tiny, monkeypatch):
    from mtplab.runtime.executor import Executor, Status

    real, real_replay = Executor.run, Executor._checked_replay

    def run(self, slot, feeds, outputs, bound):
        st = self.state[slot]
        if st.status is Status.READY and self.labels[slot] == "primary":
            st.replays += 1
            return self._eager_temporaries(slot, feeds, outputs, bound)
        return real(self, slot, feeds, outputs, bound)

    def checked_replay(self, st, mem, session, feeds, outputs, bound):  # greedy's replayer takes this path first
        slot = next(s for s, held in self.state.items() if held is st)
        if st.status is Status.READY and self.labels[slot] == "primary":
            st.replays += 1
            return self._eager_temporaries(slot, feeds, outputs, bound)
        return real_replay(self, st, mem, session, feeds, outputs, bound)

    monkeypatch.setattr(Executor, "run", run)
    monkeypatch.setattr(Executor, "_checked_replay", checked_replay)
    _run_check_failed(_point(tiny), "the backend ran")


@pytest.mark.parametrize("bug", ["no head", "k-1 drafts", "fused for decode-verify"])
def test_a_checked_run_that_does_not_do_what_its_config_says_is_caught(tiny, monkeypatch, bug):
    from mtplab.engine import speculative, step_drafts

    if bug == "no head":  # drafts without running the head, and its KV never committed
        monkeypatch.setattr(step_drafts, "draft_head", lambda engine, first, hidden, position, k, *rest: np.zeros(
            (engine.batch, k), dtype=np.int64))
        monkeypatch.setattr(step_drafts, "commit_head", lambda *a: (None, None, None))
    elif bug == "k-1 drafts":
        real = OracleDrafter.draft
        monkeypatch.setattr(OracleDrafter, "draft", lambda self, first, hidden, position, k: real(
            self, first, hidden, position, k - 1))
    else:  # the loop steps as fused, where the registry (which every check reads) says decode-verify decodes first
        planted = Registry("schedule")
        for schedule in SCHEDULES.values():
            planted.register(dataclasses.replace(schedule, decodes=0))
        monkeypatch.setattr(speculative, "SCHEDULES", planted)
    r = _point(tiny)
    if bug == "no head":  # the head's KV, never written, is what the check finds first
        assert not r.lossless and "the MTP head's KV differs from a teacher-forced head's" in r.verdict, r.verdict
    elif bug == "k-1 drafts":  # the fixed policy drafts k every step: replayed on the run's counts, it says so first
        _run_check_failed(r, "the checked speculative run: it drafted 2 at step 1, where k_policy='fixed' chooses 3")
    else:
        _run_check_failed(r, "the checked speculative run: its forwards are not what")


@pytest.mark.parametrize("bug", ["policy", "threads", "retain"])
def test_an_engine_built_otherwise_than_its_config_is_caught(tiny, monkeypatch, bug):
    from mtplab.engine import engine as engine_mod
    from mtplab.runtime import executor as executor_mod
    from mtplab.runtime import sessions as sessions_mod
    from mtplab.runtime.policy import policy

    if bug == "policy":
        monkeypatch.setattr(engine_mod, "policy", lambda name: policy("shared-max"))
    elif bug == "threads":
        real_session = sessions_mod.make_session
        monkeypatch.setattr(sessions_mod, "make_session", lambda path, shared, threads, provider, greedy: real_session(
            path, shared, 0, provider, greedy))
    else:
        real_init = executor_mod.Executor.__init__
        monkeypatch.setattr(executor_mod.Executor, "__init__", lambda self, *a, **kw: real_init(
            self, *a, **(kw | {"retain_decode_graph_across_spec": False})))
    r = _point(tiny, threads=1)
    _run_check_failed(r, {"policy": "its arena policy is 'shared-max'", "threads": "its sessions run [0] intra-op",
                          "retain": "retain=False"}[bug])


def test_plans_dropped_at_every_generation_are_caught_as_captures_without_a_cause(tiny, monkeypatch):
    from mtplab.runtime.executor import Executor, Status

    real = Executor.new_generation

    def new_generation(self):
        real(self)
        for st in self.state.values():
            st.status, st.plan, st.check = Status.NEEDS_WARMUP, None, None

    monkeypatch.setattr(Executor, "new_generation", new_generation)
    _run_check_failed(_point(tiny), "captured 1 plans with 0 invalidations")


def test_a_timed_greedy_computing_margins_is_a_mismatch(tiny, monkeypatch):
    _timed_greedy(monkeypatch, lambda real, self, p, n: real(self, p, n, margins=True))
    _mismatch(_point(tiny), "top-2 margins")


@pytest.mark.parametrize("plant, words", [
    ("speedup", "the published numbers: round 0's speedup"),
    ("tokens_per_s", "the published numbers: round 0's tokens_per_s"),  # the speedup then agrees with it
])
def test_a_published_rate_that_is_not_the_rounds_own_is_caught(tiny, monkeypatch, plant, words):
    real = measure.close_round

    def close_round(sample):
        if plant == "tokens_per_s":
            sample["tokens_per_s"] *= 1.2
        out = real(sample)
        if plant == "speedup":
            out["speedup"] *= 1.2
        return out

    monkeypatch.setattr(measure, "close_round", close_round)
    _run_check_failed(_point(tiny), words)


def test_a_published_interval_or_efficiency_that_is_not_the_rounds_is_caught(tiny, monkeypatch):
    real = measure.summary_of

    def summary_of(samples, key):  # a narrower, "stable" interval than the rounds give
        out = real(samples, key)
        return out | {"ci": [out["median"] * 0.995, out["median"] * 1.005], "stable": True}

    monkeypatch.setattr(measure, "summary_of", summary_of)
    _run_check_failed(_point(tiny), "the published numbers: speedup_ci", "is not its rounds' bootstrap CI")
    monkeypatch.setattr(measure, "summary_of", real)
    real_result = measure.run_result

    def run_result(*args, **kwargs):  # an efficiency nearer 1 than the rounds give
        out = real_result(*args, **kwargs)
        out.efficiency = 1.0
        return out

    monkeypatch.setattr(measure, "run_result", run_result)
    _run_check_failed(_point(tiny), "efficiency 1 is not its rounds' speedups over the prediction")


@pytest.mark.parametrize("plant, words", [
    ("the median taken as the largest round", "the published numbers: speedup"),
    ("the bootstrap at a 50% level", "is not its rounds' bootstrap CI"),
])
def test_a_changed_statistics_helper_is_caught_by_the_rechecks_own_statistics(tiny, monkeypatch, plant, words):
    from mtplab.measure import stats

    if plant.startswith("the median"):
        monkeypatch.setattr(stats, "median", lambda samples: float(max(s for s in samples if s == s)))
    else:
        real = stats.bootstrap_ci
        monkeypatch.setattr(stats, "bootstrap_ci", lambda samples, confidence=0.95, **kw: real(samples, 0.5, **kw))
    # 5 rounds: at 3 (2 and a confirming round on a busy machine) the 50% and 95% intervals are both the range
    _run_check_failed(_point(tiny, rounds=5), words)


@pytest.mark.parametrize("plant", ["another alpha", "sqrt(alpha)"])
def test_an_oracle_accepting_otherwise_than_its_seeded_draws_fails_the_run_check(tiny, monkeypatch, plant):
    """Its accepted counts are replayed exactly from its seeded draws (check.expected.oracle_problems): no false alarm,
    and a rate off its alpha is caught at any run length (the binomial warning needs many steps)."""
    from mtplab.engine import drafters

    if plant == "another alpha":
        real = OracleDrafter.__init__
        monkeypatch.setattr(OracleDrafter, "__init__", lambda self, reference, alpha, *a, **kw: real(
            self, reference, 0.98, *a, **kw))
    else:
        real_drafts = drafters._oracle_drafts
        monkeypatch.setattr(drafters, "_oracle_drafts", lambda reference, index, uniforms, shifts, j, alpha, vocab, out:
                            real_drafts(reference, index, uniforms, shifts, j, alpha ** 0.5, vocab, out))
    r = _point(tiny, alpha=0.5, tokens=24)
    _run_check_failed(r, "the oracle (alpha 0.5, seed 0) accepted", "where its seeded draws keep",
                      where="the checked speculative run")


def test_a_greedy_baseline_off_its_calibrated_cost_is_flagged():
    from mtplab.check.flags import GREEDY_DRIFT_BAND, greedy_warning

    calibration = {"greedy_token": 1e-3}
    assert greedy_warning(1.2e-3, calibration) is None and greedy_warning(float("nan"), calibration) is None
    assert greedy_warning(5e-3, {}) is None  # a calibration without greedy's cost (a synthetic one) says nothing
    slow = greedy_warning(2e-3, calibration)  # a decode doing twice the calibrated loop's work
    assert slow["name"] == "greedy_drift" and f"(2.00x, outside [{GREEDY_DRIFT_BAND[0]}, {GREEDY_DRIFT_BAND[1]}])" in \
        slow["message"]
    assert greedy_warning(0.5e-3, calibration)["name"] == "greedy_drift"


def test_a_point_whose_greedy_ran_far_from_its_calibration_says_so(tiny):
    r = run_point(RunConfig(**(RUN | {"rounds": 2})), tiny, calibration=synthetic_calibration(1e-4) | {"greedy_token": 1.0})
    assert "greedy took" in _warned(r, "greedy_drift")
