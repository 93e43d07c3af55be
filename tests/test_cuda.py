"""The CUDA backend's logic, on the CPU: graph ids, the capture protocol against a recorded fake of the
ORT calls, the stream-order plan, device-side acceptance and state replay (numpy as the array module),
and the fp16 build on the CPU EP."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.model.graph import replay_transitions, replay_transitions_xp, transition_layout
from mtplab.runtime import cuda
from mtplab.runtime.arena import Arena, address
from mtplab.runtime.device import Device
from mtplab.runtime.executor import Binding, Executor, Slot, Status
from mtplab.runtime.slot_memory import SlotMemory


class FakeRunOptions:
    """Test double for onnxruntime.RunOptions: keeps the run config entries."""

    def __init__(self):
        self.entries = {}
        self.log_severity_level = -1  # onnxruntime's default: the session's own

    def add_run_config_entry(self, key, value):
        self.entries[key] = value


class FakeIoBinding:
    """Test double for an IOBinding: records what was bound where."""

    def __init__(self):
        self.inputs, self.outputs = {}, {}

    def bind_input(self, name, device, device_id, dtype, shape, ptr):
        self.inputs[name] = (device, tuple(shape), ptr)

    def bind_output(self, name, device, device_id, dtype, shape, ptr):
        self.outputs[name] = (device, tuple(shape), ptr)


class FakeCudaGraphSession:
    """Test double for an InferenceSession on the CUDA EP with enable_cuda_graph=1.

    Records every call. Models the documented behaviour: gpu_graph_id -1 runs eager once; the
    first run of a new id executes the model three times (two warm-ups, capture, one replay);
    later runs of a known id replay once. "Executing" adds 1 to every in-place state array.
    """

    def __init__(self, state_arrays):
        self.state = {address(a): a for a in state_arrays}
        self.captured: set[int] = set()
        self.calls: list[tuple[str, int]] = []
        self.severities: list[int] = []  # each run's log severity
        self.refuse_capture = False  # True: a capture raises after its two warm-ups, as onnxruntime's does

    def io_binding(self):
        return FakeIoBinding()

    def _execute(self, io):
        for _name, (_, _, ptr) in io.outputs.items():
            if ptr in self.state and ptr in {p for _, _, p in io.inputs.values()}:
                self.state[ptr] += 1

    def run_with_iobinding(self, io, run_options):
        self.severities.append(run_options.log_severity_level)
        gid = int(run_options.entries["gpu_graph_id"])
        if gid >= 0 and gid not in self.captured:
            self.captured.add(gid)
            self.calls.append(("capture", gid))
            for _ in range(2 if self.refuse_capture else 3):
                self._execute(io)
            if self.refuse_capture:  # onnxruntime's error from a capture that fails after its warm-ups
                raise RuntimeError("Error in execution: operation not permitted when stream is capturing")
        else:
            self.calls.append(("eager" if gid < 0 else "replay", gid))
            self._execute(io)


def _setup(per_slot=4, max_recaptures=3):
    state = np.zeros((1, 4), np.float32)
    session = FakeCudaGraphSession([state])
    ids = cuda.GraphIds(per_slot=per_slot)
    backend = cuda.CudaGraphBackend(ids, FakeRunOptions)
    ex = Executor(
        {Slot.PRIMARY: session, Slot.VERIFY: session},
        {Slot.PRIMARY: SlotMemory(Arena("primary")), Slot.VERIFY: SlotMemory(Arena("verify"))},
        backend=backend,
        max_recaptures=max_recaptures,
    )
    return ex, session, ids, state


def _run(ex, slot, state, M=1):
    feeds = {"input_ids": np.zeros((1, M), np.int64)}
    return ex.run(
        slot, feeds, {"logits": ((1, M, 8), np.float32)}, [("state", state, False), ("present_state", state, True)]
    )


def test_capture_advances_in_place_state_exactly_once():
    ex, session, ids, state = _setup()
    for step in range(1, 6):
        _run(ex, Slot.PRIMARY, state)
        assert state[0, 0] == step  # warm-up, capture (3 executions undone, 1 replay), replays
    assert [c[0] for c in session.calls] == ["eager", "capture", "replay", "replay", "replay", "replay"]
    assert ex.state[Slot.PRIMARY].counters()["captures"] == 1 and ex.state[Slot.PRIMARY].replays == 3


def test_a_warm_up_ahead_of_use_runs_eager_and_quiet_and_the_first_use_captures():
    ex, session, ids, state = _setup()
    feeds = {"input_ids": np.zeros((1, 1), np.int64)}
    bound = [("state", state, False), ("present_state", state, True)]
    assert ex.warm_up(Slot.PRIMARY, feeds, {"logits": ((1, 1, 8), np.float32)}, bound)
    assert (session.calls, session.severities, state[0, 0]) == ([("eager", -1)], [4], 1)  # fatal errors only
    _run(ex, Slot.PRIMARY, state)
    assert [c[0] for c in session.calls] == ["eager", "capture", "replay"]  # the capture's undone runs, one replay
    assert session.severities[1:] == [-1, -1] and state[0, 0] == 2


def test_a_capture_onnxruntime_refuses_leaves_the_state_as_before_and_the_slot_runs_eager():
    ex, session, ids, state = _setup()
    session.refuse_capture = True
    for step in range(1, 5):
        _run(ex, Slot.PRIMARY, state)
        assert state[0, 0] == step  # the failed capture's warm-ups undone, its forward run eager: one advance each
    st = ex.state[Slot.PRIMARY]
    assert st.status is Status.UNSUPPORTED and "did not capture graph 1" in st.reason and "stream is capturing" in st.reason
    assert [c[0] for c in session.calls] == ["eager", "capture", "eager", "eager", "eager"]
    assert ids.by_slot["primary"] == [1] and ids.retired == {1} and st.captures == 0 and st.fallbacks == 3


def test_graph_ids_start_at_1_because_0_is_reserved():
    ids = cuda.GraphIds(per_slot=2)
    assert [ids.allocate("primary"), ids.allocate("verify"), ids.allocate("primary")] == [1, 2, 3]
    assert ids.captures == 3 and ids.stats()["graphs"] == 3


def test_each_slot_gets_its_own_graph_id_and_invalidation_takes_a_fresh_one():
    ex, session, ids, state = _setup()
    for _ in range(3):
        _run(ex, Slot.PRIMARY, state)
        _run(ex, Slot.VERIFY, state, M=4)
    assert ids.by_slot == {"primary": [1], "verify": [2]}
    assert ("capture", 0) not in session.calls and ("replay", 0) not in session.calls
    moved = state.copy()
    _run(ex, Slot.PRIMARY, moved)  # a moved buffer: caught by the signature, never replayed stale
    assert ex.state[Slot.PRIMARY].invalidations == 1 and ids.by_slot["primary"] == [1, 3]
    assert 1 in ids.retired and ids.stats()["graphs"] == 3


def test_graph_ids_are_bounded_per_slot_then_the_slot_runs_eager():
    ex, session, ids, state = _setup(per_slot=2, max_recaptures=10)
    arrays = [state] + [state.copy() for _ in range(5)]
    session.state.update({address(a): a for a in arrays})
    for a in arrays:
        _run(ex, Slot.PRIMARY, a)
        _run(ex, Slot.PRIMARY, a)
    st = ex.state[Slot.PRIMARY]
    assert st.status is Status.UNSUPPORTED and "limit 2" in st.reason and "cannot be captured again" in st.reason
    assert ids.by_slot["primary"] == [1, 2] and st.fallbacks > 0


def test_unpinned_workspace_is_a_hazard_the_signature_check_catches():
    state = np.zeros((1, 4), np.float32)
    session = FakeCudaGraphSession([state])
    for validate in (True, False):
        pool = Arena("pool")
        verify_mem = SlotMemory(
            Arena("private"), pool=pool, step_scoped=frozenset({"logits"}), pinned=False, owner="verify"
        )
        ex = Executor(
            {Slot.VERIFY: session},
            {Slot.VERIFY: verify_mem},
            labels={Slot.VERIFY: "verify"},
            backend=cuda.CudaGraphBackend(cuda.GraphIds(8), FakeRunOptions),
            validate=validate,
        )
        for _ in range(5):  # the engine's order: handoff taken, verify, handoff released, verify's released
            handoff = pool.acquire("decode-handoff", 16)
            _run(ex, Slot.VERIFY, state, M=4)
            pool.release(handoff)
            ex.end_step()
        st = ex.state[Slot.VERIFY]
        if validate:
            assert st.invalidations >= 1 and st.hazards == 0 and "address moved" in st.reason
        else:
            assert st.hazards >= 1 and st.invalidations == 0


def test_the_token_by_token_form_the_device_runs_and_the_host_closed_form_agree(tiny):
    """The array-module form (CuPy's order of operations; the kernel itself is checked on a GPU by
    `mtplab gpucheck`) and the host's closed form: exactly for one token (the same two operations), to float32
    rounding for more."""
    t = transition_layout(tiny.config)
    rng = np.random.default_rng(1)
    flat = rng.standard_normal((1, t.capacity * t.width)).astype(np.float32)
    state = rng.standard_normal((1, t.value_heads, t.value_dim, t.key_dim)).astype(np.float32)
    for n in range(1, t.capacity + 1):
        host, device = state.copy(), state[0].copy()
        replay_transitions(t, host, flat, n)
        replay_transitions_xp(np, device, *t.split(flat), n, t.group)
        if n == 1:
            np.testing.assert_array_equal(host[0], device)
        np.testing.assert_allclose(host[0], device, rtol=1e-5, atol=1e-5 * float(np.abs(device).max()))
    wrong = state.copy()
    replay_transitions(t, wrong, flat, 4)
    device = state[0].copy()
    replay_transitions_xp(np, device, *t.split(flat), 5, t.group)
    assert not np.allclose(wrong[0], device, rtol=1e-3)  # one transition short is far outside that tolerance


def test_every_run_is_queued_without_a_stream_sync_and_the_host_waits_once_per_step(tiny):
    """The engine on the CuPy test double through the CUDA plan backend: every run handed to ONNX Runtime
    carries the entry that returns once queued, and the host waits for the device (a transfer from the
    double) once per speculative step, plus once for the prefill's token."""
    import fake_cupy

    from mtplab.model.prompts import prompt_tokens

    backend = cuda.CudaGraphBackend(cuda.GraphIds(per_slot=4), ort.RunOptions, device_type="cpu")
    eng = Engine(RunConfig(model="tiny", k=3, drafter="mtp"), tiny, device=Device("fake-cuda", fake_cupy, backend))
    entries = []  # (no-sync entry, graph id) of every run
    sessions = [*eng.target.sessions.values(), *eng.mtp.sessions.values()]
    for session in {id(s): s for s in sessions}.values():

        def record(io, ro, real=session.run_with_iobinding):
            entries.append((ro.get_run_config_entry(cuda.NO_SYNC), ro.get_run_config_entry("gpu_graph_id")))
            return real(io, ro)

        session.run_with_iobinding = record
    transfers = [fake_cupy.transfers]
    spec = eng.speculative(
        prompt_tokens(tiny.config.vocab_size, 8, 0),
        32,
        on_commit=lambda step, length, emitted, drafted: transfers.append(fake_cupy.transfers),
    )
    assert len(entries) > 3 * len(spec["accepted"]) and all(sync == "1" for sync, _ in entries)
    assert {gid for _, gid in entries} == {"-1", "1", "2", "3", "4"}  # eager prefills, then each slot's one graph
    per_step = np.diff(transfers).tolist()
    assert per_step == [2] + [1] * (len(spec["accepted"]) - 1)  # the prefill's token, then one read per step


