"""The built-in model: ONNX graphs agree with the numpy reference; state semantics; config checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mtplab.model import ModelConfig, build_model, load_artifact, preset, preset_config
from mtplab.model.graph import (
    TransitionLayout,
    rebuild_conv,
    replay_transitions,
    replay_transitions_closed,
    replay_transitions_xp,
    transition_layout,
)
from mtplab.model.reference import ReferenceModel
from mtplab.model.weights import target_weights

# fp32 ONNX vs float64 numpy: differences are float32 rounding accumulated over the layers.
LOGIT_ATOL = 2e-4
STATE_ATOL = 2e-5
INT4_LOGIT_ATOL = 5e-3  # MatMulNBits dequantizes blockwise in float; compared with its own dequantized weights


def _reference(art):
    from mtplab.model.graph import build_target

    cfg = art.config
    _, _, effective = build_target(cfg, target_weights(cfg))
    w = target_weights(cfg) | effective
    return ReferenceModel(cfg, w)


@pytest.mark.parametrize("name", ["tiny", pytest.param("small", marks=pytest.mark.full)])
@pytest.mark.parametrize("M", [1, 4])
def test_onnx_matches_reference_over_eight_steps(name, M, runner_for, request):
    art = request.getfixturevalue(name)
    run, ref = runner_for(art), _reference(art)
    cfg, rs = art.config, ref.new_state()
    rng = np.random.default_rng(1)
    for _ in range(8):
        tokens = rng.integers(0, cfg.vocab_size, M)
        out, r = run.forward(tokens), ref.forward(tokens, rs)
        np.testing.assert_allclose(out["logits"][0], r["logits"], atol=LOGIT_ATOL, rtol=0)
        np.testing.assert_allclose(out["hidden"][0], r["hidden"], atol=LOGIT_ATOL, rtol=0)
        n = run.state.length
        for i, (k, v) in run.state.kv.items():
            np.testing.assert_allclose(k[0, :, :n], rs.kv[i][0][:, :n], atol=STATE_ATOL, rtol=0)
            np.testing.assert_allclose(v[0, :, :n], rs.kv[i][1][:, :n], atol=STATE_ATOL, rtol=0)
        for i in cfg.gdn_layer_ids:
            np.testing.assert_allclose(run.state.conv[i][0], rs.conv[i], atol=STATE_ATOL, rtol=0)
            np.testing.assert_allclose(run.state.gdn[i][0], rs.gdn[i], atol=STATE_ATOL, rtol=0)


def test_int4_build_runs_close_to_its_dequantized_reference(runner_for, tiny):
    import onnx

    from mtplab.model.onnx_read import parameter_count

    art = build_model(preset_config("tiny", int4=True))  # the model `--int4` runs: named and cached as its own
    assert art.config.name == "tiny-int4" and art.path.name.startswith("tiny-int4-")
    assert preset_config("tiny", int4=True).config_hash() == preset("tiny", weight_format="int4").config_hash()  # not the name
    assert any("MatMulNBits" in op for op in art.manifest["ops"])
    for role in ("target", "mtp"):  # a packed int4 weight counts its K x N parameters, as the fp32 build's do
        graph = onnx.load(str(art.path / art.manifest["files"][role]), load_external_data=False)
        assert parameter_count(graph) == tiny.manifest["parameters"][role]
    run, ref = runner_for(art), _reference(art)
    rs = ref.new_state()
    for tokens in ([1, 2, 3, 4], [5], [6]):
        out, r = run.forward(tokens), ref.forward(tokens, rs)
        np.testing.assert_allclose(out["logits"][0], r["logits"], atol=INT4_LOGIT_ATOL, rtol=0)


def test_kv_buffer_is_updated_in_place_and_only_the_new_rows(tiny, runner_for):
    run = runner_for(tiny)
    run.forward([1, 2, 3])
    i = tiny.config.attention_layer_ids[0]
    k = run.state.kv[i][0]
    addr, before = k.ctypes.data, k.copy()
    run.forward([4, 5])
    assert k.ctypes.data == addr
    changed = np.any(k != before, axis=(0, 1, 3))
    assert changed[3:5].all() and not changed[:3].any() and not changed[5:].any()


def test_transitions_replayed_for_any_prefix_give_the_state_of_running_it(tiny, runner_for):
    cfg = tiny.config
    run = runner_for(tiny)
    run.forward([7, 8, 9])
    base = {i: (run.state.gdn[i].copy(), run.state.conv[i].copy()) for i in cfg.gdn_layer_ids}
    tokens = [11, 12, 13, 14, 15]  # a verify of k+1 = 5 tokens
    verify = run.forward(tokens, in_place=False)
    for j in range(len(tokens) + 1):
        truth = runner_for(tiny)
        truth.forward([7, 8, 9])
        if j:
            truth.forward(tokens[:j])
        for i in cfg.gdn_layer_ids:
            gdn, conv = base[i][0].copy(), base[i][1].copy()
            replay_transitions(transition_layout(cfg), gdn, verify[f"gdn_transitions.{i}"], j)
            rebuild_conv(conv, verify[f"conv_input.{i}"], j)
            # the verify's M=5 forward (attention at layer 1 included) rounds the conv inputs of later layers
            # apart from an M=j forward's by a few float32 ulps
            np.testing.assert_allclose(gdn, truth.state.gdn[i], atol=1e-5, rtol=0)
            np.testing.assert_allclose(conv, truth.state.conv[i], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("heads", [(4, 2, 16, 8), (8, 8, 8, 16)])  # (Hv, Hk, Dk, Dv): grouped keys, and one per head
def test_the_closed_form_over_stacked_layers_is_the_token_by_token_update(heads):
    Hv, Hk, Dk, Dv = heads
    t, L = TransitionLayout(8, Hv, Hk, Dk, Dv), 3
    rng = np.random.default_rng(2)
    flats = rng.standard_normal((L, 1, t.capacity * t.width)).astype(np.float32)
    decay, key, delta = t.split(flats)
    decay[...] = rng.uniform(0.2, 1.0, decay.shape)
    start = rng.standard_normal((L, Hv, Dv, Dk)).astype(np.float32)
    for n in range(t.capacity + 1):
        stacked = start.copy()
        replay_transitions_closed(stacked, decay, key, delta, n, t.group)
        for layer in range(L):
            one = start[layer].copy()
            replay_transitions_xp(np, one, decay[layer], key[layer], delta[layer], n, t.group)
            if n <= 1:  # the same operations: bitwise
                np.testing.assert_array_equal(stacked[layer], one)
            np.testing.assert_allclose(stacked[layer], one, rtol=1e-5, atol=1e-6 * float(np.abs(one).max()))
    short = start.copy()
    replay_transitions_closed(short, decay, key, delta, 3, t.group)
    full = start.copy()
    replay_transitions_closed(full, decay, key, delta, 4, t.group)
    assert not np.allclose(short, full, rtol=1e-3)


def test_build_is_cached_by_config_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path))
    a = build_model(preset("tiny"))
    mtime = (a.path / "target.onnx").stat().st_mtime_ns
    b = build_model(preset("tiny"))
    assert a.path == b.path and (b.path / "target.onnx").stat().st_mtime_ns == mtime
    c = build_model(preset("tiny", seed=1))
    assert c.path != a.path
    assert sorted(p.name for p in a.path.iterdir()) == ["manifest.json", "mtp.onnx", "target.onnx"]


def test_weights_are_deterministic_from_the_seed():
    a, b = target_weights(preset("tiny")), target_weights(preset("tiny"))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["embed"], target_weights(preset("tiny", seed=3))["embed"])


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"hidden_size": 60}, "hidden_size"),
        ({"attention_layers": (9,)}, "attention_layers"),
        ({"dtype": "bf16"}, "dtype"),
        ({"weight_format": "int8"}, "weight_format"),
        ({"transition_capacity": 9}, "transition_capacity"),
        # each of these built a model that crashed in its build or could never run
        ({"attn_head_dim": 24, "hidden_size": 96, "attn_heads": 4}, "attn_head_dim=24: must be a multiple of 16"),
        ({"vocab_size": 1}, "vocab_size=1: must be >= 2"),
        ({"transition_capacity": 1}, "transition_capacity=1: allowed values are 2..8"),
        ({"max_seq_len": 31}, "max_seq_len=31: must be >= 32"),
    ],
)
def test_bad_config_names_the_field_and_the_allowed_values(changes, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**changes)


def test_the_shortest_kv_capacity_allowed_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path))
    art = build_model(preset("tiny", max_seq_len=32, head_fit_tokens=64))
    assert art.description.capacity == 32 and art.manifest["behaviour"]["tokens"] == 24


def test_k_above_transition_capacity_is_rejected():
    with pytest.raises(ValueError, match=r"k=8.*transition capacity 8.*1\.\.7"):
        preset("tiny").check_k(8)


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ValueError, match=r"unknown preset 'huge'.*\['base', 'small', 'tiny'\]"):
        preset("huge")


def test_external_manifest_is_validated_against_the_model(tiny, tmp_path):
    for f in ("target.onnx", "mtp.onnx"):
        (tmp_path / f).write_bytes((tiny.path / f).read_bytes())
    manifest = json.loads((tiny.path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert load_artifact(tmp_path).config == tiny.config
    manifest["io"]["target"]["inputs"].append({"name": "position_ids", "dtype": "int64", "shape": [1, "M"]})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="target model has no input named 'position_ids'"):
        load_artifact(tmp_path)
    manifest["io"]["target"]["inputs"].pop()
    manifest["io"]["target"]["inputs"][0]["shape"] = [1]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="'input_ids' has rank 2 in the model, manifest says 1"):
        load_artifact(tmp_path)
    manifest["io"]["target"]["inputs"][0] |= {"shape": [1, "M"], "dtype": "int32"}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="'input_ids' is int64 in the model, manifest says int32"):
        load_artifact(tmp_path)
    manifest["io"]["target"]["inputs"][0]["dtype"] = "int64"
    kv = next(v for v in manifest["io"]["target"]["inputs"] if v["name"].startswith("past_key."))
    kv["shape"][2] = 128
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"'{kv['name']}' is \['B', 2, 256, 16\] in the model, manifest says "
                                         r"\['B', 2, 128, 16\]"):
        load_artifact(tmp_path)
    kv["shape"][2] = 256
    del manifest["config"]["max_seq_len"]  # a manifest may leave it to ModelConfig's default, the graph's here
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert load_artifact(tmp_path).config.max_seq_len == 256
    manifest["config"]["max_seq_len"] = 512  # the KV mtplab would allocate: the first run would refuse it
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"the target model is not what it describes .*: input 'past_key.1' is "
                                         r"\['B', 2, 256, 16\], expected \[B, 2, 512, 16\] .*; and 5 more$"):
        load_artifact(tmp_path)
    manifest["config"] |= {"max_seq_len": 256, "attn_kv_heads": 1}  # the head's KV too, from the same fields
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"the target model .*'past_key.1' is \['B', 2, 256, 16\], expected "
                                         r"\[B, 1, 256, 16\]"):
        load_artifact(tmp_path)


def test_generation_varies_and_margins_are_clear(tiny):
    from mtplab.engine.engine import Engine
    from mtplab.experiment.config import RunConfig
    from mtplab.model.prompts import prompt_tokens

    eng = Engine(RunConfig(model="tiny"), tiny)
    g = eng.greedy(prompt_tokens(tiny.config.vocab_size, 8, 0), 64)
    assert len(set(g.tokens)) > 16
    assert np.median(g.margins) > 1.0
