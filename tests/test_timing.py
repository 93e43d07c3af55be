"""How a calibration times a cost: paired with T(1) beside it, in blocks waited on at both ends, after what a
step runs before it."""

from __future__ import annotations

import pytest

from mtplab.experiment import timing


def test_each_cost_is_its_ratio_to_the_reference_timed_beside_it():
    """A machine twice as slow from the second sample on: the ratios, and so the costs in T(1) units, do not move."""
    speed = {"now": 1.0}
    order = []

    def reference():
        order.append("ref")
        return 0.010 * speed["now"]

    def item(name, cost):
        def measure():
            order.append(name)
            return cost * speed["now"]
        return measure

    paired = timing.PairedSamples(reference, "target/1")
    paired.add("target/4", item("T4", 0.020))
    speed["now"] = 2.0
    paired.add("target/4", item("T4", 0.020))
    paired.add("greedy_token", item("greedy", 0.011))
    summary = paired.summary()
    # the reference goes first for every other sample of the same cost
    assert order == ["ref", "T4", "T4", "ref", "ref", "greedy"]
    assert summary["target/4"]["ratio"] == pytest.approx(2.0) and summary["greedy_token"]["ratio"] == pytest.approx(1.1)
    assert summary["target/1"]["median"] == pytest.approx(0.020)  # the references' median: 0.010, 0.020, 0.020
    assert summary["greedy_token"]["median"] / summary["target/4"]["median"] == pytest.approx(0.55)


def test_a_timed_block_waits_for_the_device_at_both_ends():
    """On a device whose runs return once queued, a block holds its calls' device work: Device.sync before the
    clock starts (the untimed call's work done) and before it stops (the block's own work done)."""
    events = []
    timing.block_time(lambda: events.append("call"), 3, lambda: events.append("sync"))
    assert events == ["call", "sync", "call", "call", "call", "sync"]


def test_a_draft_phase_is_timed_after_the_verify_a_step_runs_before_it(monkeypatch):
    """Each timed call follows an untimed `before` (the target's forward, which evicts the head's weights), after one
    untimed pair; the clock holds the call alone, its device work included."""
    events = []

    def event(name: str):
        return lambda: events.append(name)

    # test double: each event takes one second, so a timed span counts the events inside it
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(len(events)))
    seconds = timing.time_after(event("verify"), event("draft"), 2, event("sync"))
    assert events == ["verify", "draft"] + ["verify", "sync", "draft", "sync"] * 2
    assert seconds == 2.0  # the draft and the sync after it; the verify and the sync before it outside
