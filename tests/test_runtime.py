"""Bindings: no op's output is bound on its input's buffer unless the op's kernel allows it (IN_PLACE),
checked on the bindings the engine actually makes for every policy and commit, on both providers' tables."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest

from mtplab.engine.engine import Engine
from mtplab.engine.strategies import COMMITS
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.runtime.arena import Arena
from mtplab.runtime.device import Device
from mtplab.runtime.executor import CpuPlanBackend
from mtplab.runtime.policy import POLICIES
from mtplab.runtime.sessions import IN_PLACE, TargetState, check_in_place, in_place_pairs, target_io


class RecordingBackend(CpuPlanBackend):
    """Test double around the CPU plan backend: records every binding list it is given, per session."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[object, list]] = []

    def eager(self, session, binds):
        self.seen.append((session, list(binds)))
        super().eager(session, binds)

    def capture(self, session, binds, owner="slot"):
        self.seen.append((session, list(binds)))
        return super().capture(session, binds, owner)


def test_the_table_allows_kv_and_gdn_state_and_never_the_conv_carry():
    for provider in ("CUDAExecutionProvider", "CPUExecutionProvider"):
        table = IN_PLACE[provider]
        assert table["GroupQueryAttention"] == {(3, 1), (4, 2)} and table["GatedDeltaNet"] == {(6, 1)}
        assert "CausalConvWithState" not in table


@pytest.mark.parametrize("policy_name, commit", list(itertools.product(POLICIES, COMMITS)))
def test_every_binding_the_engine_makes_is_in_place_only_where_the_kernel_allows(tiny, policy_name, commit):
    backend = RecordingBackend()
    run = RunConfig(model="tiny", k=3, drafter="mtp", policy=policy_name, commit=commit, tokens=24)
    r = run_point(run, tiny, Engine(run, tiny, device=Device("cpu", np, backend)))
    assert r.lossless, r.verdict
    models = {}
    ops = set()
    for session, binds in backend.seen:
        path = session._model_path
        model = models.setdefault(path, onnx.load(path))
        for provider in ("CUDAExecutionProvider", "CPUExecutionProvider"):
            check_in_place(model, binds, provider)
        ops |= {op for op, *_ in in_place_pairs(model, binds)}
    assert ops == {"GroupQueryAttention", "GatedDeltaNet"}  # KV and GDN state in place; conv carry never


def test_binding_the_conv_carry_in_place_is_refused_naming_the_op(tiny):
    cfg = tiny.config
    state = TargetState.allocate(tiny.description, Arena("t"))
    _, _, bound = target_io(state.desc, state, np.array([1]))
    i = cfg.gdn_layer_ids[0]
    aliased = [(n, state.conv[i] if n == f"present_conv_state.{i}" else a, o) for n, a, o in bound]
    with pytest.raises(ValueError, match=rf"present_conv_state.{i} on conv_state.{i} \(CausalConvWithState 3->1\)"):
        check_in_place(onnx.load(str(tiny.target)), aliased, "CUDAExecutionProvider")
