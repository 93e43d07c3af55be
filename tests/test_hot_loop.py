"""The compiled loop between two replays: what it writes is what Python writes, and where it cannot, it stops."""

from __future__ import annotations

import numpy as np
import pytest

from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.model.prompts import prompt_tokens
from mtplab.runtime import held_meta, hot_loop
from mtplab.runtime.executor import Slot

pytestmark = pytest.mark.skipif(not held_meta.ready(), reason="the compiled reads do not work on this interpreter")


def _argmax(row: np.ndarray) -> int:
    """The compiled ARGMAX op alone, on one float32 row held in a table."""
    table = held_meta.snapshot([row])
    program = np.array([[hot_loop.ARGMAX, 0, row.size, 0]], dtype=np.int64)
    out = np.full(1, -1, dtype=np.int64)
    assert held_meta.advance(table, held_meta.copies([(0, 0, 0)]), program, out, 0, 0, hot_loop.AFTER) == hot_loop.STAGED
    return int(out[0])


@pytest.mark.parametrize("case", ["random", "tie", "nan", "nan first", "all -inf", "max last"])
def test_the_compiled_argmax_is_numpys_first_largest_or_first_nan(case):
    row = np.random.default_rng(3).standard_normal(257).astype(np.float32)
    if case == "tie":
        row[[40, 90]] = row.max() + 1
    elif case == "nan":
        row[[60, 200]] = np.nan
    elif case == "nan first":
        row[0] = np.nan
    elif case == "all -inf":
        row[:] = -np.inf
    elif case == "max last":
        row[-1] = row.max() + 1
    assert _argmax(row) == int(row.argmax())


@pytest.fixture(scope="module")
def engines(tiny):
    """A tiny engine (seqlens feeds) and a builder engine (attention_mask feeds), greedy plans captured."""
    out = {}
    for model in ("tiny", "tests/data/builder-tiny"):
        eng = Engine(RunConfig(model=model, k=2, drafter="mtp"), tiny if model == "tiny" else None)
        prompt = prompt_tokens(eng.desc.vocab_size, 8, 0)
        eng.greedy(prompt, 8)
        out[model] = (eng, prompt)
    return out


def _decode_program(eng: Engine, **changes):
    from mtplab.runtime.sessions import fixed_io

    feeds, outputs, bound = fixed_io(eng.primary_desc, eng.state, 1, True)
    check = eng.target.held_check(Slot.PRIMARY, feeds, outputs, bound)
    io = eng.primary_desc.target
    args = dict(check=check, feeds=feeds, io=io, total=eng.desc.capacity, logits=check.result[io.logits],
                copies=[(p, c) for c, p in eng.state.layer_carries()]) | changes
    return check, feeds, hot_loop.program(**args)


@pytest.mark.parametrize("model", ["tiny", "tests/data/builder-tiny"])
def test_a_program_writes_the_token_and_lengths_as_python_writes_them(engines, model):
    from mtplab.model.description import length_feeds

    eng, _ = engines[model]
    check, feeds, program = _decode_program(eng)
    assert program is not None
    io = eng.primary_desc.target
    for length in (3, 40, eng.desc.capacity - 1):
        out = np.array([11], dtype=np.int64)
        assert held_meta.advance(check.table, check.copies, program, out, 0, length, hot_loop.BEFORE) == hot_loop.STAGED
        want = length_feeds(io, length, 1, eng.desc.capacity, {n: np.array(v) for n, v in feeds.items()})
        for name, value in feeds.items():
            assert np.array_equal(value, [[11]] if name == io.input_ids else want[name]), name
        for (view, _), value in zip(check.staging, feeds.values()):  # staged into the plan's own buffers
            assert np.array_equal(view, value)


def test_a_program_is_refused_where_it_would_not_write_what_python_writes(engines):
    eng, _ = engines["tiny"]
    check, feeds, _ = _decode_program(eng)
    io = eng.primary_desc.target
    assert _decode_program(eng, logits=check.result[io.logits].astype(np.float16))[2] is None  # not the check's array
    committed, present = eng.state.layer_carries()[0]
    assert _decode_program(eng, copies=[(present, np.empty_like(committed))])[2] is None  # a target it does not hold
    odd = dict(feeds, extra=np.zeros(1, dtype=np.int64))
    assert _decode_program(eng, feeds=odd)[2] is None  # a feed it does not know


def test_a_chain_stops_where_the_table_finds_an_array_reshaped_and_python_takes_over(engines):
    eng, prompt = engines["tiny"]
    want = eng.greedy(prompt, 24, margins=True)  # the Python loop
    check, feeds, _ = _decode_program(eng)
    committed = eng.state.layer_carries()[0][0]
    shape, runs, chained = committed.shape, [], []
    real_chain = hot_loop.chain

    def reshaping(replay):  # before the tenth decode's replay, a held state reshaped in place (the same bytes)
        runs.append(1)
        if len(runs) == 10:
            committed.shape = (committed.size,)
        replay()

    def chain(table, copies, program, out, i, stop, length, replay):
        try:
            result = real_chain(table, copies, program, out, i, stop, length, lambda: reshaping(replay))
        finally:
            committed.shape = shape  # back before the Python loop reads it
        chained.append(result)
        return result

    hot_loop.chain = chain
    try:
        got = eng.greedy(prompt, 24, margins=False)
    finally:
        hot_loop.chain = real_chain
    assert got.tokens == want.tokens
    assert chained[0][3] is True and chained[0][2] == 10  # ten runs, the tenth's token read by Python
    assert eng.forwards["primary/M=1"] > 0 and eng.target.state[Slot.PRIMARY].invalidations == 0


