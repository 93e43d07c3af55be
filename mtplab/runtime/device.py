"""Where an engine runs: numpy on ONNX Runtime's CPU EP, or CuPy on one CUDA stream with the CUDA EP.

A Device owns what differs between the two: the array module of every arena, the plan backend
(IOBinding plans or CUDA graphs), how sessions are made, the memory pools, and the one place
where the host waits for the device (`read`, counted, so tests can hold the engine to one read
per speculative step).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from mtplab.model.description import GraphIO
from mtplab.runtime.arena import Arena, to_numpy
from mtplab.runtime.plans import CpuPlanBackend, PlanBackend
from mtplab.runtime.sessions import graph_session, shared_initializers

CUDA_HELP = (
    "backend='cuda' needs onnxruntime-gpu >= 1.30 with the CUDAExecutionProvider, CuPy and a CUDA device: "
    "pip install 'mtplab[gpu]' (mtplab doctor says what is installed)"
)
# The one input an op on the CUDA EP reads in host memory (GroupQueryAttention's total_sequence_length,
# InputMemoryType CPU): constant (the KV capacity), since a graph bakes the host value it was captured
# with. Every other input is bound in device memory, always: a host-bound device input is copied once at
# bind time and a captured graph would replay that stale copy.
CUDA_HOST_INPUTS = frozenset({"total_sequence_length"})


@dataclass(eq=False)
class Device:
    """The array module, plan backend, sessions and memory pools of one engine."""

    name: str
    xp: ModuleType
    backend: PlanBackend
    provider: str | tuple[str, dict] = "CPUExecutionProvider"
    ort_device: str = "cpu"  # where ONNX Runtime finds shared weights and bound buffers
    host_inputs: frozenset[str] = frozenset()  # set by whoever makes the device (cuda_device: CUDA_HOST_INPUTS)
    threads: int = 0  # intra-op threads of every session it makes (RunConfig.threads; 0: onnxruntime's default)
    new_pool: Callable[[], Any] | None = None  # a fresh memory pool (CuPy's MemoryPool), for private arenas
    shared_pool: Any = None
    synchronize: Callable[[], None] | None = None  # waits for the work queued so far (cuda_device: its stream's)
    reads: int = 0
    syncs: int = 0

    @property
    def provider_name(self) -> str:
        """The execution provider's name ("CPUExecutionProvider", "CUDAExecutionProvider")."""
        return self.provider if isinstance(self.provider, str) else self.provider[0]

    def read(self, a: Any) -> np.ndarray:
        """Bring a device array to the host: inside a timed run, the host waits for the device here, and only here."""
        self.reads += 1
        return a if type(a) is np.ndarray else to_numpy(a)

    def sync(self) -> None:
        """Wait until the device has done the work queued so far, at the edge of a timed window (a setup's end, a
        calibration block's ends), so the window holds its own work only; counted apart from `read`. Nothing on the
        CPU EP, whose runs return when done."""
        if self.synchronize is not None:
            self.syncs += 1
            self.synchronize()

    def session(self, io: GraphIO, shared: dict | None = None):
        """A session of a target or head graph on this device, outputting its greedy choice (graph_session)."""
        return graph_session(io, shared, threads=self.threads, provider=self.provider)

    def shared_weights(self, path) -> dict:
        """The model's weights as OrtValues on this device, for sessions that share them."""
        return shared_initializers(path, self.ort_device)

    def arena(self, name: str, private: bool = False) -> Arena:
        """An arena on this device: from the shared memory pool, or from its own pool when private."""
        pool = self.new_pool() if private and self.new_pool is not None else self.shared_pool
        return Arena(name, xp=self.xp, pool=pool)

    def check_model(self, desc) -> None:
        """ValueError if this device cannot run the model as described (before any session is made)."""
        if problem := backend_problem(self.name, desc):
            raise ValueError(problem)

    def transition_replay(self, layout) -> Callable:
        """select's GatedDeltaNet transition replay (a TransitionLayout), replay(state, transitions row, n): one CuPy
        kernel per layer on CUDA, numpy's closed form on the CPU (mtplab.model.graph)."""
        if self.name == "cuda":
            from mtplab.runtime.cuda import DeviceReplay

            return DeviceReplay(layout)
        from mtplab.model.graph import replay_transitions

        return functools.partial(replay_transitions, layout)

    def graph_stats(self) -> dict:
        ids = getattr(self.backend, "ids", None)
        return ids.stats() if ids is not None else {}


