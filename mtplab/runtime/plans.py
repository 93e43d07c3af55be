"""The capture/replay seam: what a plan backend does, and the CPU's plans (an IOBinding with every input and output
bound by raw pointer, replayed through onnxruntime's own C entry). The CUDA backend's graphs: mtplab.runtime.cuda."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from mtplab.runtime.arena import address
from mtplab.runtime.signature import Binding


class CaptureDeclined(Exception):
    """Raised by a backend that will not capture this plan; the slot runs eager instead."""


class PlanBackend(Protocol):
    """The capture/replay seam. CPU: IOBinding plans. CUDA: graphs by gpu_graph_id."""

    def eager(self, session: Any, binds: list[Binding], quiet: bool = False) -> None: ...
    def capture(self, session: Any, binds: list[Binding], owner: str) -> Any: ...
    def replay(self, session: Any, plan: Any) -> None: ...
    def bare(self, session: Any, plan: Any) -> None: ...  # a replay nothing counts (a timing floor's)
    def drop(self, plan: Any) -> None: ...


def bind_all(session, binds: list[Binding], device: str = "cpu"):
    """An IOBinding with every binding bound by its raw address: host arrays on the host, the others on `device`."""
    io = session.io_binding()
    for b in binds:
        bind = io.bind_output if b.output else io.bind_input
        where = "cpu" if isinstance(b.array, np.ndarray) else device
        bind(b.name, where, 0, b.array.dtype, list(b.array.shape), address(b.array))
    return io


def backend_calls() -> dict[str, int]:
    """A backend's own count of the runs it executed, by kind: the executor's slot counters are audited against it."""
    return {"eager": 0, "capture": 0, "replay": 0}


def direct_runner(session: Any, io: Any) -> Any:
    """A call that runs `io` on `session`: onnxruntime's own C entry where the session and binding expose it.

    The Python wrapper's run_with_iobinding checks WebGPU graph-capture bindings on every call (about
    3 us on a CPU session, where they never apply) before the same C call. A session whose
    run_with_iobinding is not onnxruntime's own (replaced on the instance, as a test's recorder, or by a
    subclass) keeps its own. Decided when the plan is captured: a recorder installed later sees no replays.
    """
    import onnxruntime as ort

    c_session, c_io = getattr(session, "_sess", None), getattr(io, "_iobinding", None)
    own = "run_with_iobinding" not in vars(session) and (
        getattr(type(session), "run_with_iobinding", None) is ort.InferenceSession.run_with_iobinding)
    if c_session is None or c_io is None or not own:
        return functools.partial(session.run_with_iobinding, io)
    return functools.partial(c_session.run_with_iobinding, c_io, None)


@functools.cache
def quiet_run_options():
    """Run options under which onnxruntime logs only a fatal error: a run whose failure is expected and handled
    (a warm-up that leaves a graph to fail where it is used) prints no error line of onnxruntime's."""
    import onnxruntime as ort

    ro = ort.RunOptions()
    ro.log_severity_level = 4
    return ro


@dataclass(frozen=True)
class CpuPlan:
    """A captured CPU plan: the IOBinding (every input and output bound by raw pointer), and its run."""

    io: Any
    run: Any


class CpuPlanBackend:
    """A plan is an IOBinding with every input and output bound by raw pointer (a CpuPlan: it and its run)."""

    def __init__(self):
        self.calls = backend_calls()

    @staticmethod
    def _binding(session, binds: list[Binding]):
        return bind_all(session, binds)

    def eager(self, session, binds: list[Binding], quiet: bool = False) -> None:
        """An eager run; quiet: onnxruntime logs nothing of its failure (the exception still says it)."""
        session.run_with_iobinding(self._binding(session, binds), quiet_run_options() if quiet else None)
        self.calls["eager"] += 1

    def capture(self, session, binds: list[Binding], owner: str = "slot") -> CpuPlan:
        io = self._binding(session, binds)
        plan = CpuPlan(io, direct_runner(session, io))
        plan.run()
        self.calls["capture"] += 1
        return plan

    def replay(self, session, plan: CpuPlan) -> None:
        plan.run()
        self.calls["replay"] += 1

    def bare(self, session, plan: CpuPlan) -> None:
        plan.run()

    def drop(self, plan) -> None:
        pass
