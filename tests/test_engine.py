"""The speculative engine: lossless against greedy for every configuration, and its statistics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import plant_over_accept

from mtplab.engine.engine import Engine
from mtplab.engine.schedules import PHASES, Phases
from mtplab.engine.strategies import COMMITS, DRAFTERS
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.measure import theory
from mtplab.model.prompts import prompt_tokens
from mtplab.runtime.executor import Slot
from mtplab.runtime.policy import POLICIES


@pytest.mark.parametrize(
    "policy_name, commit, drafter, k", list(itertools.product(POLICIES, COMMITS, DRAFTERS, (1, 3)))
)
def test_speculative_output_equals_greedy(tiny, policy_name, commit, drafter, k):
    r = run_point(
        RunConfig(model="tiny", k=k, drafter=drafter, policy=policy_name, commit=commit, tokens=48,
                  **({"alpha": 0.7} if "alpha" in DRAFTERS.get(drafter).params else {})), tiny
    )
    assert r.identity["token_identical"], r.verdict
    assert r.lossless, r.verdict
    assert len(r.tokens) == 48


@pytest.mark.parametrize("commit", COMMITS)
def test_fused_schedule_is_lossless_too(tiny, commit):
    r = run_point(RunConfig(model="tiny", k=3, drafter="mtp", commit=commit, schedule="fused", tokens=64), tiny)
    assert r.lossless, r.verdict
    # No decode forward: Primary runs M=1 only to re-advance, which readvance-batched does for a step
    # that accepted nothing (it commits just the pending token).
    if commit == "select":
        assert "primary/M=1" not in r.forwards
    elif commit == "readvance-batched":
        assert r.forwards.get("primary/M=1", 0) == sum(1 for a in r.accepted_per_step if a == 0)


def test_same_seed_same_tokens(tiny):
    run = RunConfig(model="tiny", k=2, drafter="oracle", alpha=0.5, tokens=40, seed=3)
    a, b = run_point(run, tiny), run_point(run, tiny)
    assert a.tokens == b.tokens and a.accepted == b.accepted
    assert run_point(run.replace(seed=4), tiny).tokens != a.tokens


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_oracle_tokens_per_step_matches_theory(tiny, alpha):
    k, steps, total = 3, 0, 0
    accepted: list[int] = []
    for seed in range(6):
        run = RunConfig(
            model="tiny",
            k=k,
            drafter="oracle",
            alpha=alpha,
            oracle_free_drafts=True,
            commit="select",
            tokens=200,
            seed=seed,
        )
        eng = Engine(run, tiny)
        prompt = prompt_tokens(tiny.config.vocab_size, run.prompt_len, seed)
        ref = eng.greedy(prompt, run.tokens + k + 1).tokens
        accepted += eng.speculative(prompt, run.tokens, ref)["accepted"]
    acc = np.asarray(accepted, dtype=float)
    steps, total = acc.size, acc.sum()
    # n accepted ~ truncated geometric: P(n >= i) = alpha^i, i <= k
    p = np.array([alpha**i for i in range(k + 1)]) - np.array([alpha**i for i in range(1, k + 2)])
    p[-1] = alpha**k
    values = np.arange(k + 1)
    mean, var = float((p * values).sum()), float((p * values**2).sum() - (p * values).sum() ** 2)
    assert abs(mean - (theory.acceptance_length(alpha, k) - 1)) < 1e-9
    tolerance = 4 * np.sqrt(var / steps)  # 4 standard errors: fails ~1 in 16000 runs by chance
    assert abs(total / steps - mean) < tolerance, (total / steps, mean, tolerance)
    measured = [float((acc >= i).mean()) for i in range(1, k + 1)]
    np.testing.assert_allclose(measured, theory.per_position(alpha, k), atol=4 * np.sqrt(0.25 / steps))


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
def test_the_host_waits_for_the_device_once_per_step(tiny, schedule):
    eng = Engine(RunConfig(model="tiny", k=3, schedule=schedule), tiny)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    before = eng.device.reads
    eng.greedy(prompt, 32)
    assert eng.device.reads - before == 1  # greedy keeps its tokens on the device to the end
    before = eng.device.reads
    spec = eng.speculative(prompt, 32)
    assert eng.device.reads - before == len(spec["accepted"]) + 1  # the prefill's token, then one per step


def test_greedy_with_plans_equals_greedy_eager(tiny):
    eng = Engine(RunConfig(model="tiny"), tiny)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    planned = eng.greedy(prompt, 24)
    assert eng.target.state[Slot.PRIMARY].replays > 0
    assert eng.greedy(prompt, 24, eager=True).tokens == planned.tokens


def test_greedy_counts_its_forwards_and_stamps_them_inside_its_timed_window(tiny):
    eng = Engine(RunConfig(model="tiny"), tiny)
    g = eng.greedy(prompt_tokens(tiny.config.vocab_size, 8, 0), 24)
    assert eng.forwards == {"prefill/M=8": 1, "primary/M=1": 23} and g.decodes == 23
    assert g.started <= eng.first_forward <= eng.last_forward <= g.started + g.seconds


def test_greedy_beyond_the_kv_capacity_is_refused_before_the_prefill(tiny):
    eng = Engine(RunConfig(model="tiny"), tiny)
    prompt, capacity = prompt_tokens(tiny.config.vocab_size, 8, 0), eng.desc.capacity
    with pytest.raises(ValueError, match=f"would reach {capacity + 1} tokens, beyond the KV capacity {capacity}"):
        eng.greedy(prompt, capacity - 6)
    assert eng.forwards == {}  # nothing ran
    assert len(eng.greedy(prompt, capacity - 7).tokens) == capacity - 7  # the longest run fits
    full = prompt_tokens(tiny.config.vocab_size, capacity, 1)
    assert len(eng.greedy(full, 1).tokens) == 1  # a prompt that fills the cache still gives the prefill's token


def test_a_greedy_decode_that_raises_leaves_its_counts_true(tiny, monkeypatch):
    eng = Engine(RunConfig(model="tiny"), tiny)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    real, runs = eng._decoder, []

    def decoder(eager):
        decode, ids, feeds = real(eager)

        def run():
            if len(runs) == 5:
                raise RuntimeError("the sixth decode fails")
            runs.append(1)
            return decode()

        return run, ids, feeds

    monkeypatch.setattr(eng, "_decoder", decoder)
    with pytest.raises(RuntimeError, match="sixth decode"):
        eng.greedy(prompt, 24)
    assert eng.forwards == {"prefill/M=8": 1, "primary/M=1": 5} and eng.last_forward is not None


def test_readvance_m1_is_bitwise_state_identical(tiny):
    r = run_point(RunConfig(model="tiny", k=3, drafter="mtp", commit="readvance-m1", tokens=64), tiny)
    assert r.identity["state_bitwise"] is True and r.identity["state_max_abs_diff"] == 0.0


def test_select_state_is_within_its_relative_tolerance(tiny):
    from mtplab.check.verdict import STATE_RTOL

    r = run_point(RunConfig(model="tiny", k=3, drafter="mtp", commit="select", tokens=64), tiny)
    assert r.identity["state_max_rel_diff"] is not None and r.identity["kv_checked"]
    assert r.identity["state_max_rel_diff"] <= STATE_RTOL["fp32"] and "within 1e-05 relative" in r.verdict


def test_forward_counts_follow_each_commit_strategy(tiny):
    base = dict(model="tiny", k=3, drafter="oracle", alpha=0.7, tokens=64, policy="shared-max")
    batched = run_point(RunConfig(commit="readvance-batched", **base), tiny)
    assert any(key.startswith("primary/M=") and key != "primary/M=1" for key in batched.forwards)
    select = run_point(RunConfig(commit="select", **base), tiny)
    assert select.forwards["primary/M=1"] == select.steps  # the decodes, and nothing else
    assert [key for key in select.forwards if key.startswith("primary/")] == ["primary/M=1"]
    assert select.forwards["verify/M=4"] == select.steps
    m1 = run_point(RunConfig(commit="readvance-m1", **base), tiny)
    assert m1.forwards["primary/M=1"] == m1.steps + m1.steps + m1.accepted  # decode + re-advance of 1+n


# -- planted bugs: the lossless oracle must catch each --------------------------------------------


def test_an_accept_patched_onto_the_rule_later_is_the_one_the_verify_runs(tiny, monkeypatch):
    from mtplab.engine.acceptance import GreedyMatch

    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    spec = Engine(RunConfig(model="tiny", k=3), tiny).speculative(prompt, 24)
    assert set(spec["accepted"]) != {0}
    monkeypatch.setattr(GreedyMatch, "accept", lambda self, xp, drafts, logits, greedy, kept, rows=None: (
        np.zeros(drafts.shape[:-1], np.int64), greedy))
    patched = Engine(RunConfig(model="tiny", k=3), tiny).speculative(prompt, 24)
    assert set(patched["accepted"]) == {0} and patched["tokens"][:24] == spec["tokens"][:24]


def test_planted_bug_accepting_one_token_too_many_is_caught(tiny, monkeypatch):
    plant_over_accept(monkeypatch)
    r = run_point(RunConfig(model="tiny", k=3, drafter="oracle", alpha=0.5, tokens=64), tiny)
    assert not r.lossless and r.identity["first_divergence"] is not None
    assert r.identity["margin_at_divergence"] > 0


def test_planted_bug_skipping_the_state_restore_is_caught(tiny, monkeypatch):
    monkeypatch.setattr(Engine, "restore_state", lambda self: None)
    r = run_point(RunConfig(model="tiny", k=3, drafter="oracle", alpha=0.5, commit="readvance-m1", tokens=64), tiny)
    assert not r.lossless


def test_planted_bug_unpinned_workspace_without_validation_is_caught(tiny):
    r = run_point(RunConfig(model="tiny", k=3, drafter="mtp", policy="sibling", validate=False, tokens=64), tiny)
    assert r.slots["verify"]["hazards"] > 0 and not r.lossless


def test_a_result_records_its_run_and_reads_back(tiny):
    run = RunConfig(model="tiny", k=2, tokens=32)
    d = run_point(run, tiny).to_dict()
    assert RunConfig.from_dict(d["config"]) == run
    assert RunConfig.from_dict(d["config"] | {"model": "", "preset": "tiny"}) == run  # an older result's naming
    alpha = d["theory"]["alpha"]
    assert d["theory"]["tokens_per_step"] == pytest.approx(theory.tokens_per_step(alpha, 2, run.schedule))
    assert set(d["slots"]) == {"primary", "verify", "mtp", "mtp-commit"} and d["slots"]["verify"]["replays"] > 0
    assert d["env"]["provider"] == "CPUExecutionProvider"


def test_a_reference_too_short_for_the_oracles_last_drafts_is_refused_before_the_run(tiny):
    engine = Engine(RunConfig(model="tiny", k=3, drafter="oracle", alpha=0.7, tokens=16), tiny)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    reference = engine.greedy(prompt, 16).tokens
    with pytest.raises(ValueError, match=r"needs its first 20 tokens \(n \+ k \+ 1\), got 16"):
        engine.speculative(prompt, 16, reference=reference)
    assert engine.speculative(prompt, 16, reference=engine.greedy(prompt, 20).tokens)["tokens"][:16] == reference


def test_each_decoding_sessions_first_run_is_its_one_token_warm_up_and_the_prefill_after_it_is_unchanged(
        tiny, monkeypatch):
    from mtplab.runtime.plans import CpuPlanBackend

    first_tokens = {}  # each session's first run: its token count
    eager = CpuPlanBackend.eager

    def recording(self, session, binds, quiet=False):
        ids = next(b.array for b in binds if not b.output and b.name == "input_ids")
        first_tokens.setdefault(id(session), ids.shape[-1])
        eager(self, session, binds, quiet)

    monkeypatch.setattr(CpuPlanBackend, "eager", recording)
    eng = Engine(RunConfig(model="tiny", k=3), tiny)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)

    def state() -> list[np.ndarray]:
        return [a.copy() for a in [*eng.state.recurrent_arrays(), *eng.state.kv[eng.desc.attention_layers[0]]]]

    eng.start(prompt)
    warmed = state()
    eng.start(prompt)  # the same prefill with no warm-up before it: the same state
    assert all(np.array_equal(a, b) for a, b in zip(warmed, state()))
    tokens = eng.speculative(prompt, 16)["tokens"]
    sessions = eng.target.sessions
    assert sessions[Slot.VERIFY] is not sessions[Slot.PRIMARY]  # the default policy: a Verify sibling
    assert first_tokens == {id(sessions[Slot.PRIMARY]): 1, id(eng.mtp.sessions[Slot.PRIMARY]): 1,
                            id(sessions[Slot.VERIFY]): 4}  # the sibling's first run: its verify of k + 1 tokens
    assert (eng.target.state[Slot.PRIMARY].warmups, eng.mtp.state[Slot.PRIMARY].warmups) == (1, 1)
    assert eng.forwards["prefill/M=8"] == 3 and tokens[:16] == eng.greedy(prompt, 16).tokens


def test_a_forward_of_host_tokens_replays_and_a_replaced_state_buffer_is_caught_and_recaptured(tiny):
    eng = Engine(RunConfig(model="tiny"), tiny)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    eng.start(prompt)
    tokens = []
    for token in (5, [7], np.asarray([9])):  # an int, a list, an array: each written into the prepared feeds
        tokens.append(int(eng.forward(Slot.PRIMARY, token)["logits"][0, 0].argmax()))
        eng.state.length += 1
    primary = eng.target.state[Slot.PRIMARY]
    assert (primary.warmups, primary.captures, primary.replays) == (1, 1, 2)  # warmed up before the prefill
    layer = next(iter(eng.state.gdn))
    eng.state.gdn[layer] = eng.state.gdn[layer].copy()  # a state buffer replaced: the plan's binding moved
    eng.forward(Slot.PRIMARY, 11)
    assert primary.invalidations == 1 and "address moved" in primary.reason and primary.captures == 2
    eng.start(prompt)  # the same tokens from the generic (eager) path: the prepared one decided the same
    for token in (5, 7, 9):
        assert int(eng.forward(Slot.PRIMARY, token, eager=True)["logits"][0, 0].argmax()) == tokens.pop(0)
        eng.state.length += 1
    eng.state.length = eng.desc.capacity
    with pytest.raises(ValueError, match="beyond the KV capacity"):
        eng.forward(Slot.PRIMARY, 1)



def test_a_speculative_run_beyond_the_kv_capacity_is_refused_before_the_prefill(tiny):
    eng = Engine(RunConfig(model="tiny", k=3, drafter="mtp"), tiny)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    capacity = eng.desc.capacity
    with pytest.raises(ValueError, match=f"would reach {capacity + 1} tokens, beyond the KV capacity {capacity}"):
        eng.speculative(prompt, capacity - 8 - 3 + 1)
    assert eng.forwards == {}
    spec = eng.speculative(prompt, capacity - 8 - 3)  # the longest run that fits: its last verify ends at the capacity
    assert len(spec["tokens"]) >= capacity - 8 - 3


def test_a_forward_returns_a_dict_of_its_own_takes_nested_lists_and_follows_a_new_state(tiny):
    from mtplab.runtime.arena import Arena
    from mtplab.runtime.state import TargetState

    eng = Engine(RunConfig(model="tiny"), tiny)
    eng.start(prompt_tokens(tiny.config.vocab_size, 8, 0))
    for token in (5, 6, 7):  # warm-up, capture, replay
        eng.forward(Slot.PRIMARY, token).pop("hidden")  # a caller's change to its dict stays its own
        eng.state.length += 1
    assert "hidden" in eng.forward(Slot.PRIMARY, 8)
    assert eng.forward(Slot.VERIFY, [[5, 6, 7, 8]], in_place=False)["logits"].shape == (1, 4, tiny.config.vocab_size)
    with pytest.raises(ValueError, match=r"a forward takes token ids \(integers\), got True"):
        eng.forward(Slot.PRIMARY, True)
    old, new = eng.state, TargetState.allocate(eng.desc, Arena("another"))
    new.length = old.length
    eng.state = new  # another state object (whose buffer versions read as the old one's): its buffers are bound
    eng.forward(Slot.PRIMARY, 9)
    primary = eng.target.state[Slot.PRIMARY]
    assert primary.invalidations == 1 and "address moved" in primary.reason
    assert np.any(new.kv[next(iter(new.kv))][0][0, :, new.length] != 0)  # the new state's KV row was written


def test_phases_sum_each_phase_over_the_steps_stamps():
    phases = Phases()
    assert phases.seconds == dict.fromkeys(PHASES, 0.0)  # no step yet
    # a step's start, then the end of its decode, draft, verify, drafter's commit (draft work) and commit
    phases.append((0.0, 1.0, 3.0, 6.0, 6.5, 10.0))
    phases.append((20.0, 20.5, 21.0, 21.5, 21.75, 22.0))  # the time between two steps belongs to no phase
    assert phases.seconds == {"decode": 1.5, "draft": 3.25, "verify": 3.5, "commit": 3.75}