class FakeDeviceArray:
    """Test double for a CuPy array: dtype, shape and a device pointer, nothing else."""

    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.data = type("Memory", (), {"ptr": ptr})()


def test_device_arrays_bind_as_cuda_and_host_inputs_as_cpu():
    backend = cuda.CudaGraphBackend(cuda.GraphIds(2), FakeRunOptions)
    session = FakeCudaGraphSession([])
    io = backend._binding(
        session,
        [
            Binding("input_ids", FakeDeviceArray((1, 1), np.int64, 0x7000), False),
            Binding("total_sequence_length", np.array(64, np.int32), False),
            Binding("logits", FakeDeviceArray((1, 1, 8), np.float16, 0x8000), True),
        ],
    )
    assert io.inputs["input_ids"] == ("cuda", (1, 1), 0x7000)
    assert io.inputs["total_sequence_length"][0] == "cpu"
    assert io.outputs["logits"] == ("cuda", (1, 1, 8), 0x8000)


def test_fp16_build_runs_on_the_cpu_ep():
    from mtplab.model import build_model, preset

    art = build_model(preset("tiny", dtype="fp16"))
    assert art.manifest["io"]["target"]["outputs"][0]["dtype"] == "float16"
    for commit in ("readvance-m1", "select"):
        r = run_point(RunConfig(model="tiny", k=3, commit=commit, tokens=32), art)
        assert r.lossless, r.verdict


