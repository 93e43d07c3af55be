"""Draft-length policies: each rule on its own (probe, goodput, confidence), then on the engine: lossless at every
commit with K changing from step to step, one Verify plan per M captured once (no invalidation), and the one-plan
executor thrashing where K changes."""

from __future__ import annotations

import numpy as np
import pytest

from mtplab.check.expected import checked_problems
from mtplab.check.lossless import checked_pass
from mtplab.check.trace import plans_held
from mtplab.engine.engine import Engine
from mtplab.engine.k_policies import Confidence, Goodput, Probe, StepCosts
from mtplab.experiment.config import ConfigError, RunConfig
from mtplab.model.prompts import prompt_tokens
from mtplab.runtime.executor import Slot

# Prices of a step at K drafts, and of committing n tokens (seconds): a made-up cost model, verify growing with K.
COSTS = StepCosts(step={1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}, commit={n: 0.1 for n in range(1, 6)}, extra=1)


def test_probe_climbs_while_drafts_are_kept_and_holds_the_floor_when_they_are_not():
    probe = Probe(4, COSTS)
    assert probe.next_k() == 2  # start and floor: min(2, k), genai's advised min_adaptive_k
    seen = []
    for _ in range(20):  # every draft kept: each probe up keeps acceptance and gains throughput
        k = probe.next_k()
        probe.observe(k, k)
        seen.append(k)
    assert seen[0] == 2 and max(seen) == 4 and seen == sorted(seen)
    for _ in range(60):  # nothing kept: down to the floor (once the smoothed throughput of K=4 has caught up)
        k = probe.next_k()
        probe.observe(k, 0)
        seen.append(k)
    assert probe.next_k() == 2 and min(seen) == 2


def test_a_probe_that_loses_throughput_is_dropped_at_once_and_waits_six_steps():
    probe = Probe(3, COSTS)
    probe.observe(2, 2)  # all kept at K=2: the probe to K=3 starts
    assert probe.next_k() == 3 and probe.probe is not None
    probe.observe(3, 0)  # at K=3 nothing kept: throughput falls below 80% of K=2's
    assert probe.next_k() == 2 and probe.probe is None and probe.wait == 6


def test_goodput_drafts_deep_when_drafts_are_kept_and_one_when_they_are_not():
    good = Goodput(4, COSTS)
    for _ in range(30):
        good.observe(good.next_k(), good.next_k())  # every draft kept
    assert good.next_k() == 4
    bad = Goodput(4, COSTS)
    for _ in range(30):
        bad.observe(bad.next_k(), 0)
    assert bad.next_k() == 1
    assert 0.9 < good.conditional()[0] <= 1 and bad.conditional()[0] < 0.1


def test_confidence_stops_after_a_draft_whose_top_probability_is_below_the_threshold():
    rule = Confidence(4, 0.5, temperature=0.0)
    assert rule.stop(np.array([0.0, 0.0, 0.0])) and not rule.stop(np.array([5.0, 0.0, 0.0]))
    assert Confidence(4, 0.5, temperature=10.0).stop(np.array([5.0, 0.0, 0.0]))  # flat at T=10


@pytest.mark.parametrize("commit", ["select", "readvance-m1", "readvance-batched"])
def test_k_changing_every_few_steps_stays_lossless_with_one_verify_plan_per_m(tiny, commit):
    run = RunConfig(model="tiny", drafter="mtp", k=4, k_policy="confidence", k_confidence=0.9, commit=commit,
                    schedule="fused", tokens=40)
    engine = Engine(run, tiny)
    prompt = prompt_tokens(tiny.description.vocab_size, 8, 0)
    checked = checked_pass(engine, prompt, run.tokens)
    ks = checked.spec.ks[0]
    assert len(set(ks)) >= 2  # the threshold splits the head's drafts: K varies
    assert checked.identity["token_identical"] and checked.identity["state_first_divergence"] is None
    assert checked_problems(engine, checked.spec_trace, len(prompt), checked.spec.widths) == []
    verify = checked.spec_trace.activity["verify"]
    assert verify["captures"] == len(set(ks)) and verify["invalidations"] == 0  # one plan per M, each once
    plans = engine.target.plans(Slot.VERIFY)
    assert len(plans) == len(set(ks)) and all(p["captures"] == 1 and p["plan_bytes"] > 0 for p in plans)


def test_one_verify_plan_is_invalidated_whenever_m_changes(tiny):
    run = RunConfig(model="tiny", drafter="mtp", k=4, k_policy="confidence", k_confidence=0.9, schedule="fused",
                    tokens=40, verify_plans="one", max_recaptures=100)
    engine = Engine(run, tiny)
    checked = checked_pass(engine, prompt_tokens(tiny.description.vocab_size, 8, 0), run.tokens)
    ks = checked.spec.ks[0]
    changes = sum(a != b for a, b in zip(ks, ks[1:]))
    assert changes >= 2 and checked.identity["token_identical"]
    assert checked.spec_trace.activity["verify"]["invalidations"] == changes  # the thrash


@pytest.mark.parametrize("commit, schedule", [("select", "fused"), ("per-position", "decode-verify"),
                                              ("readvance-m1", "fused"), ("readvance-batched", "decode-verify")])
