"""One definition of each rate: counting, paired rounds, acceptance, and the one RunResult builder."""

from __future__ import annotations

import ast
import math
from pathlib import Path

from mtplab.measure import rounds as measure
from mtplab.measure import stats
from mtplab.measure.result import RunResult

PACKAGE = Path(__file__).resolve().parent.parent / "mtplab"


def test_a_run_counts_the_tokens_after_the_prefills_up_to_n():
    assert measure.counted(list(range(10)), 8) == 7  # a speculative overshoot is not counted
    assert measure.counted(list(range(5)), 8) == 4  # stopped early (EOS): what it made
    assert measure.counted([], 8) == 0
    assert measure.tokens_per_s(list(range(9)), 9, 2.0) == 4.0
    assert math.isnan(measure.tokens_per_s([1], 9, 2.0)) and math.isnan(measure.rate(3, 0))


def test_a_paired_round_has_both_sides_and_their_ratio():
    sample = measure.paired_round(1, ("speculative", "greedy"))
    measure.record_side(sample, "speculative", [list(range(12))], 9, 1.0)
    measure.record_side(sample, "greedy", [list(range(9))], 9, 2.0)
    measure.close_round(sample)
    assert sample == {
        "round": 1,
        "order": "speculative-greedy",
        "tokens_per_s": 8.0,
        "seconds": 1.0,
        "greedy_tokens_per_s": 4.0,
        "greedy_seconds": 2.0,
        "speedup": 2.0,
        "counted": 8,
        "greedy_counted": 8,
    }


def test_acceptance_per_step_and_without_it():
    a = measure.acceptance(steps=4, accepted=6, drafted=12, generated=10, per_step=[3, 0, 2, 1], k=3)
    assert a["tokens_per_step"] == 2.5 and a["acceptance_length"] == 2.5 and a["draft_acceptance"] == 0.5
    assert a["acceptance_per_position"] == [0.75, 0.5, 0.25] and a["accepted_per_step"] == [3, 0, 2, 1]
    b = measure.acceptance(steps=0, accepted=0, drafted=0, generated=0)
    assert math.isnan(b["tokens_per_step"]) and b["acceptance_length"] == 1.0 and b["draft_acceptance"] == 0.0
    assert b["acceptance_per_position"] == [] and b["accepted_per_step"] == []


def _samples(speedups):
    out = []
    for r, s in enumerate(speedups):
        sample = measure.paired_round(r, ("greedy", "speculative"))
        measure.record_side(sample, "greedy", [list(range(9))], 9, 1.0)
        measure.record_side(sample, "speculative", [list(range(9))], 9, 1.0 / s)
        out.append(measure.close_round(sample))
    return out


def test_the_builder_takes_medians_with_cis_and_the_efficiency():
    fields = dict.fromkeys(("config", "model", "forwards", "time_split", "slots", "greedy_slots"), {})
    fields |= dict.fromkeys(("slot_reasons", "arena", "identity", "theory", "env"), {})
    r = measure.run_result(
        _samples([1.5, 2.0, 2.5]),
        9,
        measure.acceptance(2, 2, 4, 6),
        predicted={"speedup": 2.0, "alpha": 0.8},
        prompt=[1],
        tokens=[1],
        **fields,
    )
    assert isinstance(r, RunResult)
    assert r.speedup == 2.0 and r.speedup_ci[0] <= 2.0 <= r.speedup_ci[1]
    assert r.greedy_tokens_per_s == 8.0 and r.greedy_seconds == 1.0 and r.tokens_per_s == 16.0
    assert r.seconds == 0.5 and len(r.round_samples) == 3
    assert r.efficiency == 1.0 and r.predicted["alpha"] == 0.8 and len(r.efficiency_ci) == 2


def test_every_engine_builds_its_result_here():
    """A RunResult is built from measurements in mtplab.measure.rounds only, so no engine counts its own way
    (one re-made from a saved result.json, RunResult(**data), builds nothing)."""
    builders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "RunResult":
                if node.args or any(k.arg is not None for k in node.keywords):
                    builders.append(path.name)
    assert set(builders) == {"rounds.py"}


# -- rounds: a fixed count, or auto-sized ---------------------------------------------------------------------
def _closed(speedups):
    return [{"speedup": s} for s in speedups]


def _run(plan, speedups, seconds_per_round=0.0, clock=None):
    samples = []
    for r in plan.rounds(samples):
        if clock is not None:
            clock[0] += seconds_per_round
        samples.append({"speedup": speedups[r % len(speedups)]})
    return samples


def test_fixed_rounds_run_exactly_their_count():
    plan = measure.RoundsPlan(4)
    assert len(_run(plan, [1.0, 1.5])) == 4
    assert plan.outcome["mode"] == "fixed" and plan.outcome["stopped"] == "fixed" and plan.outcome["rounds"] == 4


def test_auto_rounds_stop_once_the_ci_is_within_target_but_never_before_three():
    plan = measure.RoundsPlan(None, target=0.03, budget_s=1e9)
    samples = _run(plan, [1.20, 1.21, 1.19])  # tight from the start
    assert len(samples) == measure.AUTO_MIN_ROUNDS
    assert plan.outcome["stopped"] == "within target" and plan.outcome["half_width"] <= 0.03


def test_auto_rounds_stop_on_the_interval_the_point_publishes_too():
    """Ratios whose t interval (of their mean) is within target while the bootstrap of their median, the interval a
    point publishes, is not: the rounds go on until both are, so a point that stops within target is stable."""
    spread = [0.90, 0.95, 1.00, 1.05, 1.10, 0.92, 1.08, 0.97, 1.03, 1.00]  # cycled round after round
    t_alone = next(n for n in range(5, 200) if measure.interval_half_width((spread * 20)[:n]) <= 0.03)
    assert stats.summarize((spread * 20)[:t_alone])["half_width"] > 0.03  # where the t interval alone would stop
    plan = measure.RoundsPlan(None, target=0.03, budget_s=1e9)
    samples = _run(plan, spread)
    assert len(samples) > t_alone and plan.outcome["stopped"] == "within target"
    assert stats.summarize([s["speedup"] for s in samples])["half_width"] <= 0.03


def test_auto_rounds_on_a_noisy_point_stop_at_the_budget_and_say_so(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    plan = measure.RoundsPlan(None, target=0.03, budget_s=10.0)
    samples = _run(plan, [0.8, 1.4, 1.0, 1.6], seconds_per_round=2.0, clock=clock)
    assert len(samples) == 5  # a sixth round would end at 12 s, past the 10 s budget
    assert plan.outcome["stopped"] == "budget spent" and plan.outcome["half_width"] > 0.03
    assert plan.outcome["seconds"] == 10.0 and plan.outcome["target"] == 0.03


def test_auto_rounds_stop_at_the_most_rounds(monkeypatch):
    monkeypatch.setattr(measure, "AUTO_MAX_ROUNDS", 7)
    plan = measure.RoundsPlan(None, target=0.001, budget_s=1e9)
    assert len(_run(plan, [0.8, 1.4])) == 7 and plan.outcome["stopped"] == "cap of 7 rounds reached"
