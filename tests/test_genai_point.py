"""A sweep point on the onnxruntime-genai peer: what genai measures is filled in, the rest left empty."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.sweep import grid, store

og = pytest.importorskip(
    "onnxruntime_genai", reason="onnxruntime-genai is not installed: pip install 'mtplab[peer]' (make test installs it)"
)


def test_run_point_on_the_peer_fills_what_exists_and_leaves_the_rest_empty(tiny):
    r = run_point(RunConfig(model="tiny", k=2, tokens=32, engine="ort-genai"), tiny)
    assert r.lossless and r.identity["greedy_token_identical"]
    assert r.tokens_per_s > 0 and r.greedy_tokens_per_s > 0 and 0 < r.draft_acceptance <= 1
    assert r.slots == {} and r.theory == {} and r.acceptance_per_position == [] and r.identity["state_bitwise"] is None


def test_sweep_with_both_engines_has_rows_for_each(tmp_path, tiny):
    from mtplab.sweep.run import run_sweep

    spec = grid.parse(
        {
            "name": "peer",
            "defaults": {"model": "tiny", "tokens": 24, "drafter": "mtp"},
            "k": [2],
            "engine": ["mtplab", "ort-genai"],
        }
    )
    sweep_dir = run_sweep(spec, tmp_path, quiet=True)
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert sorted(df["config.engine"]) == ["mtplab", "ort-genai"] and df.status.isin(store.LOSSLESS).all() and df.lossless.all()


def test_peer_needs_the_mtp_drafter():
    with pytest.raises(ValueError, match="engine='ort-genai' runs the real MTP head"):
        RunConfig(model="tiny", engine="ort-genai", drafter="oracle")


def test_without_the_package_the_engine_says_how_to_install(monkeypatch, tiny):
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)
    with pytest.raises(ValueError, match=r"pip install 'mtplab\[peer\]'"):
        run_point(RunConfig(model="tiny", engine="ort-genai", drafter="mtp", tokens=8), tiny)


def test_the_peer_point_measures_paired_rounds_with_cis_each_side_after_the_last_sides_threads_settled(
        tiny, monkeypatch):
    from mtplab.engine.engine import Engine
    from mtplab.experiment import genai_point
    from mtplab.experiment.genai_runner import GenaiPeer

    # recorders around the real calls: the order of the waits and the runs
    events, waits = [], []

    def recorded(name, real):
        def call(*args, **kwargs):
            events.append(name)
            out = real(*args, **kwargs)
            if name == "settle":
                waits.append(out)
            return out
        return call

    monkeypatch.setattr(genai_point, "settle", recorded("settle", genai_point.settle))
    monkeypatch.setattr(GenaiPeer, "greedy", recorded("genai greedy", GenaiPeer.greedy))
    monkeypatch.setattr(GenaiPeer, "mtp", recorded("genai mtp", GenaiPeer.mtp))
    monkeypatch.setattr(Engine, "greedy", recorded("mtplab greedy", Engine.greedy))
    r = run_point(RunConfig(model="tiny", k=2, tokens=24, engine="ort-genai", rounds=3), tiny)
    timed = events[events.index("settle"):]  # the untimed reference and warm-ups come first
    # every timed side (genai greedy, genai MTP, mtplab greedy; three rounds) right after a wait
    assert timed[0::2] == ["settle"] * 9 and "settle" not in timed[1::2] and len(timed) == 18
    assert r.extra["settle_max_ms"] == round(1000 * max(waits), 1) and r.extra["settle_limited"] == 0
    assert [s["order"] for s in r.round_samples] == ["greedy-mtp", "mtp-greedy", "greedy-mtp"]
    assert all(s["mtplab_greedy_tokens_per_s"] > 0 for s in r.round_samples)
    assert r.speedup_ci[0] <= r.speedup <= r.speedup_ci[1]
    assert "evaluated" in r.extra["draft_acceptance_denominator"]


def test_the_peer_samples_with_its_own_sampler_reproducibly_and_says_its_tokens_are_not_compared(tiny):
    def sampled(seed: int):
        return run_point(RunConfig(model="tiny", k=2, tokens=24, engine="ort-genai", rounds=1, temperature=0.8,
                                   top_k=20, acceptance="rejection-sampling", sample_seed=seed), tiny)

    a, b, c = sampled(3), sampled(3), sampled(4)
    assert a.lossless and "by onnxruntime-genai's own sampler" in a.verdict and a.identity["sampled"]["top_k"] == 20
    assert a.tokens == b.tokens and a.tokens != c.tokens  # genai's random_seed is the run's sample_seed
    greedy = run_point(RunConfig(model="tiny", k=2, tokens=24, engine="ort-genai", rounds=1), tiny)
    assert a.tokens != greedy.tokens and 0 <= a.draft_acceptance <= 1
