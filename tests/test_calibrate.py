"""The calibration: every cost the prediction needs, measured on the tiny model, cached per key."""

from __future__ import annotations

import json

import pytest

from mtplab.base.threads import threads_used
from mtplab.engine.strategies import COMMITS
from mtplab.experiment import calibrate
from mtplab.experiment.calibration_text import format_table
from mtplab.experiment.config import RunConfig
from mtplab.measure import theory

REFUSED = "the form of this model gives select nothing to replay (a test double's refusal)"


@pytest.fixture(scope="module")
def calib(tiny):
    """tiny's calibration with select refused, as a model whose form select cannot replay refuses it (the run
    that starts the calibration's engine must not be select's)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(COMMITS.get("select"), "refusal", lambda desc: REFUSED)
        return calibrate.measure("tiny", repeats=2, reps=2, acceptance_tokens=24)


def test_calibration_has_every_cost_the_prediction_needs(calib):
    assert list(calib["target"]) == [str(m) for m in range(1, 9)]
    assert all(v > 0 for v in calib["target"].values()) and calib["head"] > 0
    assert set(calib["commit"]) == set(COMMITS) - {"select"} and calib["commits_skipped"] == {"select": REFUSED}
    assert all(list(c) == [str(n) for n in range(1, 9)] for c in calib["commit"].values())
    assert 0.0 <= calib["mtp_acceptance"]["alpha"] <= 1.0
    assert all(lo <= hi for lo, hi in calib["ci"].values())
    assert list(calib["eager"]) == list(calib["target"]) and list(calib["draft"]) == [str(k) for k in range(1, 8)]
    assert calib["greedy_token"] > 0 and len(calib["load"]) == 2
    # per-position's verify runs a graph of its own: priced apart, at every M a verify runs
    assert list(calib["verify"]) == ["per-position"] and list(calib["verify"]["per-position"]) == [
        str(m) for m in range(2, 9)]
    assert theory.verify_seconds(calib, 3, "per-position") == calib["verify"]["per-position"]["4"]
    assert theory.verify_seconds(calib, 3, "readvance-m1") == calib["target"]["4"]
    # and its copy's decode, which a shared policy's Primary runs, prices greedy and the decode of such a point
    copy = calib["copy_decode"]["per-position"]
    assert list(calib["copy_decode"]) == ["per-position"] and copy > 0
    shared = theory.on_the_copy(calib, "per-position")
    assert shared["target"]["1"] == copy and shared["greedy_token"] - calib["greedy_token"] == pytest.approx(
        copy - calib["target"]["1"])
    assert theory.on_the_copy(calib, "select") is calib  # tiny's graph is its own: nothing copied
    # every T(M) a replay: a Verify workspace held at its first (smaller) size ran each larger M eager
    assert calib["target_fallbacks"] == 0
    for k in (1, 4, 7):
        for commit in calib["commit"]:
            assert theory.predict(0.7, k, "fused", commit, calib)["speedup"] > 0


def test_the_table_names_each_cost(calib):
    text = format_table(calib)
    assert "T(M)/T(1)" in text and "head step" in text and "commit readvance-m1" in text and "alpha" in text
    assert f"commit select            not measured: {REFUSED}" in text
    assert "eager/T(M)" in text and "draft phase k=1..7" in text and "greedy per token" in text
    assert "verify per-position      M=2..8 ms" in text
    assert "WARNING" not in text
    assert "WARNING: 3 of the timed forwards above ran eager" in format_table(calib | {"target_fallbacks": 3})


def test_load_or_measure_reuses_the_cache_and_says_when_it_measures(calib, tmp_path, monkeypatch):
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path))
    key = calibrate.cache_key("tiny", threads_used(0))
    cached = calib | {"key": key}  # as a run's default-repeats calibration would be stored
    path = calibrate.cache_path(key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cached))
    said = []
    assert calibrate.load_or_measure("tiny", say=said.append) == cached and said == []
    monkeypatch.setattr(calibrate, "measure", lambda preset, **kw: calib | {"key": calibrate.cache_key(preset, 1)})
    fresh = calibrate.load_or_measure("tiny", say=said.append, threads=1)  # another thread count: another calibration
    assert said and "measuring" in said[0] and fresh["source"].startswith("measured now")  # a result says so
    assert "source" not in json.loads(calibrate.cache_path(fresh["key"]).read_text())  # the cache holds no story


def test_a_calibration_of_other_repeats_is_kept_apart_from_the_one_runs_use():
    assert calibrate.cache_key("tiny", 2, repeats=1) != calibrate.cache_key("tiny", 2)
    assert calibrate.cache_key("tiny", 2, repeats=calibrate.REPEATS) == calibrate.cache_key("tiny", 2)


def test_a_presets_int4_form_is_a_model_of_its_own_calibrated_apart(calib, tmp_path, monkeypatch):
    """int4 weights run other kernels (MatMulNBits): their costs are not the fp32 build's, so an int4 point is
    predicted from the int4 calibration, cached and named apart ("tiny-int4")."""
    fp32, int4 = calibrate.cache_key("tiny", 1), calibrate.cache_key("tiny", 1, int4=True)
    assert int4["preset"] == "tiny-int4" and fp32["preset"] == "tiny" and int4["model"] != fp32["model"]
    assert calibrate.cache_path(int4) != calibrate.cache_path(fp32)
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path))
    path = calibrate.cache_path(fp32)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(calib | {"key": fp32}))
    asked, said = [], []
    monkeypatch.setattr(calibrate, "measure", lambda model, **kw: asked.append(kw) or calib | {
        "key": calibrate.cache_key(model, 1, int4=kw["int4"])})
    assert calibrate.load_or_measure("tiny", say=said.append, threads=1)["key"] == fp32 and not asked
    assert calibrate.load_or_measure("tiny", say=said.append, threads=1, int4=True)["key"] == int4
    assert asked[0]["int4"] is True and said == ["no calibration for tiny-int4 on 1 threads "
                                                 f"(onnxruntime {fp32['onnxruntime']}): measuring it"]
    sweep = tmp_path / "calibration.json"  # a sweep's: one calibration per model, by name
    sweep.write_text(json.dumps({"tiny": {"key": fp32, "which": "fp32"}, "tiny-int4": {"key": int4, "which": "int4"}}))
    for run, which in ((RunConfig(model="tiny", threads=1), "fp32"), (RunConfig(model="tiny", threads=1, int4=True), "int4")):
        assert calibrate.sweep_calibration(str(sweep), run)["which"] == which


def test_the_calibration_sizes_stay_within_what_the_model_holds():
    from types import SimpleNamespace

    def desc(capacity, transitions):  # a test double of a ModelDescription: the three fields the sizes read
        return SimpleNamespace(name="m", capacity=capacity, transition_capacity=transitions)

    assert calibrate.calibration_sizes(desc(256, 8)) == (calibrate.MAX_M, calibrate.GREEDY_TOKENS)
    assert calibrate.calibration_sizes(desc(256, 0)) == (calibrate.MAX_M, calibrate.GREEDY_TOKENS)  # 0: no limit
    assert calibrate.calibration_sizes(desc(256, 4)) == (4, calibrate.GREEDY_TOKENS)
    assert calibrate.calibration_sizes(desc(24, 0)) == (7, 15)  # 8 + 2 * 7 + 2 tokens; 8 + 15 + 1
    with pytest.raises(ValueError, match="a transition capacity of 1 holds no verify of k >= 1"):
        calibrate.calibration_sizes(desc(256, 1))
    with pytest.raises(ValueError, match="a KV capacity of 13 leaves no room to calibrate"):
        calibrate.calibration_sizes(desc(13, 0))
