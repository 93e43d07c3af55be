"""CUDA backend: ONNX Runtime's CUDA EP with one CUDA graph per slot, CuPy arenas, one stream.

What the CUDA EP does with graphs (and what this module does about it):
- `enable_cuda_graph=1`; the run config entry `gpu_graph_id` picks the graph (-1 runs eager, 0 is
  reserved, so ids start at 1). An id is captured once and kept for the session's life: there is no
  re-capture, so an invalidation takes a fresh id (GraphIds), bounded per slot, and its memory is accounted.
- The first run of a new id executes the model three times on the same inputs (two warm-ups,
  then capture and one replay): state updated in place would advance three times. capture()
  snapshots every in-place binding before and restores it after, then replays once: the step's
  one real forward.
- Replay validates nothing: a changed binding silently replays stale pointers. The executor's
  signature check (mtplab.runtime.executor) is what keeps replay safe, on this backend as on the CPU.
- CPU-side inputs are not re-read by a replay: every input is bound in device memory, except
  GroupQueryAttention's total_sequence_length (an op input kept in host memory), which the model
  keeps constant (the KV capacity), so the value a graph bakes is always the right one.
- Capture synchronises the stream (CaptureBegin): each capture is one more host wait, on the steps
  that capture (a slot's first plan, or a fresh id after an invalidation).

Stream order: one CuPy stream is made current for the process and handed to every session as
`user_compute_stream`; runs carry `disable_synchronize_execution_providers=1`, so a run returns
once its work is queued. CuPy's work (staging feeds, snapshots, select's state replay; the greedy choice is the
graphs' own) and ORT's runs are therefore ordered by that single stream, in program order; the
host waits when it reads the step's accepted count and tokens (Device.read), and when a run
captures a graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mtplab.runtime.plans import CaptureDeclined, backend_calls, bind_all
from mtplab.runtime.signature import Binding

# Run config entries of every run on this backend: a run returns once its work is queued.
NO_SYNC = "disable_synchronize_execution_providers"
RUN_CONFIG = {NO_SYNC: "1"}


def expected_host_waits(steps: int, captures: int) -> int:
    """Host waits of a run: the step's one read per speculative step and one stream sync per capture."""
    return steps + captures


@dataclass
class GraphIds:
    """Graph ids of one device's sessions: from 1 (0 is reserved), never reused, at most `per_slot` per slot (for
    the sessions' life), memory accounted."""

    per_slot: int
    next_id: int = 1
    by_slot: dict[str, list[int]] = field(default_factory=dict)
    retired: set[int] = field(default_factory=set)
    bytes_by_id: dict[int, int] = field(default_factory=dict)

    def allocate(self, slot: str) -> int:
        ids = self.by_slot.setdefault(slot, [])
        if len(ids) >= self.per_slot:
            raise CaptureDeclined(
                f"{slot}: {len(ids)} CUDA graph ids used (limit {self.per_slot}; an id cannot be captured again)"
            )
        gid = self.next_id
        self.next_id += 1
        ids.append(gid)
        return gid

    def retire(self, gid: int) -> None:
        """The graph is no longer replayed; its memory stays until the session ends."""
        self.retired.add(gid)

    def account(self, gid: int, nbytes: int) -> None:
        self.bytes_by_id[gid] = max(0, int(nbytes))

    @property
    def captures(self) -> int:
        """Ids handed out, each captured once: one stream synchronisation each."""
        return self.next_id - 1

    def stats(self) -> dict:
        return {
            "graphs": self.captures,
            "retired": len(self.retired),
            "graph_bytes": sum(self.bytes_by_id.values()),
            "retired_bytes": sum(self.bytes_by_id.get(g, 0) for g in self.retired),
        }


@dataclass
class CudaPlan:
    io: Any
    gid: int
    run_options: Any


def in_place_arrays(binds: list[Binding], addr) -> list[Any]:
    """Arrays bound both as an input and as an output (updated in place by a run)."""
    inputs = {addr(b.array) for b in binds if not b.output}
    return [b.array for b in binds if b.output and addr(b.array) in inputs]


