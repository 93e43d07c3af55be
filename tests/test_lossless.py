"""The lossless check catches planted bugs: each one fails the verdict and is reported where it acted."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import plant_over_accept

from mtplab.check import verdict as oracle
from mtplab.engine import commits, speculative
from mtplab.engine import engine as engine_mod
from mtplab.engine.engine import Engine
from mtplab.engine.strategies import COMMITS
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.model import graph
from mtplab.runtime.executor import Executor, Slot

READVANCE = ("readvance-batched", "readvance-m1")


def _run(tiny, commit: str, schedule: str = "decode-verify", **kw):
    run = RunConfig(
        model="tiny", k=3, drafter="oracle", alpha=0.7, commit=commit, schedule=schedule, tokens=48, **kw
    )
    return run_point(run, tiny)


@pytest.fixture(scope="module")
def clean(tiny):
    """The unplanted runs: every commit strategy lossless, with the steps the planted runs mirror."""
    return {c: _run(tiny, c) for c in COMMITS}


def _failed(r) -> None:
    assert not r.lossless, r.verdict
    assert r.verdict.startswith("LOSSLESS CHECK FAILED")


def test_clean_runs_pass_with_every_commit_checked(clean):
    for commit, r in clean.items():
        assert r.lossless, (commit, r.verdict)
        assert r.identity["state_commits_checked"] == r.steps + 1  # every commit, and the end of the run
        assert r.identity["anchor"]["ok"] and r.identity["non_finite"] is None
        assert r.identity["state_reference_bytes"] > 0


@pytest.mark.parametrize("commit", COMMITS)
def test_over_accepting_by_one_is_caught_at_the_first_rejected_draft(tiny, clean, commit, monkeypatch):
    plant_over_accept(monkeypatch)
    r = _run(tiny, commit)
    _failed(r)
    # Up to the first step that rejected a draft the runs are the same; there the bad draft is emitted
    # after the prefill token, (guaranteed + accepted + bonus) per earlier step, and the guaranteed token.
    acc = clean[commit].accepted_per_step
    step = next(i for i, n in enumerate(acc) if n < 3)
    assert r.identity["first_divergence"] == 1 + sum(n + 2 for n in acc[:step]) + 1 + acc[step]


@pytest.mark.parametrize("commit", READVANCE)
def test_a_skipped_restore_is_caught_at_the_first_commit(tiny, commit, monkeypatch):
    monkeypatch.setattr(Engine, "restore_state", lambda self: None)
    r = _run(tiny, commit)
    _failed(r)
    assert r.identity["state_first_divergence"]["step"] == 1  # the verify's advance is never undone


@pytest.mark.parametrize("commit", COMMITS)
def test_a_commit_keeping_one_token_too_many_is_caught_at_the_first_commit_not_crashed(tiny, commit, monkeypatch):
    real = Engine.commit

    def commit_one_more(self, *args):
        real(self, *args)
        self.state.length += 1  # the planted bug: the state claims a token no forward wrote

    monkeypatch.setattr(Engine, "commit", commit_one_more)
    r = _run(tiny, commit)
    _failed(r)
    assert r.identity["state_first_divergence"]["step"] == 1


def test_a_committed_length_beyond_every_emitted_token_is_a_divergence_with_its_words(tiny):
    from mtplab.check.lockstep import Lockstep
    from mtplab.check.verdict import StateRule

    lock = Lockstep.start(tiny, [1, 2, 3], [4, 5], StateRule(True, 0.0, "bitwise"))
    lock.check(1, 7, {})  # 7 tokens committed: the prompt's 3 and the 2 emitted are all there are
    assert lock.first_divergence == {"step": 1, "length": 7, "tensor": "its length", "non_finite": False, "beyond": 5}
    ok, msg = oracle.verdict({"token_identical": True, "state_first_divergence": lock.first_divergence})
    assert not ok and msg == ("LOSSLESS CHECK FAILED: committed state differs from the reference's after step 1 "
                              "(length 7), its length: 7 tokens, beyond the 5 of the prompt and every token emitted "
                              "(rule: the lockstep reference's rule)")


def test_a_conv_carry_rebuilt_from_one_input_too_few_is_caught(tiny, monkeypatch):
    real = graph.rebuild_conv  # what select runs, layer by layer
    monkeypatch.setattr(commits, "rebuild_conv", lambda state, inputs, n, *a: real(state, inputs, n - 1, *a))
    r = _run(tiny, "select")
    _failed(r)
    first = r.identity["state_first_divergence"]
    assert first["step"] == 1 and first["tensor"].startswith("conv_state.")


@pytest.mark.parametrize("off", [-1, +1])
def test_a_gdn_replay_of_the_wrong_number_of_transitions_is_caught(tiny, off, monkeypatch):
    real = graph.replay_transitions  # what select runs on the host, layer by layer
    monkeypatch.setattr(graph, "replay_transitions", lambda layout, s, flat, n: real(layout, s, flat, n + off))
    r = _run(tiny, "select")
    _failed(r)
    first = r.identity["state_first_divergence"]
    assert first["step"] == 1 and first["tensor"].startswith("gdn_state.")


def test_a_dropped_last_token_in_the_batched_readvance_is_caught_where_it_first_acts(tiny, clean, monkeypatch):
    real = Engine.forward

    def forward(self, slot, tokens, in_place=True, eager=False, label=None):
        if slot is Slot.PRIMARY and label is None and np.size(tokens) > 1:
            tokens = tokens[..., :-1]
        return real(self, slot, tokens, in_place, eager, label)

    monkeypatch.setattr(Engine, "forward", forward)
    r = _run(tiny, "readvance-batched")
    _failed(r)
    # A step re-advances [guaranteed, accepted...]: the bug acts on the first step that accepted a draft.
    step = next(i for i, n in enumerate(clean["readvance-batched"].accepted_per_step) if n >= 1)
    assert r.identity["state_first_divergence"]["step"] == step + 1


@pytest.mark.parametrize("commit", COMMITS)
def test_a_nan_written_after_the_final_commit_fails(tiny, commit, monkeypatch):
    real = speculative.generate

    def generate(engine, *args, **kw):
        out = real(engine, *args, **kw)
        engine.state.gdn[engine.cfg.gdn_layer_ids[-1]][0, 0, 0, 0] = np.nan
        return out

    monkeypatch.setattr(speculative, "generate", generate)
    r = _run(tiny, commit)
    _failed(r)
    first = r.identity["state_first_divergence"]
    assert first["non_finite"] and first["tensor"] == f"gdn_state.{tiny.config.gdn_layer_ids[-1]}"
    assert "non-finite" in r.verdict


@pytest.mark.parametrize("commit", COMMITS)
def test_half_a_unit_on_one_state_element_after_one_commit_is_caught_at_that_commit(tiny, commit, monkeypatch):
    real = Engine.commit
    calls = []

    def commit_fn(self, *args):
        real(self, *args)
        calls.append(1)
        if len(calls) == 8:
            self.state.gdn[self.cfg.gdn_layer_ids[0]][0, 1, 2, 3] += 0.5

    monkeypatch.setattr(Engine, "commit", commit_fn)
    r = _run(tiny, commit)
    _failed(r)
    first = r.identity["state_first_divergence"]
    assert first["step"] == 8 and first["tensor"] == f"gdn_state.{tiny.config.gdn_layer_ids[0]}"
    assert first["max_abs_diff"] == pytest.approx(0.5, rel=1e-3)


def test_the_verdict_names_where_the_state_broke_its_rule():
    ident = {"token_identical": True, "state_bitwise": False, "state_max_abs_diff": 2e-4, "state_max_rel_diff": 2e-5,
             "state_rule": "relative 1e-05: select ..."}
    at_step = {"step": 3, "length": 20, "tensor": "kv.1.key", "max_abs_diff": 2e-4, "max_rel_diff": 2e-5,
               "non_finite": False}
    ok, msg = oracle.verdict(ident | {"state_first_divergence": at_step})
    assert not ok and "after step 3 (length 20), kv.1.key" in msg and "rule: relative 1e-05: select" in msg
    ok, msg = oracle.verdict(ident | {"state_first_divergence": None, "state_commits_checked": 5, "kv_checked": True})
    assert ok and msg == "identical to greedy: every token, state and KV within 1e-05 relative at 5 checks (worst 2e-05)"
    assert "state and KV: rule relative 1e-05: select ...; checked after every commit" in oracle.details(ident)[0]


@pytest.mark.parametrize("commit", COMMITS)
def test_a_prefill_bug_shared_by_greedy_and_speculative_is_caught_by_the_anchor(tiny, commit, monkeypatch):
    real = Engine.forward

    def forward(self, slot, tokens, in_place=True, eager=False, label=None):
        if label == "prefill":
            tokens = list(tokens)
            tokens[2] = (tokens[2] + 1) % self.cfg.vocab_size
        return real(self, slot, tokens, in_place, eager, label)

    monkeypatch.setattr(Engine, "forward", forward)
    r = _run(tiny, commit)
    _failed(r)
    assert r.identity["token_identical"]  # greedy and speculative agree: only the anchor can see it
    assert not r.identity["anchor"]["ok"] and "float64 reference" in r.verdict


def test_a_zeroed_gdn_state_before_each_forward_shows_in_the_tokens(tiny, clean, monkeypatch):
    real, real_decoder = Engine.forward, Engine._decoder

    def zero(state):
        for s in state.gdn.values():
            s[...] = 0

    def forward(self, slot, tokens, in_place=True, eager=False, label=None):
        zero(self.state)
        return real(self, slot, tokens, in_place, eager, label)

    def decoder(self, eager):  # greedy's decodes take a path of their own: the bug is planted there too
        decode, ids, feeds = real_decoder(self, eager)

        def run():
            zero(self.state)
            return decode()

        return run, ids, feeds

    monkeypatch.setattr(Engine, "forward", forward)
    monkeypatch.setattr(Engine, "_decoder", decoder)
    r = _run(tiny, "readvance-m1")
    _failed(r)
    assert r.identity["anchor"]["first_token_disagreement"] is not None
    assert r.tokens[:16] != clean["readvance-m1"].tokens[:16]


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
def test_a_nan_in_one_verify_logit_is_reported_where_it_was_first_seen(tiny, schedule, monkeypatch):
    real_run, real_replayer = Executor.run, Executor.replayer
    verifies = []

    def poison(executor, slot, out):  # the target's third verify's last logits row gets an inf
        if executor.labels[slot] == "verify":
            verifies.append(1)
            if len(verifies) == 3:
                out["logits"][0, -1, 5] = np.inf

    def run(self, slot, feeds, outputs, bound):
        out = real_run(self, slot, feeds, outputs, bound)
        poison(self, slot, out)
        return out

    def replayer(self, slot, feeds, outputs, bound):  # the forwards a hot loop replays
        replay = real_replayer(self, slot, feeds, outputs, bound)

        def go():
            seen = len(verifies)
            out = replay()
            if len(verifies) == seen:  # not poisoned by run() already (the replayer's full path)
                poison(self, slot, out)
            return out

        return go

    monkeypatch.setattr(Executor, "run", run)
    monkeypatch.setattr(Executor, "replayer", replayer)
    r = _run(tiny, "select", schedule)
    bad = r.identity["non_finite"]
    assert bad is not None and (bad["run"], bad["tensor"], bad["forward"]) == ("speculative", "logits", 4 if schedule == "fused" else 7)
    assert bad["label"] == "verify/M=4"
    assert not r.lossless and "non-finite logits in the speculative run" in r.verdict


def test_a_length_feed_bug_shared_by_greedy_and_speculative_is_caught_by_the_independent_stepper(tiny, monkeypatch):
    from mtplab.engine import greedy
    from mtplab.runtime import state as runtime

    real = runtime.length_feeds

    def shifted(io, length, M, total, into=None):  # from position P+10 on, the engine's lengths are one too far
        feeds = real(io, length, M, total, into)
        if length >= 18:
            feeds["seqlens_k"] += 1  # the feeds are rewritten in place each forward
        return feeds

    monkeypatch.setattr(runtime, "length_feeds", shifted)  # target_io's
    monkeypatch.setattr(engine_mod, "length_feeds", shifted)  # the prepared forwards'
    monkeypatch.setattr(greedy, "length_feeds", shifted)  # greedy's loop's
    r = _run(tiny, "select")
    _failed(r)
    assert r.identity["token_identical"]  # greedy and speculative share the bug: only the references see it
    first = r.identity["state_first_divergence"]
    assert first is not None and first["length"] >= 18
    assert r.identity["reference_disagreements"] or not r.identity["anchor"]["ok"]


@pytest.mark.parametrize("commit", ["select", "readvance-batched"])
def test_a_verify_writing_its_kv_one_row_late_in_a_few_steps_is_caught_in_the_kv(tiny, commit, monkeypatch):
    real_forward, real_lengths, verifies, late = Engine.forward, engine_mod.length_feeds, [], []

    def forward(self, slot, tokens, *args, **kw):
        if slot is Slot.VERIFY:
            verifies.append(1)
            if len(verifies) in (1, 2):
                late.append(1)
        try:
            return real_forward(self, slot, tokens, *args, **kw)
        finally:
            late.clear()

    def lengths(io, length, M, total, into=None):  # the engine's forwards' lengths: the verify's one too far
        return real_lengths(io, length + 1 if late else length, M, total, into)

    monkeypatch.setattr(Engine, "forward", forward)
    monkeypatch.setattr(engine_mod, "length_feeds", lengths)
    r = _run(tiny, commit)
    _failed(r)
    first = r.identity["state_first_divergence"]
    assert first is not None and first["step"] <= 5


def test_a_relative_drift_of_1e_5_per_commit_is_caught_within_two_commits(tiny, monkeypatch):
    real = Engine.commit

    def commit(self, *args):
        real(self, *args)
        for a in self.state.gdn.values():
            a *= 1 + 1e-5

    monkeypatch.setattr(Engine, "commit", commit)
    r = _run(tiny, "select")
    _failed(r)
    first = r.identity["state_first_divergence"]
    # 1e-5 itself after the first commit: float32 rounding of the product puts it on either side of the line
    assert first["step"] <= 2 and first["tensor"].startswith("gdn_state.") and "rule: relative 1e-05" in r.verdict


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
@pytest.mark.parametrize("plant", ["no head commit", "the bonus row unwritten"])
def test_a_head_kv_left_with_its_own_drafts_is_caught(tiny, monkeypatch, schedule, plant):
    """The head's KV rows after a verify must be the emitted tokens with the target's hidden states: rows left as
    drafting wrote them (a draft's token, the head's own hidden state, a rejected draft) fail the check."""
    from mtplab.engine import step_drafts

    real = step_drafts.commit_head

    def planted(engine, targets, counts, hidden, start):
        before = [a.copy() for a in engine.mtp_state.kv]
        out = real(engine, targets, counts, hidden, start)
        for live, kept in zip(engine.mtp_state.kv, before):  # rows [B, heads, positions, head_dim]
            if plant == "no head commit":  # every row as drafting left it
                live[...] = kept
            else:  # the bonus row as drafting left it
                for b, (s, c) in enumerate(zip(start, counts)):
                    live[b, :, s + c] = kept[b, :, s + c]
        return out

    monkeypatch.setattr(step_drafts, "commit_head", planted)
    run = RunConfig(model="tiny", k=3, drafter="mtp", schedule=schedule, tokens=32, rounds=1)
    r = run_point(run, tiny)
    assert not r.lossless and "the MTP head's KV differs from a teacher-forced head's" in r.verdict, r.verdict


def test_a_head_whose_last_draft_is_always_wrong_is_caught_at_that_position(tiny, monkeypatch):
    """Planted: the head's last draft of every step replaced by another token. The head check judges each draft
    against a teacher-forced head chained on the same rows: a kept or rejected draft where that head drafts otherwise
    fails the point, naming the draft position."""
    from mtplab.engine import step_drafts

    real = step_drafts.draft_head

    def last_wrong(engine, first, hidden, position, k, *rest):
        drafts = real(engine, first, hidden, position, k, *rest)
        if drafts.shape[1] > 1:
            drafts[:, -1] = (drafts[:, -1] + 1) % engine.desc.vocab_size
        return drafts

    monkeypatch.setattr(step_drafts, "draft_head", last_wrong)
    r = run_point(RunConfig(model="tiny", k=3, drafter="mtp", tokens=32, rounds=1), tiny)
    assert not r.lossless and "the MTP head's draft 3 at step" in r.verdict, r.verdict