def _graphs_on_the_cpu_ep(ids: cuda.GraphIds) -> Device:
    """numpy arrays, the CUDA plan backend (graph ids, capture protocol), the real CPU EP underneath."""
    return Device("cpu", np, cuda.CudaGraphBackend(ids, ort.RunOptions, device_type="cpu"))


def test_the_cuda_plan_backend_drives_the_real_engine_losslessly(tiny):
    """On the CPU EP a graph id runs the model once, so capture's restore-and-replay is the whole protocol."""
    for policy_name, verify_ids in (("shared-max", 1), ("sibling", 4)):
        ids = cuda.GraphIds(per_slot=4)
        device = _graphs_on_the_cpu_ep(ids)
        run = RunConfig(model="tiny", k=3, policy=policy_name, tokens=48)
        r = run_point(run, tiny, Engine(run, tiny, device=device))
        assert r.lossless, r.verdict
        assert len(ids.by_slot["primary"]) == 1 and len(ids.by_slot["mtp"]) == 1
        assert len(ids.by_slot["verify"]) == verify_ids  # sibling: every invalidation took a fresh id, up to the bound
        if policy_name == "sibling":
            assert r.slots["verify"]["replays"] == 0 and r.slots["verify"]["fallbacks"] > 0


def test_host_waits_are_one_read_per_step_plus_one_sync_per_capture(tiny):
    from mtplab.model.prompts import prompt_tokens

    ids = cuda.GraphIds(per_slot=4)
    eng = Engine(RunConfig(model="tiny", k=3, drafter="mtp"), tiny, device=_graphs_on_the_cpu_ep(ids))
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    spec = eng.speculative(prompt, 32)
    assert ids.captures == 4  # primary, verify, the head's drafts and commit: one stream sync each, as they captured
    waits = eng.device.reads + ids.captures
    assert waits == cuda.expected_host_waits(len(spec["accepted"]) + 1, ids.captures)


def test_when_graph_ids_run_out_the_point_says_the_primary_slot_ran_eager_in_its_rounds(tiny):
    """readvance-batched re-advances at M=n on Primary: each invalidation spends an id until none is left."""
    ids = cuda.GraphIds(per_slot=2)
    device = _graphs_on_the_cpu_ep(ids)
    run = RunConfig(model="tiny", k=3, commit="readvance-batched", tokens=48)
    r = run_point(run, tiny, Engine(run, tiny, device=device))
    assert r.lossless and len(ids.by_slot["primary"]) == 2
    assert "limit 2" in r.slot_reasons["primary"]
    assert r.extra["greedy_baseline"].endswith("ran eager in some of them")  # each round pairs both sides
    assert run_point(RunConfig(model="tiny", k=3, tokens=48), tiny).extra["greedy_baseline"] == "paired rounds"
