"""Bindings: no op's output is bound on its input's buffer unless the op's kernel allows it (IN_PLACE),
checked on the bindings the engine actually makes for every policy and commit, on both providers' tables."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest

from mtplab.engine.engine import Engine
from mtplab.engine.strategies import COMMITS
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.runtime.arena import Arena
from mtplab.runtime.device import Device
from mtplab.runtime.plans import CpuPlanBackend
from mtplab.runtime.policy import POLICIES
from mtplab.runtime.sessions import IN_PLACE, check_in_place, in_place_pairs
from mtplab.runtime.state import TargetState, target_io


class RecordingBackend(CpuPlanBackend):
    """Test double around the CPU plan backend: records every binding list it is given, per session."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[object, list]] = []

    def eager(self, session, binds, quiet=False):
        self.seen.append((session, list(binds)))
        super().eager(session, binds, quiet)

    def capture(self, session, binds, owner="slot"):
        self.seen.append((session, list(binds)))
        return super().capture(session, binds, owner)


def test_the_table_allows_kv_and_gdn_state_everywhere_linear_attention_on_the_cpu_and_never_the_conv_carry():
    for provider in ("CUDAExecutionProvider", "CPUExecutionProvider"):
        table = IN_PLACE[provider]
        assert table["GroupQueryAttention"] == {(3, 1), (4, 2)} and table["GatedDeltaNet"] == {(6, 1)}
        assert "CausalConvWithState" not in table
    assert IN_PLACE["CPUExecutionProvider"]["LinearAttention"] == {(3, 1)}
    assert "LinearAttention" not in IN_PLACE["CUDAExecutionProvider"]  # its kernel is not checked aliased on a GPU


def test_a_builder_description_resolved_for_a_provider_puts_linear_attention_in_place_on_the_cpu_only():
    from mtplab.model.builder import open_builder

    desc = open_builder(Path(__file__).parent / "data" / "builder-tiny").description
    registered = {(s.op, s.in_place) for s in desc.target.states}
    assert registered == {("CausalConvWithState", False), ("LinearAttention", False)}  # what the kernels register
    cpu = desc.on_provider("CPUExecutionProvider")
    assert {(s.op, s.in_place) for s in cpu.target.states} == {("CausalConvWithState", False),
                                                                ("LinearAttention", True)}
    assert desc.on_provider("CUDAExecutionProvider") is desc
    assert all(s.in_place for s in cpu.own_graph().target.states if s.op == "LinearAttention")  # Primary's graph too


def test_the_cpu_linear_attention_kernel_on_one_buffer_computes_bitwise_what_it_computes_into_its_own():
    """ALIASED's premise, on the installed onnxruntime: the same tokens through the builder fixture with the
    LinearAttention state aliased and with its own present buffer copied back give bitwise the same logits and states,
    forward after forward, at M=1 and M>1 (a prefill, decodes, verify-sized chunks)."""
    from mtplab.model.builder import open_builder
    from mtplab.model.prompts import prompt_tokens
    from mtplab.runtime.executor import Executor, Slot
    from mtplab.runtime.sessions import graph_session
    from mtplab.runtime.slot_memory import SlotMemory

    art = open_builder(Path(__file__).parent / "data" / "builder-tiny")
    session = graph_session(art.description.target)
    model = onnx.load(str(art.description.target.path))
    states = [TargetState.allocate(d, Arena(name)) for d, name in
              ((art.description, "own"), (art.description.on_provider("CPUExecutionProvider"), "aliased"))]
    tokens = prompt_tokens(art.description.vocab_size, 24, 3)
    ex = Executor({Slot.PRIMARY: session}, {Slot.PRIMARY: SlotMemory(Arena("io"))})
    start = 0
    for M in (8, 1, 1, 4, 1, 3, 4, 1):
        outs = []
        for st in states:
            feeds, outputs, bound = target_io(st.desc, st, np.asarray(tokens[start:start + M]), True)
            outs.append(ex._eager_temporaries(Slot.PRIMARY, feeds, outputs, bound)["logits"].copy())
            st.carry()
            st.length += M
            aliased = {op for op, *_ in in_place_pairs(model, bound)}
            assert ("LinearAttention" in aliased) == (st is states[1])
        start += M
        assert np.array_equal(outs[0], outs[1]), f"logits differ after a forward of {M}"
        own, aliased = (st.recurrent() for st in states)
        for name in own:
            assert np.array_equal(own[name], aliased[name]), f"{name} differs after a forward of {M}"