class CudaGraphBackend:
    """The executor's plan seam on the CUDA EP: capture = a fresh gpu_graph_id, replay = run with it."""

    def __init__(self, ids: GraphIds, run_options_factory, device_type: str = "cuda", mem_free=None):
        self.ids = ids
        self.run_options = run_options_factory
        self.device_type = device_type
        self.mem_free = mem_free or (lambda: 0)
        self.calls = backend_calls()

    def _binding(self, session, binds: list[Binding]):
        return bind_all(session, binds, self.device_type)  # host inputs stay host

    def _options(self, gid: int):
        ro = self.run_options()
        for key, value in RUN_CONFIG.items():
            ro.add_run_config_entry(key, value)
        ro.add_run_config_entry("gpu_graph_id", str(gid))
        return ro

    def eager(self, session, binds: list[Binding], quiet: bool = False) -> None:
        options = self._options(-1)
        if quiet:  # onnxruntime logs nothing of its failure (the exception still says it)
            options.log_severity_level = 4
        session.run_with_iobinding(self._binding(session, binds), options)
        self.calls["eager"] += 1

    def capture(self, session, binds: list[Binding], owner: str = "slot") -> CudaPlan:
        from mtplab.runtime.arena import address

        gid = self.ids.allocate(owner)
        io, ro = self._binding(session, binds), self._options(gid)
        live = in_place_arrays(binds, address)
        saved = [a.copy() for a in live]
        free_before = self.mem_free()
        try:
            session.run_with_iobinding(io, ro)  # warm-up x2, capture, replay: in-place state advanced 3x
            for a, s in zip(live, saved):
                a[...] = s
            session.run_with_iobinding(io, ro)  # one replay: this step's forward
        except RuntimeError as err:  # onnxruntime's run error: an op it cannot capture, memory taken mid-capture
            for a, s in zip(live, saved):  # the state as before this forward, which the slot then runs eager
                a[...] = s
            self.ids.retire(gid)
            raise CaptureDeclined(f"onnxruntime did not capture graph {gid}: {' '.join(str(err).split())}") from err
        self.ids.account(gid, free_before - self.mem_free())
        self.calls["capture"] += 1
        return CudaPlan(io, gid, ro)

    def replay(self, session, plan: CudaPlan) -> None:
        session.run_with_iobinding(plan.io, plan.run_options)
        self.calls["replay"] += 1

    def bare(self, session, plan: CudaPlan) -> None:
        session.run_with_iobinding(plan.io, plan.run_options)

    def drop(self, plan: CudaPlan) -> None:
        self.ids.retire(plan.gid)


# select's state replay as one CUDA kernel per layer: each thread owns one state element and
# applies the first n transitions in order, with the multiplies and the add rounded separately
# (no FMA contraction), as numpy's token-by-token form does (`S *= decay; S += delta*key`,
# mtplab.model.graph.replay_transitions_xp).
REPLAY_KERNEL = r"""
const int dk = i % Dk;
const int dv = (i / Dk) % Dv;
const int h = i / (Dk * Dv);
const int hk = h / (Hv / Hk);
float acc = s;
for (int t = 0; t < n; ++t) {
    acc = __fadd_rn(__fmul_rn(acc, decay[t * Hv + h]),
                    __fmul_rn(delta[(t * Hv + h) * Dv + dv], key[(t * Hk + hk) * Dk + dk]));
}
s = acc;
"""


class DeviceReplay:
    """select's GatedDeltaNet replay on the device: one elementwise kernel launch per layer."""

    def __init__(self, layout):
        import cupy

        self.layout = layout
        self.kernel = cupy.ElementwiseKernel(
            "raw float32 decay, raw float32 key, raw float32 delta, int32 n, int32 Hv, int32 Hk, int32 Dv, int32 Dk",
            "float32 s",
            REPLAY_KERNEL,
            "mtplab_gdn_replay",
        )

    def __call__(self, state, flat, n: int) -> None:
        """Advance state [1, Hv, Dv, Dk] in place by the first n transitions of `flat`."""
        t = self.layout
        decay, key, delta = (a.ravel() for a in t.split(flat))
        self.kernel(decay, key, delta, n, t.value_heads, t.key_heads, t.value_dim, t.key_dim, state)