def test_a_padded_verify_runs_one_plan_at_k_plus_1_and_keeps_the_per_length_runs_tokens(tiny, commit, schedule):
    """verify_plans='padded': every verify runs M = k + 1 (the steps with fewer drafts pad them), judged on its own
    drafts only; the tokens, accepted counts and K per step are the per-length run's, and one plan is captured."""
    run = RunConfig(model="tiny", drafter="mtp", k=4, k_policy="confidence", k_confidence=0.9, commit=commit,
                    schedule=schedule, tokens=40)
    prompt = prompt_tokens(tiny.description.vocab_size, 8, 0)
    per_length = checked_pass(Engine(run, tiny), prompt, run.tokens)
    engine = Engine(run.replace(verify_plans="padded"), tiny)
    padded = checked_pass(engine, prompt, run.tokens)
    assert len(set(padded.spec.ks[0])) >= 2  # K varied
    assert [padded.spec.tokens, padded.spec.accepted, padded.spec.ks] == [
        per_length.spec.tokens, per_length.spec.accepted, per_length.spec.ks]
    assert padded.identity["token_identical"] and padded.identity["state_first_divergence"] is None
    assert checked_problems(engine, padded.spec_trace, len(prompt), padded.spec.widths) == []
    assert {key for key in padded.spec_trace.forwards if key.startswith("verify/")} == {"verify/M=5"}
    verify = padded.spec_trace.activity["verify"]
    assert verify["captures"] == 1 and verify["invalidations"] == 0
    assert [p["tokens"] for p in plans_held(engine)["verify"]] == [5]
    assert padded.identity["padded_twin"]["identical"]  # decoded again with a plan per length: the same run


def test_a_padding_that_changes_what_a_sampled_verify_judges_is_caught_by_its_per_length_twin(tiny):
    """Planted: a short step's padding starts one position early, over its last draft's input. Sampled, no greedy
    token shows it; the same run decoded with a plan per length does."""
    from mtplab.check.verdict import verdict

    run = RunConfig(model="tiny", drafter="mtp", k=4, k_policy="confidence", k_confidence=0.9, schedule="fused",
                    tokens=40, temperature=0.7, acceptance="rejection-sampling", verify_plans="padded")
    engine = Engine(run, tiny)
    real = engine._run_prepared

    def early_padding(hot):
        if hot.key.startswith("verify"):  # a step of K < k drafts: its last draft repeated from K + 1 on
            row = hot.ids[0]
            K = len(row) - 1
            while K > 1 and row[K - 1] == row[K]:
                K -= 1
            if K < engine.k:
                row[K] = row[K - 1]
        return real(hot)

    engine._run_prepared = early_padding
    checked = checked_pass(engine, prompt_tokens(tiny.description.vocab_size, 8, 0), run.tokens)
    twin = checked.identity["padded_twin"]
    assert not twin["identical"] and twin["exact"]
    ok, text = verdict(checked.identity)
    assert not ok and "its run with one padded Verify plan differs from the same run with a plan per length" in text


def test_a_policy_that_prices_steps_needs_the_calibration_and_one_that_reads_confidence_needs_the_head(tiny):
    engine = Engine(RunConfig(model="tiny", k=3, k_policy="goodput"), tiny)
    with pytest.raises(ValueError, match=r"k_policy='goodput' prices each step's K with the cost-model calibration"):
        engine.speculative(prompt_tokens(tiny.description.vocab_size, 8, 0), 8)
    with pytest.raises(ConfigError, match=r"k_policy='confidence' stops drafting on the drafter's own top probability"):
        RunConfig(model="tiny", k=3, k_policy="confidence", drafter="oracle")
    with pytest.raises(ConfigError, match=r"k_policy='probe' with k=1: k is the most drafts a step may make"):
        RunConfig(model="tiny", k=1, k_policy="probe")


def test_a_step_that_kept_more_drafts_than_it_made_is_named():
    from types import SimpleNamespace

    from mtplab.check.expected import chosen_problems

    engine = SimpleNamespace(spec=RunConfig(model="tiny", k=3, k_policy="probe").engine_spec(), k_costs=None)  # a stand-in
    assert chosen_problems(engine, [1, 2, 1], [2, 1, 2]) == ["it kept 2 drafts at step 2, where it drafted 1"]


@pytest.mark.parametrize("k_policy", ["fixed", "probe"])
def test_a_policy_that_peeks_beyond_its_observed_counts_fails_the_run_check(tiny, monkeypatch, k_policy):
    """Planted: the chooser reads the text so far (anything besides the counts it observed: the target's tokens, a
    future draft) to choose K. The check replays the policy on the run's own accepted counts, so the choice it cannot
    explain names its first step."""
    from mtplab.engine import speculative
    from mtplab.experiment.point import run_point

    real = speculative.k_chooser

    def peeking(engine):
        chooser = real(engine)
        chooser.next_k = lambda: 1 + int(engine.state.lengths[0]) % engine.k  # the text's length so far
        return chooser

    monkeypatch.setattr(speculative, "k_chooser", peeking)
    r = run_point(RunConfig(model="tiny", k=3, k_policy=k_policy, drafter="oracle", alpha=0.7, tokens=24, rounds=1), tiny)
    assert not r.lossless and r.verdict.startswith("RUN CHECK FAILED: the checked speculative run: it drafted"), r.verdict
    assert f"where k_policy='{k_policy}' chooses" in r.verdict


def test_a_point_reports_what_each_verify_plan_holds_one_per_m_used(tiny):
    from mtplab.experiment.point import run_point
    from mtplab.experiment.result_text import result_text

    run = RunConfig(model="tiny", drafter="mtp", k=4, k_policy="confidence", k_confidence=0.9, schedule="fused",
                    tokens=40, rounds=1)
    r = run_point(run, tiny)
    plans = r.extra["plans"]["verify"]
    used = sorted({k + 1 for k in r.k_per_step})
    assert sorted(p["tokens"] for p in plans) == used and len(used) >= 2
    assert all(p["captures"] == 1 and p["plan_bytes"] > 0 for p in plans)
    assert f"verify plans: M={used[0]} 1 capture" in result_text(r)
    assert [p["tokens"] for p in r.extra["plans"]["primary"]] == [1]  # one plan, M=1
