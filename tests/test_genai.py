"""The onnxruntime-genai peer: the export loads in genai, and genai's greedy and MTP tokens equal mtplab's greedy."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

from mtplab import grid
from mtplab.config import RunConfig
from mtplab.engine import Engine, prompt_tokens
from mtplab.experiment import run_point

og = pytest.importorskip(
    "onnxruntime_genai", reason="onnxruntime-genai is not installed: pip install 'mtplab[peer]' (make test installs it)"
)


@pytest.fixture(scope="module")
def peer(tiny, tmp_path_factory):
    from mtplab.genai import GenaiPeer, export_genai

    folder = export_genai(tiny, tmp_path_factory.mktemp("genai"))
    return GenaiPeer(folder)


@pytest.fixture(scope="module")
def reference(tiny):
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    return prompt, Engine(RunConfig(preset="tiny"), tiny).greedy(prompt, 48).tokens


def test_export_loads_in_genai(peer):
    assert peer.main is not None and peer.head is not None


def test_genai_greedy_equals_mtplab_greedy(peer, reference):
    prompt, tokens = reference
    out, _ = peer.greedy(prompt, 48)
    assert out == tokens[: len(out)] and len(out) >= 40  # genai stops early only on its EOS token


@pytest.mark.parametrize("k", [1, 3])
def test_genai_mtp_equals_greedy(peer, reference, k):
    prompt, tokens = reference
    out, _, stats = peer.mtp(prompt, 48, k)
    assert out == tokens[: len(out)] and len(out) >= 40
    assert stats["draft_tokens_evaluated"] > 0


def test_run_point_on_the_peer_fills_what_exists_and_leaves_the_rest_empty(tiny):
    r = run_point(RunConfig(preset="tiny", k=2, tokens=32, engine="ort-genai"), tiny)
    assert r.lossless and r.identity["greedy_token_identical"]
    assert r.tokens_per_s > 0 and r.greedy_tokens_per_s > 0 and 0 < r.draft_acceptance <= 1
    assert r.slots == {} and r.theory == {} and r.acceptance_per_position == [] and r.identity["state_bitwise"] is None


def test_sweep_with_both_engines_has_rows_for_each(tmp_path, tiny):
    from mtplab.sweep import run_sweep

    spec = grid.parse(
        {
            "name": "peer",
            "defaults": {"preset": "tiny", "tokens": 24, "drafter": "mtp"},
            "k": [2],
            "engine": ["mtplab", "ort-genai"],
        }
    )
    sweep_dir = run_sweep(spec, tmp_path, quiet=True)
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert sorted(df["config.engine"]) == ["mtplab", "ort-genai"] and (df.status == "ok").all() and df.lossless.all()


def test_peer_needs_the_mtp_drafter():
    with pytest.raises(ValueError, match="engine='ort-genai' runs the real MTP head"):
        RunConfig(preset="tiny", engine="ort-genai", drafter="oracle")


def test_without_the_package_the_engine_says_how_to_install(monkeypatch, tiny):
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)
    with pytest.raises(ValueError, match=r"pip install 'mtplab\[peer\]'"):
        run_point(RunConfig(preset="tiny", engine="ort-genai", drafter="mtp", tokens=8), tiny)


def test_the_peer_point_measures_paired_rounds_with_cis(tiny):
    r = run_point(RunConfig(preset="tiny", k=2, tokens=24, engine="ort-genai", rounds=3), tiny)
    assert [s["order"] for s in r.round_samples] == ["greedy-mtp", "mtp-greedy", "greedy-mtp"]
    assert all(s["mtplab_greedy_tokens_per_s"] > 0 for s in r.round_samples)
    assert r.speedup_ci[0] <= r.speedup <= r.speedup_ci[1]
    assert "evaluated" in r.extra["draft_acceptance_denominator"]


def test_the_export_runs_genai_on_mtplabs_threads(tmp_path, tiny):
    import json

    from mtplab.genai import export_genai

    folder = export_genai(tiny, tmp_path / "g", threads=3)
    options = json.loads((folder / "target" / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert options["intra_op_num_threads"] == 3 and options["inter_op_num_threads"] == 1