@pytest.mark.parametrize("policy_name, commit", list(itertools.product(POLICIES, COMMITS)))
def test_every_binding_the_engine_makes_is_in_place_only_where_the_kernel_allows(tiny, policy_name, commit):
    backend = RecordingBackend()
    run = RunConfig(model="tiny", k=3, drafter="mtp", policy=policy_name, commit=commit, tokens=24)
    r = run_point(run, tiny, Engine(run, tiny, device=Device("cpu", np, backend)))
    assert r.lossless, r.verdict
    models = {}
    ops = set()
    for session, binds in backend.seen:
        path = session.graph_path
        model = models.setdefault(path, onnx.load(path))
        for provider in ("CUDAExecutionProvider", "CPUExecutionProvider"):
            check_in_place(model, binds, provider)
        ops |= {op for op, *_ in in_place_pairs(model, binds)}
    # KV and GDN state in place, conv carry never; per-position's copy, which a shared session's decode runs, makes
    # each GDN present in a Loop, which no kernel table lets onto its past
    on_the_copy = commit == "per-position" and not Engine(run, tiny).policy.sibling_session
    assert ops == {"GroupQueryAttention"} | (set() if on_the_copy else {"GatedDeltaNet"})


@pytest.mark.parametrize("folder, ops", [("builder-tiny-gdn", {"GroupQueryAttention", "GatedDeltaNet"}),
                                        ("builder-tiny", {"GroupQueryAttention", "LinearAttention"})])
def test_a_builder_graphs_state_is_in_place_only_where_its_ops_kernel_allows(folder, ops):
    from mtplab.model.builder import open_builder
    from mtplab.model.prompts import prompt_tokens

    path = Path(__file__).parent / "data" / folder
    art, backend = open_builder(path), RecordingBackend()
    eng = Engine(RunConfig(model=str(path), k=2), art, device=Device("cpu", np, backend))
    prompt = prompt_tokens(eng.desc.vocab_size, 8, 0)
    assert eng.speculative(prompt, 12)["tokens"][:12] == eng.greedy(prompt, 12).tokens
    seen, aliased = set(), []
    for session, binds in backend.seen:
        model = onnx.load(str(session.graph_path))
        check_in_place(model, binds, "CPUExecutionProvider")
        pairs = {op for op, *_ in in_place_pairs(model, binds)}
        seen |= pairs
        if "LinearAttention" in pairs:
            aliased.append((model, binds))
    assert seen == ops  # the conv carry: never; GatedDeltaNet's state: its own buffer; LinearAttention's: on the CPU
    for model, binds in aliased:  # bindings the CUDA table refuses
        with pytest.raises(ValueError, match=r"present\.\d\.recurrent on past\.\d\.recurrent \(LinearAttention 3->1\)"):
            check_in_place(model, binds, "CUDAExecutionProvider")


def test_binding_the_conv_carry_in_place_is_refused_naming_the_op(tiny):
    cfg = tiny.config
    state = TargetState.allocate(tiny.description, Arena("t"))
    _, _, bound = target_io(state.desc, state, np.array([1]))
    i = cfg.gdn_layer_ids[0]
    aliased = [(n, state.conv[i] if n == f"present_conv_state.{i}" else a, o) for n, a, o in bound]
    with pytest.raises(ValueError, match=rf"present_conv_state.{i} on conv_state.{i} \(CausalConvWithState 3->1\)"):
        check_in_place(onnx.load(str(tiny.target)), aliased, "CUDAExecutionProvider")


