"""The two-slot executor: capture protocol, signature checks, pure retarget, and the arena policies."""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest

from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.model.description import length_feeds
from mtplab.runtime.arena import Arena
from mtplab.runtime.executor import COUNTER_KEYS, Executor, Slot, Status
from mtplab.runtime.policy import policy
from mtplab.runtime.sessions import graph_session
from mtplab.runtime.slot_memory import SlotMemory
from mtplab.runtime.state import TargetState, target_io


@pytest.fixture
def setup(tiny):
    cfg = tiny.config
    session = graph_session(tiny.description.target)
    state = TargetState.allocate(tiny.description, Arena("main"))
    arena = Arena("shared")
    ex = Executor(
        {Slot.PRIMARY: session, Slot.VERIFY: session}, {Slot.PRIMARY: SlotMemory(arena), Slot.VERIFY: SlotMemory(arena)}
    )
    return cfg, state, ex


def _call(ex, cfg, state, slot, tokens, **kw):
    feeds, outputs, bound = target_io(state.desc, state, np.asarray(tokens, dtype=np.int64))
    out = ex.run(slot, feeds, outputs, bound, **kw)
    state.carry()
    return out


def test_warmup_then_capture_then_replay(setup):
    cfg, state, ex = setup
    st = ex.state[Slot.PRIMARY]
    _call(ex, cfg, state, Slot.PRIMARY, [1])
    assert st.status is Status.ARMED and st.captures == 0
    _call(ex, cfg, state, Slot.PRIMARY, [2])
    assert st.status is Status.READY and st.captures == 1
    for t in range(3):
        _call(ex, cfg, state, Slot.PRIMARY, [3 + t])
    assert st.counters() == {"captures": 1, "replays": 3, "fallbacks": 0, "invalidations": 0, "hazards": 0}


def test_a_warm_up_ahead_of_use_arms_the_slot_once_so_its_first_run_captures(setup):
    cfg, state, ex = setup
    st = ex.state[Slot.PRIMARY]
    feeds, outputs, bound = target_io(state.desc, state, np.array([1]))
    assert ex.warm_up(Slot.PRIMARY, feeds, outputs, bound) and ex.warm_up(Slot.PRIMARY, feeds, outputs, bound)
    assert (st.status, st.warmups, ex.backend.calls["eager"]) == (Status.ARMED, 1, 1)  # the second: nothing to do
    _call(ex, cfg, state, Slot.PRIMARY, [2])
    assert st.status is Status.READY and st.captures == 1


def test_replay_equals_eager_bit_for_bit(tiny, setup):
    cfg, state, ex = setup
    for t in (1, 2, 3):
        _call(ex, cfg, state, Slot.PRIMARY, [t])  # warm-up, capture, replay
    snapshot = {n: a.copy() for n, a in state.recurrent().items()}
    kv = {i: (k.copy(), v.copy()) for i, (k, v) in state.kv.items()}
    replayed = {n: a.copy() for n, a in _call(ex, cfg, state, Slot.PRIMARY, [9]).items()}
    assert ex.state[Slot.PRIMARY].replays == 2
    for n, a in state.recurrent().items():
        a[...] = snapshot[n]
    for i, (k, v) in state.kv.items():
        k[...], v[...] = kv[i]
    feeds, outputs, bound = target_io(state.desc, state, np.array([9]))
    eager = ex._eager_temporaries(Slot.PRIMARY, feeds, outputs, bound)
    for name in ("logits", "hidden"):
        np.testing.assert_array_equal(replayed[name], eager[name])


def test_pure_retarget_keeps_primary_state(setup):
    cfg, state, ex = setup
    for t in (1, 2, 3):
        _call(ex, cfg, state, Slot.PRIMARY, [t])
    before = copy.copy(ex.state[Slot.PRIMARY])
    _call(ex, cfg, state, Slot.VERIFY, [4, 5, 6])  # a run names its slot: that is the retarget
    _call(ex, cfg, state, Slot.VERIFY, [4, 5, 6])
    after = ex.state[Slot.PRIMARY]
    assert after.signature == before.signature and after.plan is before.plan
    assert after.counters() == before.counters() and after.status is Status.READY
    _call(ex, cfg, state, Slot.PRIMARY, [7])
    assert after.replays == before.replays + 1 and after.invalidations == 0


