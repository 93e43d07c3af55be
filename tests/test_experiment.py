"""run_point: one point on a supplied engine only when the engine was built for that point's config."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from conftest import synthetic_calibration

from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.experiment.point_ids import point_id
from mtplab.measure import theory
from mtplab.model.prompts import prompt_tokens


@pytest.mark.parametrize("changes", [{"k": 3}, {"commit": "readvance-m1"}, {"seed": 1}])
def test_an_engine_built_for_another_config_is_refused(tiny, changes):
    built = RunConfig(model="tiny", k=2, tokens=16)
    with pytest.raises(ValueError, match=f"engine was built for another config .*{next(iter(changes))}"):
        run_point(built.replace(**changes), tiny, Engine(built, tiny))


def test_an_engine_runs_a_point_of_its_config_at_another_length(tiny):
    built = RunConfig(model="tiny", k=2, tokens=16)
    assert run_point(built.replace(tokens=24), tiny, Engine(built, tiny)).lossless


def _calibration(t1: float = 1e-3) -> dict:
    return synthetic_calibration(t1)


def test_paired_rounds_count_the_same_tokens_on_both_sides(tiny):
    run = RunConfig(model="tiny", k=2, tokens=20, drafter="oracle", alpha=0.7, rounds=3)
    r = run_point(run, tiny, calibration=_calibration())
    more = r.extra["rounds"]["floor_rounds"]  # rounds a side beyond its timing floor's band adds (a busy machine)
    assert len(r.round_samples) == 3 + more and [s["order"] for s in r.round_samples][:3] == [
        "greedy-speculative",
        "speculative-greedy",
        "greedy-speculative",
    ]
    for s in r.round_samples:  # both rates are (tokens - 1) over their own time from after the prefill
        assert s["tokens_per_s"] * s["seconds"] == pytest.approx(run.tokens - 1)
        assert s["greedy_tokens_per_s"] * s["greedy_seconds"] == pytest.approx(run.tokens - 1)
        assert s["speedup"] == pytest.approx(s["greedy_seconds"] / s["seconds"])
    assert r.speedup == pytest.approx(float(np.median([s["speedup"] for s in r.round_samples])))
    assert r.speedup_ci[0] <= r.speedup <= r.speedup_ci[1]
    assert len(r.tokens_per_s_ci) == len(r.greedy_tokens_per_s_ci) == 2
    assert json.loads(r.to_json())["round_samples"][0]["round"] == 0


def test_timed_greedy_without_margins_decodes_the_same_tokens(tiny):
    engine = Engine(RunConfig(model="tiny", k=2, tokens=16), tiny)
    prompt = prompt_tokens(engine.cfg.vocab_size, 8, 0)
    checked, timed = engine.greedy(prompt, 16), engine.greedy(prompt, 16, margins=False)
    assert timed.tokens == checked.tokens and timed.decodes == checked.decodes == 15
    assert timed.margins == [] and len(checked.margins) == 16


def test_the_prediction_takes_nothing_from_the_points_run(tiny, monkeypatch):
    run = RunConfig(model="tiny", k=3, tokens=20, drafter="oracle", alpha=0.8, rounds=2)
    calib = _calibration()
    first = run_point(run, tiny, calibration=calib)
    from mtplab.engine import speculative

    real = speculative.generate

    def slowed(*args, **kwargs):  # test double: the same run, its time split ten times longer
        out = real(*args, **kwargs)
        out.split = {key: 10 * v + 1.0 for key, v in out.split.items()}
        return out

    monkeypatch.setattr(speculative, "generate", slowed)
    second = run_point(run, tiny, calibration=calib)
    assert second.time_split != first.time_split
    assert second.predicted == first.predicted
    no_fallbacks = {"primary": 0.0, "verify": 0.0}  # the mix the checked run had (counts, not times)
    assert second.predicted["at_alpha"] == pytest.approx(theory.predict(
        0.8, 3, run.schedule, run.commit, calib, tokens=run.tokens, eager_share=no_fallbacks)["speedup"])
    # the efficiency's prediction prices the steps the run made, at the same costs
    assert second.predicted["speedup"] == pytest.approx(theory.predict_steps(
        second.accepted_per_step, 3, run.schedule, run.commit, calib, run.tokens, no_fallbacks)["speedup"])
    assert second.predicted["steps"] == len(second.accepted_per_step) > 0
    assert second.efficiency == pytest.approx(
        statistics.median(s["speedup"] / second.predicted["speedup"] for s in second.round_samples))
    assert second.extra["accounting"]["split_per_step"] > first.extra["accounting"]["split_per_step"]


def test_an_mtp_point_predicts_from_the_acceptance_calibration(tiny):
    r = run_point(RunConfig(model="tiny", k=2, tokens=16, rounds=2), tiny, calibration=_calibration())
    assert r.predicted["alpha"] == 0.6 and r.theory["alpha_source"] == "acceptance calibration"


def test_a_point_with_rounds_auto_says_how_its_rounds_ended(tiny):
    from mtplab.experiment.result_text import result_text
    from mtplab.measure.rounds import AUTO_MAX_ROUNDS

    run = RunConfig(model="tiny", k=2, tokens=16, drafter="oracle", alpha=0.7, rounds="auto", rounds_budget=2.0)
    r = run_point(run, tiny, calibration=_calibration())
    plan = r.extra["rounds"]
    assert plan["mode"] == "auto" and plan["rounds"] + plan["floor_rounds"] == len(r.round_samples) >= 1
    # how it ended depends on the machine's noise (the rule itself is tested on injected clocks in test_measure)
    assert plan["stopped"] in ("within target", "budget spent", f"cap of {AUTO_MAX_ROUNDS} rounds reached")
    assert (plan["stopped"] == "within target") == (plan["half_width"] <= 0.03)  # the default target
    assert f"rounds auto: {plan['stopped']} after {plan['rounds']} rounds" in result_text(r)
    assert "-nauto" in point_id(run) and "-rb2" in point_id(run)


@pytest.mark.parametrize("engine", ["mtplab", "ort-genai"])
def test_a_dedicated_process_shares_one_pool_for_mtplabs_sessions_on_either_engine(monkeypatch, engine):
    """A peer point times mtplab's greedy beside genai's: on the pool mtplab's own points use, or the ratio it
    publishes would be another engine's (per-session pools ran 0.78-0.85x genai's on small at 2 threads, 0.97x)."""
    from mtplab.experiment import point

    pools = []  # test double: the real call would give this test process its pool for good
    monkeypatch.setattr(point, "use_global_pool", pools.append)
    point.dedicate_process(RunConfig(model="tiny", engine=engine, threads=1))
    assert pools == [1]
