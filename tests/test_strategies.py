"""Strategies are registered objects: a commit strategy, a drafter and an acceptance rule of a user's own
(tests/toy_strategies.py, which touches nothing in mtplab/) run through run_point with its lossless check,
grid validation, a sweep and its report."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import synthetic_calibration

from mtplab.engine.strategies import COMMITS, DRAFTERS, PLUGINS_ENV, Registry
from mtplab.experiment.config import ConfigError, RunConfig
from mtplab.experiment.point import run_point
from mtplab.report.publish import make_report
from mtplab.sweep import grid, store
from mtplab.sweep.run import run_sweep

TESTS = Path(__file__).resolve().parent
TOY = dict(model="tiny", k=3, drafter="copy-reference", commit="readvance-eager", tokens=24, rounds=1)


@pytest.fixture
def toys(monkeypatch):
    """The toy strategies registered for one test, in this process and (as a plugin) in the ones it starts."""
    monkeypatch.setenv(PLUGINS_ENV, "toy_strategies")
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}:{__import__('os').environ.get('PYTHONPATH', '')}")
    module = importlib.import_module("toy_strategies")
    yield module
    module.unregister()
    sys.modules.pop("toy_strategies", None)


def test_a_drafter_that_does_not_draft_through_the_rule_is_refused_at_temperature_above_zero(toys):
    with pytest.raises(ConfigError, match=r"drafter='copy-reference' has no distribution to draft from, which "
                                          r"rejection sampling needs: at temperature > 0 use drafter in \['mtp', 'oracle'\]"):
        RunConfig(model="tiny", drafter="copy-reference", temperature=1.0, acceptance="rejection-sampling")


def test_a_registry_refuses_a_taken_name_and_names_what_is_registered():
    reg = Registry("widget")
    reg.register(type("W", (), {"name": "a"})())
    with pytest.raises(ValueError, match="a widget named 'a' is already registered"):
        reg.register(type("W", (), {"name": "a"})())
    with pytest.raises(ValueError, match=r"unknown widget 'b': registered are \['a'\]"):
        reg.get("b")
    assert list(reg) == ["a"] and "a" in reg and reg.find("b") is None


def test_toy_strategies_run_lossless_and_the_acceptance_rule_decides_what_is_kept(tiny, toys):
    calibration = synthetic_calibration(1e-4)
    kept_one = run_point(RunConfig(**TOY, acceptance="first-only"), tiny, calibration=calibration)
    assert kept_one.lossless and kept_one.identity["token_identical"], kept_one.verdict
    assert kept_one.identity["state_bitwise"]  # the toy commit says bitwise: held to it
    first, second = kept_one.acceptance_per_position[:2]  # P(accepted >= 1), P(accepted >= 2)
    assert first == 1.0 and second == 0.0  # perfect drafts, one kept a step
    assert kept_one.tokens_per_step == 3.0  # decode + one kept draft + bonus
    assert "mtp/M=1" not in kept_one.forwards  # the drafter runs no head, and the audit expected none
    assert not kept_one.predicted and "none" in kept_one.theory["alpha_source"]
    all_kept = run_point(RunConfig(**TOY), tiny, calibration=calibration)
    assert all_kept.lossless and all_kept.acceptance_per_position == [1.0, 1.0, 1.0]  # greedy-match keeps all


def test_the_head_under_a_rule_that_keeps_fewer_matches_is_not_judged_as_greedy_match(tiny, toys):
    # first-only rejects drafts the reference chain agrees with: no disagreement to report there
    r = run_point(RunConfig(model="tiny", k=3, tokens=24, rounds=1, acceptance="first-only"), tiny,
                  calibration=synthetic_calibration(1e-4))
    assert r.lossless, r.verdict
    assert r.identity["head_kv_commits_checked"] and r.identity["head_drafts_judged"] is None


def test_a_drafter_of_your_own_drafts_each_row_of_a_batch_alone(tiny, toys):
    run = RunConfig(model="tiny", k=3, drafter="copy-reference", tokens=24, rounds=1, batch=2)
    r = run_point(run, tiny, calibration=synthetic_calibration(1e-4) | {"batch": 2})
    assert r.lossless, r.verdict
    assert r.acceptance_per_position == [1.0, 1.0, 1.0]  # each row copies its own reference: every draft kept
    assert not any(key.startswith("mtp") for key in r.forwards)  # the head never ran
    rows = r.extra["batch"]["per_row"]
    assert rows[0]["tokens"] != rows[1]["tokens"] and all(row["lossless"] for row in rows)


@pytest.mark.parametrize("plant", [None, "row 0's positions"])
def test_each_row_of_a_drafter_of_your_own_is_held_to_its_batch_of_one_run(tiny, toys, monkeypatch, plant):
    """A drafter of one's own whose drafts depend on its position: each row's accepted counts must be its batch-1
    run's. Planted: every row's drafter is told row 0's positions; its tokens stay greedy's, its drafts do not."""
    from mtplab.check.lossless import checked_pass
    from mtplab.check.verdict import verdict
    from mtplab.engine import step_drafts
    from mtplab.engine.engine import Engine
    from mtplab.model.prompts import run_prompts

    class Garbling(toys.CopyReference):  # the reference's next k tokens, each one whose value is odd garbled
        def draft(self, first, hidden, position, k):
            right = super().draft(first, hidden, position, k)
            return np.where(right % 2 == 1, right + 1, right)

    monkeypatch.setattr(toys.CopyReferenceKind, "build", lambda self, engine, reference: Garbling(reference, engine.xp))
    if plant:
        real = step_drafts.RowDrafters.draft
        monkeypatch.setattr(step_drafts.RowDrafters, "draft", lambda self, first, hidden, position, lengths, rows: real(
            self, first, hidden, np.full_like(position, position[0]), lengths, rows))
    run = RunConfig(model="tiny", k=3, drafter="copy-reference", tokens=24, batch=2)
    engine = Engine(run, tiny)
    checked = checked_pass(engine, run_prompts(run, engine.desc.vocab_size), run.tokens)
    ok, message = verdict(checked.identity)
    assert all(row["token_identical"] for row in checked.rows)  # greedy's tokens, whatever was drafted
    if plant is None:
        assert ok and all(row["batch_one"]["identical"] for row in checked.rows), message
        assert checked.spec.accepted[0] != checked.spec.accepted[1]  # the rows drafted apart
    else:
        assert not ok and "row 1 of 2" in message and "differs from a batch-1 run of its seeds" in message, message


def test_a_commit_of_your_own_is_refused_at_batch_above_one_before_any_work(toys):
    with pytest.raises(ConfigError, match=r"commit='readvance-eager' commits one sequence \(it has no row-by-row "
                                          r"form\): batch=2 runs commit in \['per-position', 'readvance-batched', "):
        RunConfig(model="tiny", commit="readvance-eager", batch=2)


def test_an_acceptance_rule_that_judges_one_sequence_is_refused_at_batch_above_one_before_any_work(toys):
    with pytest.raises(ConfigError, match=r"acceptance='first-only' judges one sequence \(its accept takes no rows\): "
                                          r"batch=2 needs accept\(xp, drafts, logits, greedy, kept, rows=None\)"):
        RunConfig(model="tiny", acceptance="first-only", batch=2)


def test_an_acceptance_rule_written_before_the_graphs_chose_greedily_is_refused_naming_the_new_forms():
    from mtplab.engine.acceptance import AcceptanceRule
    from mtplab.engine.strategies import ACCEPTANCE

    class OldForm(AcceptanceRule):
        name = "old-form"

        def row_tokens(self, xp, rows):
            return rows.argmax(-1)

        def accept(self, xp, drafts, logits, rows=None):
            raise AssertionError("never called: refused before any work")

    ACCEPTANCE.register(OldForm())
    try:
        with pytest.raises(ConfigError, match=r"acceptance='old-form': accept\(xp, drafts, logits, rows\), "
                                              r"row_tokens\(xp, rows\) take no greedy choice; mtplab passes the graph's: "
                                              r"accept\(xp, drafts, logits, greedy, kept, rows=None\)"):
            RunConfig(model="tiny", acceptance="old-form")
    finally:
        ACCEPTANCE.unregister("old-form")


def test_a_toy_commit_that_breaks_its_promise_is_caught(tiny, toys, monkeypatch):
    monkeypatch.setattr(toys.ReadvanceEager, "forwards", lambda self, accepted: {})
    r = run_point(RunConfig(**TOY), tiny, calibration=synthetic_calibration(1e-4))
    assert not r.lossless and "its forwards are not what" in r.verdict


def test_grids_validate_toy_names_and_a_drafters_parameters(toys):
    spec = grid.parse({"model": ["tiny"], "drafter": ["copy-reference"], "commit": ["readvance-eager", "select"],
                       "acceptance": ["first-only"], "tokens": [16]})
    assert sorted(p.id for p in spec.points) == [
        "tiny-k3-copy-reference-sibling-pinned-readvance-eager-decode-verify-t16-s0-r0-acc-first-only",
        "tiny-k3-copy-reference-sibling-pinned-select-decode-verify-t16-s0-r0-acc-first-only",
    ]
    with pytest.raises(ValueError, match=r"unknown commit 'nope': allowed values are \[.*'readvance-eager'"):
        grid.parse({"model": ["tiny"], "commit": ["nope"]})
    with pytest.raises(ValueError, match="alpha=0.5 with drafter='copy-reference': alpha belongs to the oracle"):
        grid.parse({"model": ["tiny"], "drafter": ["copy-reference"], "alpha": [0.5]})
    # a drafter parameter in `defaults` applies where the drafter takes it only
    mixed = grid.parse({"defaults": {"alpha": 0.6}, "model": ["tiny"], "drafter": ["copy-reference", "oracle"]})
    assert sorted(p.run.alpha for p in mixed.points) == [0.6, RunConfig().alpha]


@pytest.mark.full  # end to end: a sweep of two models and its report (make test-full)
def test_a_sweep_of_a_builder_folder_and_a_preset_with_toy_strategies_reports_both(tmp_path, tiny, toys):
    fixture = TESTS / "data" / "builder-tiny"
    spec = grid.parse({
        "name": "models",
        "defaults": {"tokens": 24, "rounds": 1, "k": 2},
        "grids": [{"model": [str(fixture)], "drafter": ["oracle"], "alpha": [0.7]},
                  {"model": ["tiny"], "drafter": ["copy-reference"], "commit": ["readvance-eager"]}],
    })
    assert sorted(p.id.split("-")[0] for p in spec.points) == ["builder", "tiny"]  # builder-tiny-k2-..., tiny-k2-...
    sweep_dir = run_sweep(spec, tmp_path, quiet=True)
    df = store.load(sweep_dir)
    assert sorted(df.model_name) == ["builder-tiny", "tiny"] and df.status.isin(store.LOSSLESS).all() and df.lossless.all()
    assert set(json.loads((sweep_dir / "calibration.json").read_text())) == {"builder-tiny", "tiny"}
    html = make_report(sweep_dir).read_text()
    assert "Model <code>builder-tiny</code>" in html and "Model <code>tiny</code>" in html
    assert "readvance-eager" in html and "copy-reference" in html


def test_the_builtin_strategies_are_registered():
    assert set(COMMITS) == {"readvance-m1", "readvance-batched", "select", "per-position"}
    assert set(DRAFTERS) == {"mtp", "oracle"}