def test_a_moved_buffer_is_detected_before_replay(setup):
    cfg, state, ex = setup
    for t in (1, 2):
        _call(ex, cfg, state, Slot.PRIMARY, [t])
    i = cfg.gdn_layer_ids[0]
    state.gdn[i] = state.gdn[i].copy()  # same contents, new address
    _call(ex, cfg, state, Slot.PRIMARY, [3])
    st = ex.state[Slot.PRIMARY]
    assert st.invalidations == 1 and st.replays == 0 and st.captures == 2
    assert f"gdn_state.{i}: address moved" in st.reason


def test_a_changed_shape_is_detected_before_replay(setup):
    cfg, state, ex = setup
    big = Arena("big")
    ex.memory[Slot.PRIMARY] = SlotMemory(big)
    feeds, outputs, _ = target_io(state.desc, state, np.zeros(2, dtype=np.int64))
    for n, v in feeds.items():
        big.reserve(f"feed.{n}", v.shape, v.dtype)
    for n, (s, d) in outputs.items():
        big.reserve(n, s, d)
    for t in (1, 2):
        _call(ex, cfg, state, Slot.PRIMARY, [t])
    _call(ex, cfg, state, Slot.PRIMARY, [3, 4])
    assert ex.state[Slot.PRIMARY].invalidations == 1
    assert "input_ids: shape [1, 1] -> [1, 2]" in ex.state[Slot.PRIMARY].reason


def test_capture_declines_when_a_buffer_is_too_small(setup):
    cfg, state, ex = setup
    _call(ex, cfg, state, Slot.PRIMARY, [1])  # sizes the shared buffers at M=1
    out = _call(ex, cfg, state, Slot.VERIFY, [2, 3, 4])
    st = ex.state[Slot.VERIFY]
    assert out["logits"].shape == (1, 3, cfg.vocab_size)
    assert st.fallbacks == 1 and st.captures == 0 and "capture declined" in st.reason and "[1, 3]" in st.reason


def test_after_max_recaptures_the_slot_runs_eager_for_the_generation(setup):
    cfg, state, ex = setup
    ex.max_recaptures = 2
    i = cfg.gdn_layer_ids[0]
    for t in range(8):
        state.gdn[i] = state.gdn[i].copy()  # a new address every run
        _call(ex, cfg, state, Slot.PRIMARY, [t])
    st = ex.state[Slot.PRIMARY]
    assert st.invalidations == 3 and st.status is Status.UNSUPPORTED and st.fallbacks == 4
    assert "max_recaptures=2" in st.reason
    ex.new_generation()
    assert st.status is Status.NEEDS_WARMUP


def test_rollback_invalidates_only_without_retain(setup):
    cfg, state, ex = setup
    for t in (1, 2):
        _call(ex, cfg, state, Slot.PRIMARY, [t])
    ex.rollback(Slot.PRIMARY)
    assert ex.state[Slot.PRIMARY].invalidations == 0
    ex.retain = False
    ex.rollback(Slot.PRIMARY)
    assert ex.state[Slot.PRIMARY].invalidations == 1 and "KV rollback" in ex.state[Slot.PRIMARY].reason


def test_counters_print_in_the_seed_form(setup):
    cfg, state, ex = setup
    assert ex.format_counters().splitlines()[0] == "primary: captures=0 replays=0 fallbacks=0 invalidations=0 hazards=0"
    assert set(ex.counters()) == {"primary", "verify"}
    assert all(tuple(c) == COUNTER_KEYS for c in ex.counters().values())


def test_unknown_policy_is_rejected_with_the_valid_names():
    with pytest.raises(
        ValueError, match=r"unknown arena policy 'tiled'.*'shared-jit', 'shared-max', 'sibling', 'sibling-pinned'"
    ):
        policy("tiled")


# -- the policy table, on the engine (k=3, tiny) ------------------------------------------------


def _point(tiny, policy_name, **kw):
    run = RunConfig(
        model="tiny", k=3, drafter="oracle", alpha=0.7, policy=policy_name, commit="select", tokens=64, **kw
    )
    return run_point(run, tiny)


def test_shared_jit_verify_declines_every_step_and_stays_correct(tiny):
    r = _point(tiny, "shared-jit")
    assert r.slots["verify"]["replays"] == 0 and r.slots["verify"]["captures"] == 0
    assert r.slots["verify"]["fallbacks"] == r.steps
    assert "[1, 4]" in r.slot_reasons["verify"] and "[1, 1]" in r.slot_reasons["verify"]
    assert r.lossless


