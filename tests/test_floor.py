"""Timing floors: each timed side against the bare replays of its own plans; a side beyond its band makes the point
suspect (its numbers kept, its speedup no finding, `mtplab run` exits 3)."""

from __future__ import annotations

import time

import pytest

from mtplab.experiment.config import RunConfig
from mtplab.experiment.point import run_point
from mtplab.experiment.result_text import result_text
from mtplab.measure import floor
from mtplab.sweep import store


def _rounds(greedy_host_us: float, spec_host_us: float = 200.0, rounds: int = 5, floor_us: float = 60.0,
            tokens: int = 31, steps: int = 10, spec_floor_us: float = 250.0) -> list[dict]:
    """Rounds whose sides took their floors plus the given host time per unit (a token, a step)."""
    return [{"greedy_seconds": tokens * (floor_us + greedy_host_us) * 1e-6, "greedy_floor_seconds": tokens * floor_us * 1e-6,
             "greedy_counted": tokens, "seconds": steps * (spec_floor_us + spec_host_us) * 1e-6,
             "floor_seconds": steps * spec_floor_us * 1e-6, "steps": steps} for _ in range(rounds)]


def test_sides_within_their_bands_are_not_suspect():
    assert floor.floor_problems(_rounds(greedy_host_us=12.0)) == []
    s = floor.side_summary(_rounds(greedy_host_us=12.0), "greedy")
    assert s["host_per_unit"] == pytest.approx(12e-6) and s["allowed_per_unit"] == pytest.approx(18e-6 + 50e-6 / 31)


def test_a_greedy_slower_than_its_band_is_suspect_naming_the_side_and_the_band():
    (problem,) = floor.floor_problems(_rounds(greedy_host_us=30.0))
    assert problem.startswith("greedy: 30.0 us a token beyond the bare replays") and "19.6 us" in problem


def test_the_fastest_round_is_held_to_the_band_so_a_slow_moment_is_not_a_problem():
    rounds = _rounds(greedy_host_us=200.0, rounds=4) + _rounds(greedy_host_us=10.0, rounds=1)
    assert floor.floor_problems(rounds) == []


def test_a_partial_floor_holds_its_side_to_no_band():
    rounds = _rounds(greedy_host_us=0.0, spec_host_us=9000.0)  # beyond the speculative band...
    assert floor.floor_problems(rounds)[0].startswith("speculative: 9000.0 us a step")
    for s in rounds:
        s["floor_share"] = 0.6  # ...but its floor priced 60% of its forwards (a plan recaptured at another M)
    assert floor.floor_problems(rounds) == [] and floor.side_summary(rounds, "speculative")["priced_share"] == 0.6


def test_rounds_without_floors_say_nothing():
    assert floor.side_summary([{"greedy_seconds": 1.0, "greedy_counted": 3}], "greedy") is None
    assert floor.floor_problems([]) == []


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_busy_wait_in_the_timed_greedy_makes_the_point_suspect(tiny, monkeypatch):
    """Planted: the timed greedy (no margins) waits after every decode; its tokens, forwards and state are right.
    Each wait is 4x the decode it follows, so that no load can hide it: a busy machine stretches the floor and its
    band (100% of the floor), and the wait with them (20 and 50 us fixed waits are caught on a quiet machine)."""
    from mtplab.engine import greedy

    loop = greedy._decode_loop

    def slow_loop(engine, decoder, tokens, rows, gaps, n, keep_logits, margins):
        decode_one, ids, feeds = decoder
        if not margins:  # the timed runs only
            def waiting():
                start = time.perf_counter()
                out = decode_one()
                _busy(4 * (time.perf_counter() - start))
                return out
            decoder = (waiting, ids, feeds)
        return loop(engine, decoder, tokens, rows, gaps, n, keep_logits, margins)

    monkeypatch.setattr(greedy, "_decode_loop", slow_loop)
    r = run_point(RunConfig(model="tiny", k=2, tokens=24, rounds=2), tiny)
    assert r.lossless  # nothing but its time is wrong
    assert r.suspect and r.suspect[0].startswith("greedy: ") and "its band" in r.suspect[0]
    assert r.extra["rounds"]["floor_rounds"] == floor.CONFIRM_ROUNDS  # confirmed before it was called suspect
    assert len(r.round_samples) == 2 + floor.CONFIRM_ROUNDS
    assert "SUSPECT TIMING (its speedup is not a finding): greedy" in result_text(r)
    assert store.result_status(r.to_dict()) == "suspect"


def test_a_suspect_point_exits_3_from_the_cli_and_0_when_allowed(tiny, monkeypatch, capsys):
    from mtplab.cli.main import main
    from mtplab.experiment import point

    real = point.run_mtplab_point

    def suspect_point(*args, **kwargs):
        r = real(*args, **kwargs)
        r.suspect = ["greedy: planted"]
        return r

    monkeypatch.setattr(point, "run_mtplab_point", suspect_point)
    args = ["run", "--model", "tiny", "--k", "2", "--tokens", "12", "--rounds", "1"]
    assert main(args) == 3
    assert "SUSPECT TIMING" in capsys.readouterr().out
    assert main([*args, "--allow-suspect"]) == 0


def test_a_lossless_point_beyond_a_band_is_stored_as_suspect_and_a_mismatch_stays_a_mismatch():
    assert store.result_status({"lossless": True, "suspect": ["x"]}) == "suspect"
    assert store.result_status({"lossless": False, "suspect": ["x"]}) == "mismatch"
    assert store.result_status({"lossless": True, "suspect": []}) == "ok"
    assert store.result_status({"lossless": True}) == "ok"  # a result from before timing floors


def test_a_host_time_below_the_floor_reads_none_measurable_not_a_negative_cost():
    from mtplab.experiment.result_text import _floor_text

    f = {"unit": "token", "host_per_unit": -175e-6, "allowed_per_unit": 35e-6, "priced_share": 1.0}
    assert _floor_text("greedy", f) == ("greedy none measurable (-175 us a token: its fastest round beat the bare "
                                        "replays), within its band of 35 us")
