"""Drafters: the MTP head's chained steps, and the oracle's controlled acceptance."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import synthetic_calibration

from mtplab.engine.batch_head import draft_head, prefill_head
from mtplab.engine.drafters import OracleDrafter
from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.model.prompts import prompt_tokens
from mtplab.runtime.executor import Slot


def _head_ready(tiny, k: int = 4):
    """An engine of one row started on a prompt, its head's KV prefilled (token 3 after it)."""
    eng = Engine(RunConfig(model="tiny", k=k), tiny)
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    out = eng.start(prompt)
    prefill_head(eng, np.array([prompt[1:] + [3]]), out["hidden"])
    return eng, out["hidden"][:, -1].copy()


def test_the_heads_steps_draft_what_its_steps_through_executor_run_draft(tiny):
    from mtplab.runtime.state import mtp_io

    eng, hidden = _head_ready(tiny)
    kv = [a.copy() for a in eng.mtp_state.kv]
    first, at = np.array([3]), np.array([6])
    drafts = draft_head(eng, first, hidden, at, 4).tolist()
    drafts_again = draft_head(eng, first, hidden, at, 4).tolist()  # from its plan now: four replays
    after = [a.copy() for a in eng.mtp_state.kv]
    for live, saved in zip(eng.mtp_state.kv, kv):
        live[...] = saved
    token, h, steps = 3, hidden[0], []
    for i in range(4):  # each step through mtp_io and the executor's full path, one sequence's
        out = eng.mtp.run(Slot.PRIMARY, *mtp_io(eng.desc, eng.mtp_state, np.array([token]), h[None], np.array([6 + i])))
        token, h = int(out["logits"][0, 0].argmax()), out["mtp_hidden"][0, 0]
        steps.append(token)
    assert drafts == drafts_again == [steps]
    assert all(np.array_equal(a, b) for a, b in zip(after, eng.mtp_state.kv))
    assert eng.forwards["mtp/M=1"] == 8 and eng.mtp.state[Slot.PRIMARY].replays >= 4


def _oracle(seed: int = 0, alpha: float = 0.7, reference=None) -> OracleDrafter:
    reference = reference if reference is not None else [int(t) for t in np.random.default_rng(9).integers(0, 50, 3000)]
    oracle = OracleDrafter(reference, alpha, seed, 50)
    oracle.prefill([0] * 8, None)  # position p's next token is reference[p - 7]
    return oracle


def test_the_oracle_drafts_right_at_its_alpha_and_wrong_uniformly_over_the_other_tokens():
    oracle, k = _oracle(), 4
    right, wrong_offsets = 0, []
    for step in range(700):  # 2800 drafts: the prefill's block and a second one
        position = 7 + step * k
        drafts = oracle.draft(0, None, position, k).tolist()
        truth = oracle.reference[position - 6 : position - 6 + k]
        right += sum(d == t for d, t in zip(drafts, truth))
        wrong_offsets += [(d - t) % 50 for d, t in zip(drafts, truth) if d != t]
    n = 700 * k
    assert abs(right / n - 0.7) < 4 * (0.7 * 0.3 / n) ** 0.5  # within 4 standard errors
    assert 0 not in wrong_offsets and set(wrong_offsets) == set(range(1, 50))  # every other token, never the right one
    counts = np.bincount(wrong_offsets, minlength=50)[1:]
    expected = len(wrong_offsets) / 49
    assert ((counts - expected) ** 2 / expected).sum() < 93  # chi-square, 48 dof: its 0.9999 quantile is about 93


def test_the_oracle_draws_the_same_drafts_for_the_same_seed_and_others_for_another():
    runs = [[_o.draft(0, None, 7 + 3 * s, 3).tolist() for s in range(1500)] for _o in (_oracle(1), _oracle(1), _oracle(2))]
    assert runs[0] == runs[1] != runs[2]  # 4500 drafts each: past the first block of draws
    assert OracleDrafter.DRAWS < 4500


def test_each_oracle_draft_is_its_reference_token_or_that_token_shifted_by_its_draw():
    reference = [int(t) for t in np.random.default_rng(4).integers(0, 50, 40)]
    oracle = _oracle(5, 0.6, reference)
    for position in (7, 20, 42, 43, 44, 50):  # the last ones draft past the reference's end: fewer drafts, then none
        j, index = oracle.used, position - 6
        drafts = oracle.draft(0, None, position, 4).tolist()
        u, shift = oracle.uniforms[j : j + 4], oracle.shifts[j : j + 4]
        assert drafts == [t if u[i] < 0.6 else (t + shift[i]) % 50 for i, t in enumerate(reference[index : index + 4])]
        assert len(drafts) == max(0, min(4, 40 - index))
    assert oracle.draft(0, None, 2, 3).tolist() == []  # before the reference's start: nothing to draft from
    with pytest.raises(ValueError, match="the oracle draws 4096 numbers at a time: k=4097 drafts a step do not fit"):
        oracle.draft(0, None, 7, OracleDrafter.DRAWS + 1)


def test_the_heads_steps_are_counted_when_a_step_raises(tiny):
    eng, hidden = _head_ready(tiny)
    picks = []

    def choose(xp, rows, greedy, drawing=None):  # the acceptance rule's draft_rows, failing on the third step
        picks.append(1)
        if len(picks) == 3:
            raise RuntimeError("planted")
        return greedy

    with pytest.raises(RuntimeError, match="planted"):
        draft_head(eng, np.array([3]), hidden, np.array([6]), 4, choose=choose)
    assert eng.forwards["mtp/M=1"] == 3  # three head forwards ran


def test_a_draft_rule_given_after_the_plan_is_captured_is_the_one_the_drafts_follow(tiny):
    eng, hidden = _head_ready(tiny)
    first, at = np.array([3]), np.array([7])
    argmax = [draft_head(eng, first, hidden, at, 4).tolist() for _ in range(2)][1]  # the second from the captured plan
    assert draft_head(eng, first, hidden, at, 4, choose=lambda xp, rows, greedy, drawing=None: rows.argmin(-1)).tolist() != argmax


PYCODE = Path(__file__).parents[1] / "models" / "pycode"


def test_a_trained_heads_acceptance_does_not_depend_on_the_schedule_or_the_engine():
    """models/pycode's trained head drafts the same text whichever schedule drafts it, and as onnxruntime-genai's
    MTP generator does: its KV holds the emitted tokens with the target's hidden states after every verify (rows
    left as drafting wrote them made decode-verify accept 0.54 of first drafts where fused accepted 0.94)."""
    from mtplab.experiment.point import run_point
    from mtplab.model.folders import open_model

    model = open_model(PYCODE)
    runs = {s: RunConfig(model=str(PYCODE), k=3, drafter="mtp", schedule=s, tokens=128, rounds=1)
            for s in ("decode-verify", "fused")}
    results = {s: run_point(run, model, calibration=synthetic_calibration(1e-4)) for s, run in runs.items()}
    for s, r in results.items():  # the check holds the head's KV and its drafts to a teacher-forced head's
        assert r.lossless, (s, r.verdict)
    rates = {s: r.draft_acceptance for s, r in results.items()}
    assert min(rates.values()) > 0.8 and abs(rates["decode-verify"] - rates["fused"]) < 0.1, rates
    if importlib.util.find_spec("onnxruntime_genai") is not None:
        peer = run_point(runs["fused"].replace(engine="ort-genai"), model)
        assert abs(peer.draft_acceptance - rates["fused"]) < 0.1, (peer.draft_acceptance, rates)