def test_shared_max_both_slots_replay_from_one_set_of_buffers(tiny):
    r = _point(tiny, "shared-max")
    assert (
        r.slots["primary"]["replays"] > 0 and r.slots["verify"]["replays"] == r.steps - 2
    )  # warm-up, capture, then replays
    assert r.slots["primary"]["fallbacks"] == r.slots["verify"]["fallbacks"] == 0
    eng = Engine(RunConfig(model="tiny", policy="shared-max"), tiny)
    assert eng.target.memory[Slot.PRIMARY].arena is eng.target.memory[Slot.VERIFY].arena
    assert r.lossless


def test_sibling_unpinned_with_validation_invalidates_then_falls_back(tiny):
    r = _point(tiny, "sibling")
    v = r.slots["verify"]
    assert v["invalidations"] == 4 and v["captures"] == 4 and v["fallbacks"] == r.steps - 5 and v["hazards"] == 0
    assert "address moved" in r.slot_reasons["verify"] and r.lossless


def test_sibling_unpinned_without_validation_corrupts_and_is_caught(tiny):
    r = _point(tiny, "sibling", validate=False)
    assert r.slots["verify"]["hazards"] > 0
    assert not r.lossless and r.identity["first_divergence"] is not None
    assert "LOSSLESS CHECK FAILED" in r.verdict


def test_sibling_pinned_both_slots_replay_without_fallbacks(tiny):
    r = _point(tiny, "sibling-pinned")
    assert r.slots["verify"]["replays"] == r.steps - 2  # warm-up, capture, then replays
    for slot in ("primary", "verify"):
        assert r.slots[slot]["fallbacks"] == 0 and r.slots[slot]["invalidations"] == 0
    assert r.lossless


def test_without_retain_every_rollback_costs_the_primary_plan(tiny):
    r = _point(tiny, "sibling-pinned", retain_decode_graph_across_spec=False)
    p = r.slots["primary"]
    assert p["invalidations"] >= 1 and p["fallbacks"] > 0 and r.lossless


# -- the replay check: the same decisions as the full signature, every run ----------------------


def test_replays_take_the_replay_check_and_a_buffer_moved_after_replays_is_still_caught(setup):
    cfg, state, ex = setup
    for t in range(5):
        _call(ex, cfg, state, Slot.PRIMARY, [t])
    st = ex.state[Slot.PRIMARY]
    assert st.replays == 3 and st.check is not None  # replays in this generation went through the check
    i = cfg.gdn_layer_ids[-1]
    state.gdn[i] = state.gdn[i].copy()  # same generation, new address
    _call(ex, cfg, state, Slot.PRIMARY, [7])
    assert st.invalidations == 1 and st.replays == 3 and st.captures == 2
    assert f"gdn_state.{i}: address moved" in st.reason


def test_a_bound_array_reshaped_in_place_is_caught_though_it_is_the_same_object(setup):
    cfg, state, ex = setup
    for t in range(4):
        _call(ex, cfg, state, Slot.PRIMARY, [t])
    st = ex.state[Slot.PRIMARY]
    i = cfg.gdn_layer_ids[0]
    feeds, outputs, bound = target_io(state.desc, state, np.array([5]))
    shape = state.gdn[i].shape
    state.gdn[i].shape = shape[1:]  # the very object the plan holds, now of another shape
    assert not st.check.stage(ex.memory[Slot.PRIMARY], feeds, outputs, bound)
    state.gdn[i].shape = shape
    assert st.check.stage(ex.memory[Slot.PRIMARY], feeds, outputs, bound)


def test_an_output_reshaped_in_place_by_the_caller_is_caught(setup):
    cfg, state, ex = setup
    for t in range(3):
        out = _call(ex, cfg, state, Slot.PRIMARY, [t])
    st, mem = ex.state[Slot.PRIMARY], ex.memory[Slot.PRIMARY]
    feeds, outputs, bound = target_io(state.desc, state, np.array([4]))
    assert st.check.stage(mem, feeds, outputs, bound)
    shape = out["hidden"].shape
    out["hidden"].shape = (out["hidden"].size,)  # the slot's own output buffer, reshaped by the caller
    assert not st.check.stage(mem, feeds, outputs, bound)
    out["hidden"].shape = shape
    assert st.check.stage(mem, feeds, outputs, bound)


