"""The engine on device arrays: CuPy's rules (no implicit host conversion, explicit transfers) held
by a test double of CuPy whose memory is host memory, so the real model runs on the CPU EP
through the CUDA plan backend (graph ids, capture protocol) and every host transfer is counted."""

from __future__ import annotations

import time

import fake_cupy
import numpy as np
import onnxruntime as ort
import pytest

from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.model.prompts import prompt_tokens
from mtplab.runtime import cuda
from mtplab.runtime.arena import array_module, put, to_numpy
from mtplab.runtime.device import Device


def fake_device() -> Device:
    backend = cuda.CudaGraphBackend(cuda.GraphIds(per_slot=4), ort.RunOptions, device_type="cpu")
    return Device("fake-cuda", fake_cupy, backend)


def test_the_double_refuses_what_cupy_refuses():
    a = fake_cupy.zeros((2,), np.float32)
    with pytest.raises(TypeError):
        np.asarray(a)
    with pytest.raises(TypeError):
        a[...] = np.ones(2, np.float32)
    put(a, np.ones(2, np.float32))  # the explicit copy the engine uses
    assert array_module(a) is fake_cupy and to_numpy(a).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
def test_the_host_reads_the_device_only_through_device_read(tiny, schedule):
    eng = Engine(RunConfig(model="tiny", k=3, schedule=schedule), tiny, device=fake_device())
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    t0, r0 = fake_cupy.transfers, eng.device.reads
    greedy = eng.greedy(prompt, 40)
    assert fake_cupy.transfers - t0 == eng.device.reads - r0 == 1
    t0, r0 = fake_cupy.transfers, eng.device.reads
    spec = eng.speculative(prompt, 32)
    steps = len(spec["accepted"])
    assert fake_cupy.transfers - t0 == eng.device.reads - r0 == steps + 1
    assert spec["tokens"] == greedy.tokens[: len(spec["tokens"])]


@pytest.mark.parametrize("commit", ["select", "readvance-m1", "readvance-batched"])
@pytest.mark.parametrize("policy_name", ["shared-max", "sibling-pinned"])
def test_speculative_on_device_arrays_is_lossless(tiny, commit, policy_name):
    run = RunConfig(model="tiny", k=3, commit=commit, policy=policy_name, tokens=40)
    eng = Engine(run, tiny, device=fake_device())
    r = run_point(run, tiny, eng)
    assert r.lossless, r.verdict
    assert all(type(a) is fake_cupy.ndarray for a in eng.state.recurrent_arrays())
    assert r.slots["verify"]["replays"] > 0 and r.slots["verify"]["fallbacks"] == 0


def test_oracle_drafts_on_device_arrays_are_lossless(tiny):
    run = RunConfig(model="tiny", k=2, drafter="oracle", alpha=0.6, tokens=40)
    assert run_point(run, tiny, Engine(run, tiny, device=fake_device())).lossless


class RecordingCudaBackend(cuda.CudaGraphBackend):
    """Test double around the CUDA plan backend: records where every input of every run is bound."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.host_bound: set[str] = set()
        self.device_bound: set[str] = set()

    def _binding(self, session, binds):
        for b in binds:
            if not b.output:
                (self.host_bound if isinstance(b.array, np.ndarray) else self.device_bound).add(b.name)
        return super()._binding(session, binds)


@pytest.mark.parametrize("commit", ["select", "readvance-m1"])
def test_on_the_cuda_device_only_total_sequence_length_is_bound_in_host_memory(tiny, commit):
    from mtplab.runtime.device import CUDA_HOST_INPUTS

    backend = RecordingCudaBackend(cuda.GraphIds(per_slot=4), ort.RunOptions, device_type="cpu")
    device = Device("fake-cuda", fake_cupy, backend, host_inputs=CUDA_HOST_INPUTS)
    run = RunConfig(model="tiny", k=3, drafter="mtp", commit=commit, tokens=32)
    assert run_point(run, tiny, Engine(run, tiny, device=device)).lossless
    assert backend.host_bound == {"total_sequence_length"}
    assert {"input_ids", "seqlens_k", "capture_count", "hidden_states"} <= backend.device_bound


def test_a_device_with_a_stream_waits_for_its_setup_before_each_timed_window(tiny):
    """On a device whose runs return once queued, the prefills' work is done before a timed window opens
    (Device.sync at each setup's end): greedy's and speculative's seconds hold their own forwards only."""
    waits = []
    device = Device("cpu", np, cuda.CudaGraphBackend(cuda.GraphIds(per_slot=4), ort.RunOptions, device_type="cpu"),
                    synchronize=lambda: waits.append(time.perf_counter()))
    eng = Engine(RunConfig(model="tiny", k=3, drafter="mtp"), tiny, device=device)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    greedy = eng.greedy(prompt, 16)
    assert len(waits) == device.syncs == 1 and waits[0] <= greedy.started
    spec = eng.speculative(prompt, 16)
    assert len(waits) == device.syncs == 3  # after the target's prefill, and after the head's
    assert waits[1] < waits[2] <= spec["started"] and device.reads == 1 + 1 + len(spec["accepted"])


def test_a_cpu_device_has_nothing_to_wait_for(tiny):
    eng = Engine(RunConfig(model="tiny", k=3), tiny)
    eng.greedy(prompt_tokens(tiny.config.vocab_size, 8, 0), 8)
    assert eng.device.synchronize is None and eng.device.syncs == 0
