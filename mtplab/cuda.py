"""CUDA backend: ONNX Runtime's CUDA EP with one CUDA graph per slot, CuPy arenas, one stream.

What the CUDA EP does with graphs (and what this module does about it):
- `enable_cuda_graph=1`; the run config entry `gpu_graph_id` picks the graph (-1 runs eager).
  An id is captured once and kept for the session's life: there is no re-capture, so an
  invalidation takes a fresh id (GraphIds), bounded per slot, and its memory is accounted.
- The first run of a new id executes the model three times on the same inputs (two warm-ups,
  then capture and one replay): state updated in place would advance three times. capture()
  snapshots every in-place binding before and restores it after, then replays once: the step's
  one real forward.
- Replay validates nothing: a changed binding silently replays stale pointers. The executor's
  signature check (mtplab.executor) is what keeps replay safe, on this backend as on the CPU.
- CPU-side inputs are not re-read by a replay: every input is bound in device memory, except
  GroupQueryAttention's total_sequence_length, which the model keeps constant (the KV capacity).

Stream order: ORT runs on `user_compute_stream`, the stream CuPy work (staging, snapshots,
select's state replay, argmax and acceptance) is issued on. Everything of one step is ordered by
that single stream; the host waits only when it reads the accepted count (STEP_PLAN).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .commit import replay_transitions_xp  # noqa: F401 - select's state replay runs on the device as is
from .executor import Binding, CaptureDeclined

# The order of one speculative step on the device. Every device op runs on the one stream; the
# host waits for the stream only where `host_wait` is True.
STEP_PLAN: tuple[tuple[str, str, bool], ...] = (
    ("stage decode inputs", "cupy", False),
    ("decode (Primary graph replay)", "ort", False),
    ("draft: k head replays, argmax on device feeding the next", "ort+cupy", False),
    ("snapshot recurrent state (readvance) ", "cupy", False),
    ("verify (Verify graph replay)", "ort", False),
    ("argmax + accepted count on device", "cupy", False),
    ("read the accepted count", "host", True),
    ("commit: select replay / restore + re-advance", "cupy+ort", False),
)


def host_waits(plan=STEP_PLAN) -> list[str]:
    """The steps at which the host waits for the device: one per speculative step."""
    return [name for name, _, wait in plan if wait]


@dataclass
class GraphIds:
    """Graph ids of one session: never reused, at most `per_slot` per slot, memory accounted."""

    per_slot: int
    next_id: int = 0
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

    def stats(self) -> dict:
        return {
            "graphs": self.next_id,
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

    def __init__(self, ids: GraphIds, run_options_factory, device_type: str = "cuda", mem_free=None, xp=None):
        self.ids = ids
        self.run_options = run_options_factory
        self.device_type = device_type
        self.mem_free = mem_free or (lambda: 0)
        self.xp = xp

    def _binding(self, session, binds: list[Binding]):
        from .arena import address

        io = session.io_binding()
        for b in binds:
            bind = io.bind_output if b.output else io.bind_input
            bind(b.name, self.device_type, 0, b.array.dtype, list(b.array.shape), address(b.array))
        return io

    def _options(self, gid: int):
        ro = self.run_options()
        ro.add_run_config_entry("gpu_graph_id", str(gid))
        return ro

    def eager(self, session, binds: list[Binding]) -> None:
        session.run_with_iobinding(self._binding(session, binds), self._options(-1))

    def capture(self, session, binds: list[Binding], owner: str = "slot") -> CudaPlan:
        from .arena import address

        gid = self.ids.allocate(owner)
        io, ro = self._binding(session, binds), self._options(gid)
        live = in_place_arrays(binds, address)
        saved = [a.copy() for a in live]
        free_before = self.mem_free()
        session.run_with_iobinding(io, ro)  # warm-up x2, capture, replay: in-place state advanced 3x
        for a, s in zip(live, saved):
            a[...] = s
        session.run_with_iobinding(io, ro)  # one replay: this step's forward
        self.ids.account(gid, free_before - self.mem_free())
        return CudaPlan(io, gid, ro)

    def replay(self, session, plan: CudaPlan) -> None:
        session.run_with_iobinding(plan.io, plan.run_options)

    def drop(self, plan: CudaPlan) -> None:
        self.ids.retire(plan.gid)


def cuda_session(path, stream_ptr: int, shared: dict | None = None, threads: int | None = None):
    """An InferenceSession on the CUDA EP with graphs enabled, running on the caller's stream."""
    from .runtime import make_session

    options = {"enable_cuda_graph": "1", "user_compute_stream": str(stream_ptr)}
    return make_session(path, shared, threads, provider=("CUDAExecutionProvider", options))


def accepted_count(xp, drafts, targets) -> Any:
    """Longest prefix where drafts[i] == targets[i], computed on the device (xp = cupy or numpy).

    Returns a 0-d device array: reading it (int()) is the step's one host round trip.
    """
    k = drafts.shape[0]
    match = (drafts == targets[:k]).astype(xp.int32)
    return xp.cumprod(match).sum()