def test_each_kind_of_state_lives_in_one_buffer_until_a_buffer_is_replaced(tiny):
    cfg = tiny.config
    state = TargetState.allocate(tiny.description, Arena("t"))
    layers = tuple(cfg.gdn_layer_ids)
    stack = state.stacked("recurrent", layers)
    assert stack is not None and stack.shape[0] == len(layers)
    state.gdn[layers[-1]][...] = 3.0
    assert (stack[-1] == 3.0).all() and (stack[0] == 0.0).all()  # each layer's buffer is its row
    assert state.stacked("recurrent", layers[::-1]) is None  # another order is not this buffer's
    assert state.stacked("conv present", layers) is not None  # the conv carries' own outputs too (never in place)
    assert state.stacked("recurrent present", layers) is None  # GatedDeltaNet writes in place: no presents
    state.gdn[layers[0]] = state.gdn[layers[0]].copy()
    assert state.stacked("recurrent", layers) is None and state.stacked("conv", layers) is None


def test_select_updates_every_layer_at_once_as_it_does_layer_by_layer(tiny, runner_for):
    from mtplab.engine.commits import select_commit
    from mtplab.runtime.device import device_for

    cfg, apply = tiny.config, select_commit(tiny.description, device_for("cpu"))
    run = runner_for(tiny)
    run.forward([7, 8, 9])
    verify = run.forward([11, 12, 13, 14, 15], in_place=False)
    for n in (1, 3, 5):
        together = TargetState.allocate(tiny.description, Arena("a"))
        apart = TargetState.allocate(tiny.description, Arena("b"))
        for i in cfg.gdn_layer_ids:
            apart.gdn[i], apart.conv[i] = run.state.gdn[i].copy(), run.state.conv[i].copy()  # no longer stacked
            together.gdn[i][...], together.conv[i][...] = run.state.gdn[i], run.state.conv[i]
        assert together.stacked("recurrent", tuple(cfg.gdn_layer_ids)) is not None
        apply(together, verify, n)
        apply(apart, verify, n)
        for i in cfg.gdn_layer_ids:
            np.testing.assert_array_equal(together.conv[i], apart.conv[i])
            np.testing.assert_allclose(together.gdn[i], apart.gdn[i], rtol=1e-5, atol=1e-6)
            assert not np.array_equal(together.gdn[i], run.state.gdn[i])  # the update did something


@pytest.mark.parametrize("form", ["seqlens", "attention_mask"])
def test_length_feeds_rewritten_in_place_equal_fresh_ones(tiny, form):
    from dataclasses import replace

    from mtplab.model.description import length_feeds

    io = tiny.description.target
    if form == "attention_mask":  # the builder's form: a mask over the span, and MRoPE's [3, 1, M] positions
        io = replace(io, lengths="attention_mask", positions=(3, 1), query_seqlens=False, capture_count=False)
    for M in (1, 4):
        kept = length_feeds(io, 0, M, 32)
        arrays = {n: a for n, a in kept.items()}
        for length in (5, 20, 3, 0, 28):  # up, and back down as a rollback does
            fresh = length_feeds(io, length, M, 32)
            again = length_feeds(io, length, M, 32, into=kept)
            assert again is kept and all(again[n] is a for n, a in arrays.items())  # the same arrays, rewritten
            assert list(again) == list(fresh)
            for name in fresh:
                np.testing.assert_array_equal(again[name], fresh[name], err_msg=f"{name} at length {length}, M={M}")


def test_a_session_onnxruntime_makes_on_another_provider_than_asked_is_refused(tiny):
    """onnxruntime falls back to the CPU EP with a warning when the provider asked for is unavailable (its package,
    or the CUDA libraries it loads, missing): device buffers bound into that session would not run."""
    import onnxruntime as ort

    from mtplab.runtime.sessions import make_session

    wanted = next(p for p in ("CUDAExecutionProvider", "ROCMExecutionProvider", "DmlExecutionProvider")
                  if p not in ort.get_available_providers())
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=rf"target.onnx's session on \['CPUExecutionProvider'\], not on {wanted}"):
        make_session(tiny.target, provider=(wanted, {}))