def test_a_new_array_object_at_the_same_address_replays_as_before(setup):
    cfg, state, ex = setup
    for t in range(3):
        _call(ex, cfg, state, Slot.PRIMARY, [t])
    st = ex.state[Slot.PRIMARY]
    i = cfg.gdn_layer_ids[0]
    state.gdn[i] = state.gdn[i][...]  # another view object, same memory, shape and dtype: the same signature
    _call(ex, cfg, state, Slot.PRIMARY, [4])
    _call(ex, cfg, state, Slot.PRIMARY, [5])
    assert st.replays == 3 and st.invalidations == 0
    assert any(a is state.gdn[i] for a in st.check.bound_arrays)  # the check now holds the new object


class NullSession:
    """Test double for a session: binds and runs nothing, so any binding (any shape or dtype) is accepted."""

    def io_binding(self):
        return self

    def bind_input(self, *args):
        pass

    bind_output = bind_input

    def run_with_iobinding(self, io, run_options=None):
        pass


def test_the_replay_check_decides_exactly_as_the_full_signature(tiny):
    """Three executors take the same runs and the same disturbances: one always builds the full signature, one runs
    through run(), one through a replayer made on the feeds target_io keeps (made again when it makes new ones)."""
    cfg = tiny.config
    state = TargetState.allocate(tiny.description, Arena("main"))
    executors = []
    for _ in range(3):
        arena = Arena("slot")
        ex = Executor({Slot.PRIMARY: NullSession()}, {Slot.PRIMARY: SlotMemory(arena)}, max_recaptures=20)
        feeds, outputs, _ = target_io(state.desc, state, np.zeros(2, dtype=np.int64))
        for n, v in feeds.items():
            arena.reserve(f"feed.{n}", v.shape, v.dtype)
        for n, (s, d) in outputs.items():
            arena.reserve(n, s, d)
        executors.append(ex)
    full, checked, replayed = executors
    replayers: dict[int, tuple] = {}  # by M: (feeds, outputs, bound, replayer)
    i, j = cfg.gdn_layer_ids[0], cfg.gdn_layer_ids[-1]
    k, _ = state.kv[cfg.attention_layer_ids[0]]

    def set_attr(a, name, value):
        setattr(a, name, value)

    def squeeze_or_back(shape):
        return shape[1:] if len(shape) == 3 else (1,) + shape

    def seqlens():  # a feed target_io keeps and rewrites in place: every executor below is fed this very object
        return target_io(state.desc, state, np.zeros(1, dtype=np.int64))[0]["seqlens_k"]

    def reshape(a):  # [1] <-> [1, 1]
        set_attr(a, "shape", (1,) + a.shape if a.ndim == 1 else a.shape[-1:])

    def retype(a):
        set_attr(a, "dtype", np.float32 if a.dtype == np.int32 else np.int32)

    disturbances = [
        ("none", lambda: None),
        ("a feed reshaped in place, or back", lambda: reshape(seqlens())),
        ("a feed's dtype in place, or back", lambda: retype(seqlens())),
        ("moved gdn", lambda: state.gdn.__setitem__(i, state.gdn[i].copy())),
        ("same memory, new object", lambda: state.gdn.__setitem__(j, state.gdn[j][...])),
        ("reshaped in place, or back", lambda: set_attr(state.conv[i], "shape", squeeze_or_back(state.conv[i].shape))),
        ("dtype in place, or back", lambda: set_attr(k, "dtype", np.int32 if k.dtype == np.float32 else np.float32)),
    ]
    rng = np.random.default_rng(0)
    for step in range(60):
        name, disturb = disturbances[int(rng.integers(len(disturbances)))] if step % 3 == 0 else ("none", None)
        if disturb is not None:
            disturb()
        M = 2 if rng.random() < 0.1 else 1
        outs = []
        for ex in executors:
            if ex is full:
                ex.state[Slot.PRIMARY].check = None  # never the replay check: the full signature, every run
            feeds, outputs, bound = target_io(state.desc, state, np.arange(M, dtype=np.int64))
            if ex is replayed:
                made = replayers.get(M)
                if made is None or any(x is not y for x, y in zip(made, (feeds, outputs, bound))):
                    made = replayers[M] = (feeds, outputs, bound, ex.replayer(Slot.PRIMARY, feeds, outputs, bound))
                outs.append(made[3]())
            else:
                outs.append(ex.run(Slot.PRIMARY, feeds, outputs, bound))
        a, b, c = (ex.state[Slot.PRIMARY] for ex in executors)
        decided = [(s.counters(), s.status, s.reason, s.signature is None) for s in (a, b, c)]
        assert decided[0] == decided[1] == decided[2], (step, name)
        shapes = [[(n, o.shape, o.dtype) for n, o in out.items()] for out in outs]
        assert shapes[0] == shapes[1] == shapes[2]
        if rng.random() < 0.05:  # the caller reshapes a returned output in place
            for out in outs:
                out["hidden"].shape = (out["hidden"].size,)
    assert checked.state[Slot.PRIMARY].replays > 10 and checked.state[Slot.PRIMARY].invalidations > 3
    assert len(replayers) == 2  # both sizes ran through replayers