def backend_problem(backend: str, desc) -> str | None:
    """Why `backend` cannot run the model as described (None when it can): read from the description alone."""
    io = desc.target
    types = {"activations": io.dtype, "logits": io.logits_type.name, **{kv.past_key: kv.dtype for kv in io.kv},
             **{s.past: s.dtype for s in io.states}}
    bf16 = sorted(name for name, t in types.items() if t == "bfloat16")
    if bf16:
        return (f"{desc.name} computes in bfloat16 ({', '.join(bf16)}), which mtplab's backends do not run: the CPU "
                "EP lacks bfloat16 kernels for ops these graphs use (`mtplab model inspect` names them) and the CUDA "
                "backend runs float16 graphs; build the model with -p fp16 (or fp32 for the CPU)")
    if backend == "cuda" and desc.dtype != "float16":
        return (f"{desc.name} is a {desc.dtype} build: the CUDA backend needs an fp16 build "
                "(GroupQueryAttention on CUDA is fp16/bf16 only): mtplab model build --dtype fp16")
    return None


def cpu_device(threads: int = 0) -> Device:
    return Device("cpu", np, CpuPlanBackend(), threads=threads)


def require_cuda() -> None:
    """Raise ValueError saying what is missing unless the CUDA backend can run here."""
    try:
        import cupy
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ImportError(f"onnxruntime {ort.__version__} has providers {ort.get_available_providers()}")
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise ImportError("no CUDA device")
    except Exception as err:  # noqa: BLE001 - any of these means: no CUDA backend here
        raise ValueError(f"{CUDA_HELP} ({type(err).__name__}: {err})") from err


def cuda_available() -> bool:
    """Whether the CUDA backend can run here (see require_cuda for what it needs)."""
    try:
        require_cuda()
    except ValueError:
        return False
    return True


def cuda_device(graphs_per_slot: int, threads: int = 0) -> Device:
    """CuPy arrays on one non-blocking stream, the CUDA EP with graphs enabled on that same stream."""
    require_cuda()
    import cupy
    import onnxruntime as ort

    from mtplab.runtime.cuda import CudaGraphBackend, GraphIds

    stream = _process_stream()
    stream.use()  # CuPy's current stream is per thread: this device's work is queued from the thread that made it
    options = {"enable_cuda_graph": "1", "user_compute_stream": str(stream.ptr)}
    backend = CudaGraphBackend(
        GraphIds(per_slot=graphs_per_slot), ort.RunOptions, mem_free=lambda: cupy.cuda.runtime.memGetInfo()[0]
    )
    return Device(
        "cuda",
        cupy,
        backend,
        provider=("CUDAExecutionProvider", options),
        ort_device="cuda",
        host_inputs=CUDA_HOST_INPUTS,
        threads=threads,
        new_pool=cupy.cuda.MemoryPool,
        shared_pool=cupy.cuda.MemoryPool(),
        synchronize=stream.synchronize,
    )


@functools.cache
def _process_stream():
    """One non-blocking stream for the process (cuda_device makes it CuPy's current one): every engine's work is
    ordered on it."""
    import cupy

    return cupy.cuda.Stream(non_blocking=True)


def device_for(backend: str, max_recaptures: int = 3, threads: int = 0, plans: int = 1) -> Device:
    """The Device for a RunConfig backend; CUDA gets max_recaptures + 1 graph ids per plan a slot keeps (plans: one
    per M where the Verify slot keeps a plan per M, k of them).

    threads: the sessions' intra-op threads (RunConfig.threads; 0: onnxruntime's default).
    """
    if backend == "cpu":
        return cpu_device(threads)
    if backend == "cuda":
        return cuda_device((max_recaptures + 1) * plans, threads)
    raise ValueError(f"unknown backend {backend!r}: allowed values are ['cpu', 'cuda']")
