"""The two-slot executor: per-slot capture state, pure retarget, and per-slot counters.

Slot.PRIMARY holds the M=1 decode plan and Slot.VERIFY the M=k+1 verify plan, on ONE executor. Each slot runs:
eager warm-up -> capture -> replay while the binding signature matches. A mismatch invalidates and recaptures
(bounded by max_recaptures per generation, then eager); a binding that cannot be made (buffer too small) declines
into an eager run. A slot in `plan_per_shape` keeps such a plan per input shape (Verify, when K changes from step
to step: a plan per M), its counters summed over them. The backend is the narrow seam where a plan is captured
and replayed: IOBinding on CPU, CUDA graphs on GPU.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtplab.runtime.arena import Block, BufferTooSmall
from mtplab.runtime.plans import CaptureDeclined, CpuPlanBackend, PlanBackend
from mtplab.runtime.signature import AddressCache, Binding, ReplayCheck, describe_mismatch, signature
from mtplab.runtime.slot_memory import SlotMemory


class Slot(enum.IntEnum):
    PRIMARY = 0  # the M=1 decode graph
    VERIFY = 1  # the M=k+1 speculative-verify graph


class Status(enum.Enum):
    NEEDS_WARMUP = "needs-warmup"
    ARMED = "armed"
    READY = "ready"
    UNSUPPORTED = "unsupported"


COUNTER_KEYS = ("captures", "replays", "fallbacks", "invalidations", "hazards")
# Runs outside a plan that are no fallback: the warm-up before a capture, and eager forwards (a prefill).
# Counted for the timed-round audit (every forward a slot ran is one of these or a COUNTER_KEYS run).
ACTIVITY_KEYS = (*COUNTER_KEYS, "warmups", "eager")


def max_recaptures_problem(value) -> str | None:
    """Why a max_recaptures value is not allowed (the one rule: RunConfig's field applies it too), or None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None
    return f"max_recaptures={value!r}: must be an integer >= 0"


@dataclass
class SlotCaptureState:
    """Host-side capture bookkeeping of one slot. Never reset by a switch to another slot."""

    status: Status = Status.NEEDS_WARMUP
    signature: tuple | None = None
    plan: Any = None
    plan_blocks: list[tuple[Block, str | None]] = field(default_factory=list)
    check: ReplayCheck | None = None
    reason: str = ""
    generation_invalidations: int = 0
    spent_budget: int | None = None  # this generation: the max_recaptures its slot ran out of (None: it did not)
    plan_bytes: int = 0  # the slot buffers (staged feeds, outputs) its plan binds; the caller's state not counted
    plan_replays: int = 0  # replays of the plan it holds now (since its capture): what a timing floor replays bare
    captures: int = 0
    replays: int = 0
    fallbacks: int = 0
    invalidations: int = 0
    hazards: int = 0
    warmups: int = 0
    eager: int = 0

    def counters(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in COUNTER_KEYS}

    def activity(self) -> dict[str, int]:
        """The counters plus warm-ups and eager runs: every forward the slot ran is counted once."""
        return {k: getattr(self, k) for k in ACTIVITY_KEYS}


class Executor:
    """One executor, up to two slots, each with its own session, memory and SlotCaptureState."""

    def __init__(
        self,
        sessions: dict[Slot, Any],
        memory: dict[Slot, SlotMemory],
        labels: dict[Slot, str] | None = None,
        backend: PlanBackend | None = None,
        max_recaptures: int = 3,
        validate: bool = True,
        retain_decode_graph_across_spec: bool = True,
        plan_per_shape: frozenset[Slot] = frozenset(),
    ):
        if problem := max_recaptures_problem(max_recaptures):
            raise ValueError(problem)
        self.sessions = sessions
        self.memory = memory
        self.labels = labels or {s: s.name.lower() for s in sessions}
        self.backend = backend or CpuPlanBackend()
        self.max_recaptures = max_recaptures
        self.validate = validate
        self.retain = retain_decode_graph_across_spec
        self.state = {s: SlotCaptureState() for s in sessions}
        # a capture state per input shape where a slot keeps a plan per shape; self.state[slot]: the one it ran last
        self.shaped: dict[Slot, dict[tuple, SlotCaptureState]] = {s: {} for s in plan_per_shape if s in sessions}
        self._first = {s: self.state[s] for s in self.shaped}
        self.address = AddressCache()

    def _state_for(self, slot: Slot, feeds: dict) -> SlotCaptureState:
        """The capture state a run of these feeds uses: the slot's, or its shape's where it keeps a plan per shape."""
        shaped = self.shaped.get(slot)
        if shaped is None:
            return self.state[slot]
        key = tuple(np.shape(v) for v in feeds.values())
        if key not in shaped:
            shaped[key] = SlotCaptureState()
        st = self.state[slot] = shaped[key]
        return st

    def plan_states(self, slot: Slot) -> dict[tuple, SlotCaptureState]:
        """The capture states that hold a slot's plans, by feed shapes: one per shape where it keeps a plan per shape,
        else its one (under the key ())."""
        return dict(self.shaped[slot]) if slot in self.shaped else {(): self.state[slot]}

    def slot_states(self, slot: Slot) -> list[SlotCaptureState]:
        """Every capture state of a slot: its plans', and its first where it keeps a plan per shape (the eager runs
        before any shape ran)."""
        first = [self._first[slot]] if slot in self.shaped else []
        return first + list(self.plan_states(slot).values())

    def plans(self, slot: Slot) -> list[dict]:
        """A slot's plans: feed shapes, captures, replays and the bytes of slot buffers each binds."""
        return [{"shapes": key, "captures": st.captures, "replays": st.replays, "plan_bytes": st.plan_bytes}
                for key, st in self.plan_states(slot).items()]

    # -- retarget and lifecycle -------------------------------------------------------------
    def new_generation(self) -> None:
        """Start a generation: per-generation recapture budgets reset; counters and plans stay."""
        for st in (st for slot in self.state for st in self.slot_states(slot)):
            st.generation_invalidations, st.spent_budget = 0, None
            if st.status is Status.UNSUPPORTED:
                st.status = Status.NEEDS_WARMUP
                st.plan, st.check = None, None

    def end_step(self) -> None:
        """End of a speculative step: unpinned step-scoped workspaces go back to the pool."""
        for mem in self.memory.values():
            mem.end_step()

    def invalidate(self, slot: Slot, reason: str) -> None:
        """Throw the slot's plans away (counted); the next run recaptures, or runs eager at the cap."""
        for st in self.slot_states(slot):
            self._invalidate(st, reason)

    def _invalidate(self, st: SlotCaptureState, reason: str) -> None:
        if st.plan is None:
            return
        self.backend.drop(st.plan)
        st.plan, st.signature, st.plan_blocks, st.check = None, None, [], None
        st.invalidations += 1
        st.generation_invalidations += 1
        st.reason = f"invalidated: {reason}"
        if st.generation_invalidations > self.max_recaptures:
            st.status, st.spent_budget = Status.UNSUPPORTED, self.max_recaptures
            st.reason += f" (max_recaptures={self.max_recaptures} reached: eager for the rest of the generation)"
        else:
            st.status = Status.ARMED

    def rollback(self, slot: Slot) -> None:
        """A contents-only KV rollback happened. Without retain it throws the plan away, as the seed did."""
        if not self.retain:
            self.invalidate(slot, "KV rollback (retain_decode_graph_across_spec off)")

    # -- running ---------------------------------------------------------------------------
    def _binds(self, staged, outs, bound) -> list[Binding]:
        binds = [Binding(n, a, False) for n, a in staged.items()]
        binds += [Binding(n, a, out) for n, a, out in bound]
        binds += [Binding(n, a, True, blk) for n, (a, blk) in outs.items()]
        return binds

    def run_eager(self, slot: Slot, feeds, outputs, bound) -> dict[str, Any]:
        """An eager forward on the slot's session, outside its plan, into temporaries.

        Without retain_decode_graph_across_spec it invalidates the slot's plan (the seed's Blocker B).
        """
        if not self.retain:
            self.invalidate(slot, "eager forward on the slot's session")
        self.state[slot].eager += 1
        return self._eager_temporaries(slot, feeds, outputs, bound)

    def _eager_temporaries(self, slot, feeds, outputs, bound) -> dict[str, Any]:
        staged, outs = self.memory[slot].temporaries(feeds, outputs)
        self.backend.eager(self.sessions[slot], self._binds(staged, outs, bound))
        return {n: a for n, (a, _) in outs.items()}

    def warm_up(self, slot: Slot, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[tuple[int, ...], Any]],
                bound: list[tuple[str, Any, bool]]) -> bool:
        """The slot's warm-up (Status.NEEDS_WARMUP's run), where it is still to run, on these feeds and buffers as
        run() would run it, with onnxruntime's error log silenced; False where the graph does not run (the slot
        stays to be warmed up, and fails where it is used, loudly)."""
        st, mem = self._state_for(slot, feeds), self.memory[slot]
        if st.status is not Status.NEEDS_WARMUP:
            return True
        try:
            self.backend.eager(self.sessions[slot], self._binds(mem.stage(feeds), mem.outputs(outputs), bound),
                               quiet=True)
        except (RuntimeError, BufferTooSmall):  # onnxruntime's; a workspace run() would decline too
            return False
        finally:
            mem.end_step()
        st.warmups += 1
        st.status = Status.ARMED
        return True

    def run(
        self,
        slot: Slot,
        feeds: dict[str, np.ndarray],
        outputs: dict[str, tuple[tuple[int, ...], Any]],
        bound: list[tuple[str, Any, bool]],
    ) -> dict[str, Any]:
        """Run one forward on `slot`: warm-up, capture or replay as its state allows.

        feeds: small host inputs, staged into the slot's buffers. outputs: name -> (shape, dtype),
        placed by the slot's memory. bound: caller-owned persistent buffers (KV, recurrent state),
        as (name, array, is_output). Returns the output arrays of this run.
        """
        if slot not in self.sessions:  # each run names its slot: that is the whole retarget
            raise ValueError(f"slot {slot!r} is not configured on this executor: it has {list(self.sessions)}")
        st, mem, session = self._state_for(slot, feeds), self.memory[slot], self.sessions[slot]
        result = self._checked_replay(st, mem, session, feeds, outputs, bound)
        if result is not None:
            return dict(result)
        try:
            staged, outs = mem.stage(feeds), mem.outputs(outputs)
        except BufferTooSmall as err:
            st.fallbacks += 1
            st.reason = f"capture declined: {err}"
            return self._eager_temporaries(slot, feeds, outputs, bound)
        binds = self._binds(staged, outs, bound)
        result = {n: a for n, (a, _) in outs.items()}
        sig = signature(binds, self.address)

        if st.status is Status.UNSUPPORTED:
            self.backend.eager(session, binds)
            st.fallbacks += 1
            return result
        if st.status is Status.READY:
            if self.validate and sig != st.signature:
                self._invalidate(st, describe_mismatch(st.signature, sig))
                if st.status is Status.UNSUPPORTED:
                    self.backend.eager(session, binds)
                    st.fallbacks += 1
                    return result
            else:
                st.hazards += sum(1 for blk, owner in st.plan_blocks if blk.owner != owner)
                self.backend.replay(session, st.plan)
                st.replays += 1
                st.plan_replays += 1
                if sig == st.signature:  # new objects with the plan's signature: check those from now on
                    st.check = ReplayCheck(mem, feeds, outputs, staged, outs, bound)
                return result
        if st.status is Status.NEEDS_WARMUP:
            self.backend.eager(session, binds)
            st.warmups += 1
            st.status = Status.ARMED
            return result
        # ARMED: capture now; this run is the step's forward.
        try:
            st.plan = self.backend.capture(session, binds, self.labels[slot])
        except CaptureDeclined as err:
            st.status, st.reason = Status.UNSUPPORTED, f"capture declined: {err}"
            st.fallbacks += 1
            self.backend.eager(session, binds)
            return result
        st.signature = sig
        st.plan_blocks = [(b.block, b.block.owner) for b in binds if b.block is not None]
        st.plan_bytes = sum(int(a.nbytes) for a in (*staged.values(), *result.values()))
        st.check = ReplayCheck(mem, feeds, outputs, staged, outs, bound)
        st.captures += 1
        st.plan_replays = 0
        st.status = Status.READY
        return result

    def replayer(self, slot: Slot, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[tuple[int, ...], Any]],
                 bound: list[tuple[str, Any, bool]]) -> Callable[[], dict[str, Any]]:
        """run(slot, feeds, outputs, bound) as a call of no arguments, for a hot loop that rewrites these very
        objects' contents between runs (greedy's token and length feeds).

        Each call decides exactly as run() does (the replay check, else the full path), with less work around a
        replay. A replay returns the slot's own result dict: read it, never change it.
        """
        if slot not in self.sessions:
            raise ValueError(f"slot {slot!r} is not configured on this executor: it has {list(self.sessions)}")
        st, mem, session = self._state_for(slot, feeds), self.memory[slot], self.sessions[slot]
        checked, states = self._checked_replay, self.state if slot in self.shaped else None

        def run() -> dict[str, Any]:
            if states is not None:  # the slot's state is the plan it runs now (a plan per shape)
                states[slot] = st
            result = checked(st, mem, session, feeds, outputs, bound)
            return result if result is not None else self.run(slot, feeds, outputs, bound)

        return run

    def _checked_replay(self, st: SlotCaptureState, mem: SlotMemory, session, feeds, outputs, bound) -> dict | None:
        """The slot's plan replayed, where the run's signature is the plan's (ReplayCheck), as the full path would
        (its result dict); None: take the full path."""
        check = st.check
        if check is None or st.status is not Status.READY or not check.stage(mem, feeds, outputs, bound):
            return None
        for blk, owner in st.plan_blocks:
            if blk.owner != owner:
                st.hazards += 1
        self.backend.replay(session, st.plan)
        st.replays += 1
        st.plan_replays += 1
        return check.result

    # -- timing floors ----------------------------------------------------------------------
    def plan_runs(self) -> dict[tuple, tuple[Any, int, int]]:
        """Every capture state by (slot, feed shapes): (the plan it holds or None, its replays since its capture, the
        forwards it ran otherwise so far: captures, warm-ups, fallbacks). A timing floor reads the change."""
        return {(slot, key): (st.plan, st.plan_replays, st.captures + st.warmups + st.fallbacks)
                for slot in self.sessions for key, st in self.plan_states(slot).items()}

    def replay_bare(self, slot: Slot, key: tuple, reps: int) -> bool:
        """Replay a held plan (see plan_runs) `reps` times with nothing around it, its last feeds staged again first
        (a slot sharing its buffers may have staged others since): no counter, no backend count. A timing floor's;
        the state it runs on is left for the next generation's reset. False where the plan's buffers are no longer
        its own (a pooled workspace given back): nothing ran."""
        st, mem = self.plan_states(slot)[key], self.memory[slot]
        check = st.check
        if check is None or not check.stage(mem, check.feeds, check.out_spec, check.bound):
            return False
        for _ in range(reps):
            self.backend.bare(self.sessions[slot], st.plan)
        return True

    # -- reporting -------------------------------------------------------------------------
    def counters(self) -> dict[str, dict[str, int]]:
        """{slot label: {captures, replays, fallbacks, invalidations, hazards}}."""
        return {self.labels[s]: self._summed(s, COUNTER_KEYS) for s in self.state}

    def activity(self) -> dict[str, dict[str, int]]:
        """{slot label: counters plus warm-ups and eager runs}: what the timed-round audit compares."""
        return {self.labels[s]: self._summed(s, ACTIVITY_KEYS) for s in self.state}

    def _summed(self, slot: Slot, keys: tuple[str, ...]) -> dict[str, int]:
        return {k: sum(getattr(st, k) for st in self.slot_states(slot)) for k in keys}  # over the slot's plans

    def format_counters(self) -> str:
        """The seed's form: `primary: captures=1 replays=127 fallbacks=0 invalidations=0 hazards=0`."""
        return "\n".join(
            f"{label}: " + " ".join(f"{k}={v}" for k, v in c.items()) for label, c in self.counters().items()
        )
