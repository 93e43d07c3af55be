"""What one run executed, read from what the engine counts anyway: forwards by label and M, each slot's captures,
replays, fallbacks, invalidations, warm-ups and eager runs (held to the plan backend's own count of the runs it
executed), its tokens and accepted counts. The audit (mtplab.check.audit) holds timed runs to the checked one."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtplab.runtime.executor import ACTIVITY_KEYS, COUNTER_KEYS, Slot, Status

RUN_KEYS = ("warmups", "captures", "replays", "fallbacks", "eager")  # every forward a slot runs is one of these


def activity(engine) -> dict[str, dict[str, int]]:
    return engine.target.activity() | engine.mtp.activity()


def runs(c: dict) -> int:
    return sum(c.get(k, 0) for k in RUN_KEYS)


@dataclass
class Trace:
    """What one run executed: forward counts, slot activity and the backend's own run counts (deltas),
    the slots' states when it began, its tokens and accepted counts."""

    forwards_before: dict
    activity_before: dict
    calls_before: dict
    ready_before: dict  # slot label -> whether it held a plan ready to replay when the run began
    primary_tokens_before: int | None = None  # the token count M of the Primary plan held when the run began
    plans_before: dict = field(default_factory=dict)  # slot label -> (capture states, of them ready) at the start
    plans_after: dict = field(default_factory=dict)  # slot label -> capture states at the end (one per shape used)
    forwards: dict = field(default_factory=dict)
    activity: dict = field(default_factory=dict)
    calls: dict = field(default_factory=dict)
    tokens: list[list[int]] = field(default_factory=list)  # per row
    accepted: list[list[int]] | None = None  # per row, each step's accepted drafts
    ks: list[list[int]] | None = None  # per row, the drafts each step made (a draft-length policy's K_t)
    validated: bool = True  # the executors check every replay's signature (a hazard is then a bug)

    @classmethod
    def begin(cls, engine) -> Trace:
        plans = plan_counts(engine)
        ready = {label: n_ready > 0 for label, (_, n_ready) in plans.items()}
        return cls(dict(engine.forwards), activity(engine), dict(engine.device.backend.calls), ready,
                   plan_tokens(engine.target.state[Slot.PRIMARY], engine.primary_desc.target.input_ids),
                   plans_before=plans, validated=engine.target.validate and engine.mtp.validate)

    def end(self, engine, tokens: list[list[int]], accepted: list[list[int]] | None = None,
            ks: list[list[int]] | None = None) -> Trace:
        """The run is over: its deltas, and its tokens, accepted counts and drafts per row."""
        before = self.forwards_before
        self.forwards = {k: d for k, v in engine.forwards.items() if (d := v - before.get(k, 0))}
        self.activity = {
            slot: {k: v - self.activity_before.get(slot, {}).get(k, 0) for k, v in c.items()}
            for slot, c in activity(engine).items()
        }
        self.calls = {k: v - self.calls_before.get(k, 0) for k, v in engine.device.backend.calls.items()}
        self.tokens = [list(t) for t in tokens]
        self.accepted = None if accepted is None else [list(a) for a in accepted]
        self.ks = None if ks is None else [list(k) for k in ks]
        self.plans_after = {label: n for label, (n, _) in plan_counts(engine).items()}
        return self

    def honesty_problems(self) -> list[str]:
        """Where the slots' counters disagree with what the backend ran, or a slot captured without a cause."""
        out = []
        total = {k: sum(c.get(k, 0) for c in self.activity.values()) for k in ACTIVITY_KEYS}
        ran = {"replay": total["replays"], "capture": total["captures"], "eager": off_plan(total)}
        if ran != self.calls:
            out.append(f"the backend ran {self.calls}, the slots counted {ran}")
        counted = forwards_by_slot(self.forwards)
        for slot, c in self.activity.items():
            if runs(c) != counted.get(slot, 0):
                out.append(f"the {slot} slot ran {runs(c)} forwards, the engine counted {counted.get(slot, 0)} on it")
        for slot, c in self.activity.items():
            # a capture replaces an invalidated plan, or makes a plan the slot did not hold ready at the start (one
            # per shape where the slot keeps a plan per shape)
            states, ready = self.plans_before.get(slot, (1, int(bool(self.ready_before.get(slot)))))
            fresh = self.plans_after.get(slot, states) - ready
            if c.get("captures", 0) > c.get("invalidations", 0) + fresh:
                out.append(f"the {slot} slot captured {c['captures']} plans with {c.get('invalidations', 0)} "
                           f"invalidations and {fresh} plan{'s' if fresh != 1 else ''} not ready at its start")
            if self.validated and c.get("hazards", 0):
                out.append(f"the {slot} slot replayed a plan into memory another owner held {c['hazards']} times "
                           "(hazards) with the signature check on: replays the check should have refused")
        return out

    def counters(self) -> dict[str, dict[str, int]]:
        """The slot counters in the seed's form (what a RunResult's `slots` holds)."""
        return {slot: {k: c[k] for k in COUNTER_KEYS} for slot, c in self.activity.items()}

    def counters_before(self) -> dict[str, dict[str, int]]:
        return {slot: {k: c[k] for k in COUNTER_KEYS} for slot, c in self.activity_before.items()}




def forwards_by_slot(forwards: dict) -> dict[str, int]:
    """Forward counts ("label/M=m") summed by the slot that ran them (a prefill runs on the primary slot)."""
    out: dict[str, int] = {}
    for key, count in forwards.items():
        label = key.split("/M=")[0]
        label = "primary" if label == "prefill" else label
        out[label] = out.get(label, 0) + count
    return out


def off_plan(c: dict) -> int:
    """Forwards a slot ran outside a plan: warm-ups, fallbacks and eager runs."""
    return c.get("warmups", 0) + c.get("fallbacks", 0) + c.get("eager", 0)


def plan_tokens(st, input_ids: str) -> int | None:
    """The token count M a slot's held plan was captured for (None: it holds none)."""
    if st.status is not Status.READY or st.signature is None:
        return None
    return next((int(shape[-1]) for name, way, _, shape, _ in st.signature if name == input_ids and way == "in"), None)


def slot_states(engine):
    """(label, SlotCaptureState) of every capture state of the engine's two executors (a slot with a plan per shape
    gives its own state and one per shape)."""
    for ex in (engine.target, engine.mtp):
        for slot in ex.state:
            for st in ex.slot_states(slot):
                yield ex.labels[slot], st


def plan_counts(engine) -> dict[str, tuple[int, int]]:
    """{slot label: (the capture states that hold its plans, how many of them are ready)}: one state per slot, or one
    per shape where the slot keeps a plan per shape (its own state then holds no plan)."""
    out = {}
    for ex in (engine.target, engine.mtp):
        for slot in ex.state:
            states = ex.plan_states(slot).values()
            out[ex.labels[slot]] = (len(states), sum(st.status is Status.READY for st in states))
    return out


def plans_held(engine) -> dict[str, list[dict]]:
    """{slot label: its plans}: the tokens M each was captured for (None: none held now), its captures and replays,
    and the bytes of slot buffers it binds (a slot with a plan per M, Verify under a draft-length policy, lists one
    per M used: the memory that per-M plans cost)."""
    out = {}
    for ex, io in ((engine.target, engine.desc.target), (engine.mtp, engine.desc.mtp)):
        for slot in ex.state:
            out[ex.labels[slot]] = [{"tokens": plan_tokens(st, io.input_ids), "captures": st.captures,
                                     "replays": st.replays, "plan_bytes": st.plan_bytes}
                                    for st in ex.plan_states(slot).values()]
    return out
