"""Graph forms: the installed onnxruntime gets the form its schemas accept, the form is recorded, and every
form it accepts runs losslessly (against the numpy reference and greedy), fp32 and fp16.

Self-contained (no conftest fixtures): `make test` also runs this file under onnxruntime 1.31.1 (the
newest onnxruntime-gpu release) in a second environment (`pytest --noconftest tests/test_forms.py`).
The CPU onnxruntime 1.30/1.31 has no GatedDeltaNet kernel (CUDA only): there the target's graphs
pass every schema check and the session stops at that kernel, with a clear error; the MTP head
(GroupQueryAttention, including the M>1 subsequent-prompt path) runs and is held to the reference.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest

from mtplab.engine.strategies import COMMITS
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.model import build_model, preset
from mtplab.model.forms import FORMS, check_runtime, choose_form, cpu_runs_gated_delta_net, schema_features
from mtplab.model.graph import build_target
from mtplab.model.reference import ReferenceModel, ReferenceMTP
from mtplab.model.weights import target_weights
from mtplab.runtime.arena import Arena
from mtplab.runtime.sessions import graph_session, make_session
from mtplab.runtime.state import TargetState, target_io

NEWEST = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2]) >= (1, 32)
CPU_GDN = cpu_runs_gated_delta_net()
needs_cpu_gdn = pytest.mark.skipif(not CPU_GDN, reason=f"onnxruntime {onnxruntime.__version__}: no CPU GatedDeltaNet")
ACCEPTED = [name for name, form in FORMS.items() if all(schema_features()[f] for f in form.needs())]
# Against the float64 reference: fp32 rounding, or fp16 activations and weights (one fp16 ulp is 1e-3 near 1).
LOGIT_ATOL = {"fp32": 2e-4, "fp16": 6e-2}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("forms")
    cache: dict = {}

    def get(form: str, dtype: str):
        if (form, dtype) not in cache:
            cache[form, dtype] = build_model(preset("tiny", graph_form=form, dtype=dtype), out=root / f"{form}-{dtype}")
        return cache[form, dtype]

    return get


def test_the_installed_runtime_gets_the_form_its_schemas_accept():
    form, why = choose_form()
    assert form.name == ("ort-1.32" if NEWEST else "ort-1.30")
    assert form.name in ACCEPTED and "ort-1.30" in ACCEPTED
    assert ("has query_seqlens" in why) == NEWEST and ("has no query_seqlens" in why) != NEWEST


def test_without_the_newer_schemas_the_portable_form_is_chosen_and_says_why():
    form, why = choose_form(dict.fromkeys(schema_features(), False))
    assert form.name == "ort-1.30" and (form.gate_activation, form.float32_gates, form.query_seqlens) == (
        "qwen",
        True,
        False,
    )
    assert why == (
        "GroupQueryAttention has no query_seqlens; GatedDeltaNet gates only 'none'/'qwen'; "
        "GatedDeltaNet decay/beta float32 only"
    )


def test_a_form_this_runtime_lacks_fails_before_any_build(tmp_path):
    if NEWEST:
        pytest.skip(f"onnxruntime {onnxruntime.__version__} accepts every form")
    with pytest.raises(RuntimeError, match=r"graph form ort-1.32 needs onnxruntime >= 1.32 .*graph_form='ort-1.30'"):
        build_model(preset("tiny", graph_form="ort-1.32"), out=tmp_path / "m")
    assert not (tmp_path / "m").exists()
    with pytest.raises(RuntimeError, match="has no query_seqlens"):
        check_runtime(FORMS["ort-1.32"])


def test_the_form_is_recorded_in_the_manifest_and_the_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path))
    art = build_model(preset("tiny"))
    assert art.manifest["config"]["graph_form"] == choose_form()[0].name == art.config.graph_form
    assert art.path == build_model(preset("tiny", graph_form=choose_form()[0].name)).path
    keys = {preset("tiny", graph_form=name).config_hash() for name in FORMS}
    assert len(keys) == len(FORMS)


@pytest.mark.parametrize("form", ACCEPTED)
def test_the_graphs_say_what_the_form_says(models, form):
    import onnx

    f = FORMS[form]
    for dtype in ("fp32", "fp16"):
        art = models(form, dtype)
        graph = onnx.load(str(art.target)).graph
        gdn = [n for n in graph.node if n.op_type == "GatedDeltaNet"]
        gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
        assert {a.s.decode() for n in gdn for a in n.attribute if a.name == "gate_activation"} == {f.gate_activation}
        assert all(("query_seqlens" in n.input) == f.query_seqlens for n in gqa)
        inputs = {i.name for i in graph.input}
        assert ("query_seqlens" in inputs) == f.query_seqlens
        casts = sum(n.op_type == "Cast" for n in graph.node)
        assert casts == (2 * len(gdn) if f.float32_gates and dtype == "fp16" else 0)


def _weights(cfg):
    _, _, effective = build_target(cfg, target_weights(cfg))
    return target_weights(cfg) | effective


def _reference(cfg):
    return ReferenceModel(cfg, _weights(cfg))


def test_without_a_cpu_gated_delta_net_kernel_the_target_stops_there_after_every_schema_check(models):
    if CPU_GDN:
        pytest.skip(f"onnxruntime {onnxruntime.__version__} has a CPU GatedDeltaNet kernel")
    for dtype in ("fp32", "fp16"):
        art = models(choose_form()[0].name, dtype)
        with pytest.raises(RuntimeError, match=r"has no CPUExecutionProvider kernel for GatedDeltaNet: .* 1\.32"):
            make_session(art.target)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("form", ACCEPTED)
def test_the_head_of_every_accepted_form_matches_the_reference_at_m1_and_after_a_past(models, form, dtype):
    """mtp.onnx is GroupQueryAttention + MLP: a prefill, M=1 steps and M=3 after a past (subsequent prompt)."""
    from mtplab.model.reference import weights_from_onnx

    art = models(form, dtype)
    cfg = art.config
    ref = ReferenceMTP(cfg, weights_from_onnx(art.mtp))  # the head is fitted at build: read what it holds
    session = graph_session(art.description.mtp)
    names = {i.name for i in session.get_inputs()}
    kv = [np.zeros((1, cfg.attn_kv_heads, cfg.max_seq_len, cfg.attn_head_dim), art_dtype(dtype)) for _ in range(2)]
    rng, past = np.random.default_rng(3), 0
    for M in (5, 1, 3, 1, 3):
        tokens = rng.integers(0, cfg.vocab_size, M)
        hidden = rng.standard_normal((M, cfg.hidden_size)).astype(art_dtype(dtype))
        feeds = {
            "input_ids": tokens.reshape(1, M),
            "hidden_states": hidden.reshape(1, M, -1),
            "seqlens_k": np.array([past + M - 1], np.int32),
            "total_sequence_length": np.array(cfg.max_seq_len, np.int32),
            "query_seqlens": np.array([M], np.int32),
        }
        io = session.io_binding()
        for name, value in feeds.items():
            if name in names:
                io.bind_cpu_input(name, value)
        for j, part in enumerate(("key", "value")):
            for name, output in ((f"past_{part}.0", False), (f"present_{part}.0", True)):
                bind = io.bind_output if output else io.bind_input
                bind(name, "cpu", 0, kv[j].dtype, list(kv[j].shape), kv[j].ctypes.data)
        logits = np.empty((1, M, cfg.vocab_size), art_dtype(dtype))
        io.bind_output("logits", "cpu", 0, logits.dtype, list(logits.shape), logits.ctypes.data)
        io.bind_output("mtp_hidden", "cpu")
        session.run_with_iobinding(io)
        r = ref.forward(tokens, hidden.astype(np.float64), past)
        np.testing.assert_allclose(logits[0].astype(np.float64), r["logits"], atol=LOGIT_ATOL[dtype], rtol=0)
        assert (logits[0].argmax(-1) == r["logits"].argmax(-1)).all()
        past += M


def art_dtype(dtype: str):
    return np.float16 if dtype == "fp16" else np.float32


def _forward(session, cfg, state, tokens) -> dict:
    """One eager IOBinding forward on persistent state, as the executor binds it."""
    feeds, outputs, bound = target_io(state.desc, state, np.asarray(tokens, dtype=np.int64))
    io = session.io_binding()
    for name, value in feeds.items():
        io.bind_cpu_input(name, value)
    outs = {n: np.empty(shape, dtype) for n, (shape, dtype) in outputs.items()}
    for name, array, is_output in bound:
        (io.bind_output if is_output else io.bind_input)(
            name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data
        )
    for name, array in outs.items():
        io.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
    session.run_with_iobinding(io)
    state.carry()
    state.length += len(tokens)
    return outs


@needs_cpu_gdn
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("form", ACCEPTED)
def test_every_accepted_form_matches_the_numpy_reference_at_m1_and_m4(models, form, dtype):
    """Prefill, then M=1 decodes and M=4 verifies after a past (GroupQueryAttention's subsequent-prompt path)."""
    art = models(form, dtype)
    cfg, ref = art.config, _reference(art.config)
    session, state, rs = graph_session(art.description.target), TargetState.allocate(art.description, Arena("t")), None
    rs = ref.new_state()
    rng = np.random.default_rng(2)
    for M in (8, 1, 4, 1, 4, 4, 1):
        tokens = rng.integers(0, cfg.vocab_size, M)
        out, r = _forward(session, cfg, state, tokens), ref.forward(tokens, rs)
        np.testing.assert_allclose(out["logits"][0].astype(np.float64), r["logits"], atol=LOGIT_ATOL[dtype], rtol=0)
        assert (out["logits"][0].argmax(-1) == r["logits"].argmax(-1)).all()
        for i in cfg.gdn_layer_ids:
            np.testing.assert_allclose(state.conv[i][0], rs.conv[i], atol=LOGIT_ATOL[dtype] / 4, rtol=0)


@needs_cpu_gdn
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("form", ACCEPTED)
def test_every_accepted_form_is_lossless_with_each_commit(models, form, dtype):
    art = models(form, dtype)
    for commit in COMMITS:
        r = run_point(RunConfig(model="tiny", k=3, drafter="mtp", commit=commit, tokens=32), art)
        assert r.lossless, f"{form} {dtype} {commit}: {r.verdict}"


def test_the_manifest_of_each_build_names_its_form(models):
    for form in ACCEPTED:
        manifest = json.loads((models(form, "fp32").path / "manifest.json").read_text())
        assert manifest["config"]["graph_form"] == form