def test_a_feed_of_object_references_is_staged_with_its_counts():
    """A string tensor reaches onnxruntime as an object array: the slot's buffer holds a counted reference to what
    it was staged from, not a byte copy of the pointer (which would dangle once the feed is gone)."""
    ex = Executor({Slot.PRIMARY: NullSession()}, {Slot.PRIMARY: SlotMemory(Arena("slot"))})

    def feeds(step):
        return {"ids": np.array([step], np.int64), "tags": np.array([f"tag-{step}-" + "x" * 60], dtype=object)}

    for step in range(3):  # a warm-up, the capture, then a replay through the check
        ex.run(Slot.PRIMARY, feeds(step), {}, ())
    assert ex.state[Slot.PRIMARY].replays == 1
    fed = feeds(99)
    tag = fed["tags"][0]
    before = sys.getrefcount(tag)
    ex.run(Slot.PRIMARY, fed, {}, ())
    assert ex.state[Slot.PRIMARY].replays == 2
    assert sys.getrefcount(tag) == before + 1  # the slot's buffer holds it too
    del fed
    ex.invalidate(Slot.PRIMARY, "the check, and the feeds it held, let go")
    assert ex.memory[Slot.PRIMARY].views[("feed.tags", (1,), np.dtype(object))][0] is tag


def test_a_replayer_runs_as_run_does_and_names_its_slot(tiny, setup):
    """The feeds rewritten in place reach every run: the same logits as run() on a second state, bit for bit."""
    cfg, state, ex = setup
    other, other_ex = TargetState.allocate(tiny.description, Arena("main")), Executor(
        {Slot.PRIMARY: ex.sessions[Slot.PRIMARY]}, {Slot.PRIMARY: SlotMemory(Arena("other"))})
    feeds, outputs, bound = target_io(state.desc, state, np.array([1]))
    step = ex.replayer(Slot.PRIMARY, feeds, outputs, bound)
    for t in (5, 9, 2, 7, 7, 3):
        length_feeds(state.desc.target, state.length, 1, state.desc.capacity, feeds)
        feeds["input_ids"][...] = t
        got = step()["logits"].copy()
        state.carry()
        state.length += 1
        np.testing.assert_array_equal(got, _call(other_ex, cfg, other, Slot.PRIMARY, [t])["logits"])
        other.length += 1
    st = ex.state[Slot.PRIMARY]
    assert (st.warmups, st.captures, st.replays) == (1, 1, 4)
    with pytest.raises(ValueError, match="not configured on this executor"):
        Executor({Slot.PRIMARY: ex.sessions[Slot.PRIMARY]}, {Slot.PRIMARY: ex.memory[Slot.PRIMARY]}).replayer(
            Slot.VERIFY, feeds, outputs, bound)


def test_plans_replay_through_the_c_entry_unless_the_session_s_own_call_was_replaced(tiny):
    from mtplab.runtime.plans import direct_runner

    session = graph_session(tiny.description.target)
    io = session.io_binding()
    assert direct_runner(session, io).func == session._sess.run_with_iobinding  # the wrapper's checks skipped
    calls = []
    session.run_with_iobinding = lambda io, run_options=None: calls.append(io)  # a recorder on the instance
    direct_runner(session, io)()
    assert calls == [io]