@pytest.mark.parametrize("model", ["tiny", "tests/data/builder-tiny"])
def test_timed_greedy_compiled_decodes_the_python_loops_tokens_and_leaves_its_state_bitwise(engines, model, monkeypatch):
    eng, prompt = engines[model]
    want = eng.greedy(prompt, 40, margins=True)  # margins: the Python loop
    state, forwards = eng.state.snapshot(), dict(eng.forwards)
    chains, real = [], hot_loop.chain
    monkeypatch.setattr(hot_loop, "chain", lambda *a: chains.append(real(*a)) or chains[-1])
    got = eng.greedy(prompt, 40, margins=False)
    assert got.tokens == want.tokens and got.decodes == 39
    assert chains == [(40, eng.state.length, 39, False)]  # every decode compiled
    assert all(np.array_equal(a, eng.state.snapshot()[name]) for name, a in state.items())
    assert eng.forwards["primary/M=1"] - forwards["primary/M=1"] == 39


def test_a_program_waits_while_the_checks_table_holds_another_drafters_feeds(tiny):
    from mtplab.engine.drafters import MtpDrafter

    def drafts(compiled: bool) -> list:  # two argmax drafters on one head, alternating: each feeds its own hidden
        eng = Engine(RunConfig(model="tiny", k=3, drafter="mtp"), tiny)
        eng.speculative(prompt_tokens(tiny.config.vocab_size, 8, 1), 12)  # the head's plan captured
        a, b = eng.head, MtpDrafter(eng.desc, eng.mtp, eng.mtp_state, eng.forwards)
        a.compiled = b.compiled = compiled
        rng, out = np.random.default_rng(0), []
        for who in (a, a, b, a, a, b):
            hidden = rng.standard_normal(eng.desc.hidden_size).astype(np.float32)
            out.append(who.draft(5, hidden, eng.state.length, 3).tolist())
        return out + [eng.mtp.format_counters()]

    assert drafts(True) == drafts(False)


def test_a_replay_that_raises_in_the_compiled_loop_leaves_the_length_and_counts_true(engines):
    eng, prompt = engines["tiny"]
    backend, real = eng.target.backend, eng.target.backend.replay
    seen = {}
    for compiled in (True, False):
        eng.compiled_loops, runs = compiled, []

        def replay(session, plan, runs=runs):
            runs.append(1)
            if len(runs) == 5:
                raise RuntimeError("the fifth replay fails")
            real(session, plan)

        forwards = eng.forwards.get("primary/M=1", 0)
        backend.replay = replay
        try:
            with pytest.raises(RuntimeError, match="fifth replay"):
                eng.greedy(prompt, 20, margins=False)
        finally:
            del backend.replay
            eng.compiled_loops = True
        seen[compiled] = (eng.state.length, eng.forwards["primary/M=1"] - forwards, eng.state.snapshot())
    assert seen[True][:2] == seen[False][:2] == (len(prompt) + 4, 4)
    assert all(np.array_equal(a, seen[False][2][name]) for name, a in seen[True][2].items())


@pytest.mark.filterwarnings("ignore:Setting the strides:DeprecationWarning")  # numpy 2.4 deprecates it: still possible
@pytest.mark.parametrize("which", ["token ids", "logits strides"])
def test_an_array_changed_in_place_in_a_way_the_table_does_not_hold_is_left_to_python(engines, which):
    from mtplab.runtime.sessions import fixed_io

    eng, prompt = engines["tiny"]
    results = {}
    for compiled in (True, False):
        eng.compiled_loops = compiled
        eng.greedy(prompt, 6, margins=False)
        ids = fixed_io(eng.primary_desc, eng.state, 1, True)[0][eng.primary_desc.target.input_ids]
        logits = eng.target.state[Slot.PRIMARY].check.result[eng.primary_desc.target.logits]
        if which == "token ids":  # Python's write raises on it
            ids.flags.writeable = False
        else:  # Python's argmax reads through the strides
            logits.strides = (0, 0, 0)
        try:
            results[compiled] = eng.greedy(prompt, 8, margins=False).tokens
        except ValueError as err:
            results[compiled] = str(err)
        finally:
            ids.flags.writeable = True
            if which != "token ids":
                logits.strides = (4 * logits.shape[2],) * 2 + (4,)
            eng.compiled_loops = True
    assert results[True] == results[False]


def test_only_greedy_matchs_own_argmax_is_chosen_in_a_compiled_loop():
    from mtplab.engine.acceptance import GREEDY_MATCH, GreedyMatch, chooses_argmax

    class NoZero(GreedyMatch):  # a rule that overrides the token it picks
        def token(self, xp, row):
            return row[1:].argmax() + 1

        draft_token = token

    assert chooses_argmax(GREEDY_MATCH.token) and chooses_argmax(GREEDY_MATCH.draft_token)
    assert not chooses_argmax(NoZero().token) and not chooses_argmax(NoZero().draft_token)
    assert not chooses_argmax(lambda xp, row: row.argmax())
