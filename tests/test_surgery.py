"""select on builder folders: mtplab's cached copy of the target computes what the user's graph computes,
and gives select what it replays, in both forms the builder writes.

tests/data/builder-tiny is the LinearAttention form (fp32, -e cpu); tests/data/builder-tiny-gdn the
GatedDeltaNet form (fp16, -e cuda, linear_attn_op=gated_delta_net), which runs on the CPU too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mtplab.check import verdict as oracle
from mtplab.check.lossless import checked_pass
from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.model.builder import open_builder
from mtplab.model.graph import TransitionLayout
from mtplab.model.onnx_read import attributes
from mtplab.model.prompts import prompt_tokens

DATA = Path(__file__).parent / "data"
LINEAR, GDN = DATA / "builder-tiny", DATA / "builder-tiny-gdn"


@pytest.fixture(scope="module")
def gdn():
    return open_builder(GDN)


def test_a_gated_delta_net_export_gets_select_from_the_ops_own_transitions(gdn):
    desc = gdn.description
    assert desc.select == "transitions" and desc.transition_capacity == 8 and desc.max_k() == 7
    # state [1, Hv=4, Dv=32, Dk=16]; the checkpoint has 2 key heads
    assert desc.transitions == TransitionLayout(capacity=8, value_heads=4, key_heads=2, key_dim=16, value_dim=32)
    copy = onnx.load(str(desc.target.path), load_external_data=False)
    nodes = [n for n in copy.graph.node if n.op_type == "GatedDeltaNet"]
    assert len(nodes) == 3 and all(attributes(n)["state_update_capacity"] == 8 for n in nodes)
    assert all(n.input[9] == "capture_count" and n.output[2].startswith("mtplab.transitions.") for n in nodes)
    user = onnx.load(str(GDN / "model.onnx"), load_external_data=False)  # the user's folder: as the builder wrote it
    assert desc.original_target == GDN / "model.onnx" and "capture_count" not in {i.name for i in user.graph.input}
    assert not any(attributes(n).get("state_update_capacity") for n in user.graph.node if n.op_type == "GatedDeltaNet")


def _feeds(session: ort.InferenceSession, M: int, past: int, rng) -> dict:
    """Random states and KV of `past` positions, M new tokens."""
    feeds = {"input_ids": rng.integers(0, 500, (1, M)).astype(np.int64),
             "attention_mask": np.ones((1, past + M), np.int64),
             "position_ids": np.tile(np.arange(past, past + M), (3, 1, 1)).astype(np.int64)}
    for arg in session.get_inputs():
        dtype = np.float16 if arg.type == "tensor(float16)" else np.float32
        if arg.name.startswith("past_key_values"):
            feeds[arg.name] = rng.standard_normal((1, arg.shape[1], past, 32)).astype(dtype)
        elif arg.name.startswith("past."):
            feeds[arg.name] = (0.3 * rng.standard_normal((1, *arg.shape[1:]))).astype(dtype)
    return feeds


@pytest.mark.parametrize("folder", [LINEAR, GDN], ids=["linear-attention-fp32", "gated-delta-net-fp16"])
def test_the_copy_computes_bitwise_what_the_users_graph_computes(folder):
    """Exposing a tensor as a graph output would round it to fp16 for its own consumer on the CPU (which runs an
    fp16 graph's ops in float32 between casts); the copy exposes through an exact Mul by one instead."""
    desc = open_builder(folder).description
    user = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    copy = ort.InferenceSession(str(desc.target.path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for M in (1, 4):
        feeds = _feeds(user, M, 5, rng)
        names = [o.name for o in user.get_outputs()]
        extra = {"capture_count": np.array([M], np.int32)} if desc.target.capture_count else {}
        for name, a, b in zip(names, user.run(names, feeds), copy.run(names, feeds | extra)):
            np.testing.assert_array_equal(a, b, err_msg=f"{folder.name} M={M} {name}")


def _checked(model, run: RunConfig):
    engine = Engine(run, model)
    prompt = prompt_tokens(model.description.vocab_size, run.prompt_len, run.seed)
    checked = checked_pass(engine, prompt, run.tokens)
    spec, identity = checked.spec, checked.identity
    ok, verdict = oracle.verdict(identity)
    return engine, spec, identity, ok, verdict


@pytest.mark.parametrize("commit", ["readvance-m1", "readvance-batched", "select"])
def test_every_commit_is_lossless_on_the_gated_delta_net_export(gdn, commit):
    run = RunConfig(model="tiny", drafter="oracle", alpha=0.7, k=3, tokens=24, commit=commit)
    engine, spec, identity, ok, verdict = _checked(gdn, run)
    assert ok, verdict
    assert identity["state_commits_checked"] == spec.steps + 1 and sum(spec.accepted[0]) > 0
    counters = engine.target.counters()
    assert counters["verify"]["replays"] > 0 and counters["verify"]["fallbacks"] == 0


def test_select_keeps_the_state_readvance_m1_keeps_on_the_gated_delta_net_export(gdn):
    """readvance-m1 is bitwise against the reference; select keeps the verify's fp16 forward, within its rule."""
    states = {}
    for commit in ("readvance-m1", "select"):
        engine, _, identity, ok, verdict = _checked(gdn, RunConfig(model="tiny", drafter="oracle", alpha=0.9, k=4,
                                                                    tokens=24, commit=commit))
        assert ok, verdict
        states[commit] = engine.state.snapshot()
    assert states["readvance-m1"].keys() == states["select"].keys()
    for name, a in states["select"].items():
        b = states["readvance-m1"][name].astype(np.float64)
        assert np.max(np.abs(a - b)) <= oracle.STATE_RTOL["fp16"] * max(1.0, np.max(np.abs(b))), name


def test_the_mtp_head_drafts_losslessly_on_the_gated_delta_net_export(gdn):
    engine, spec, _, ok, verdict = _checked(gdn, RunConfig(model="tiny", drafter="mtp", k=2, tokens=24))
    assert ok, verdict
    assert engine.forwards["mtp/M=1"] == 2 * spec.steps
