"""The per-position commit: the verify writes the recurrent state after each of its tokens (a Loop running the decode's
own op one token at a time, mtplab.model.per_position) and a commit takes the n-th."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from mtplab.engine import batch_commits
from mtplab.engine.engine import Engine
from mtplab.engine.fit import spec_problems
from mtplab.experiment.config import ConfigError, RunConfig
from mtplab.experiment.point import run_point
from mtplab.model.folders import open_model
from mtplab.model.per_position import per_position_form, per_position_problem, states_name
from mtplab.runtime.executor import Slot

BUILDER = Path(__file__).parent / "data" / "builder-tiny"


def _run(commit: str = "per-position", **kw) -> RunConfig:
    return RunConfig(model="tiny", k=3, drafter="oracle", alpha=0.7, commit=commit, tokens=32, **kw)


@pytest.mark.parametrize("model", ["tiny", "builder"])
def test_a_verify_writes_the_state_after_each_token_as_decodes_of_the_same_tokens_would(tiny, model):
    art = tiny if model == "tiny" else open_model(str(BUILDER))
    run = _run().replace(model="tiny" if model == "tiny" else str(BUILDER))
    engine = Engine(run, art)
    prompt, tokens = list(range(3, 15)), [7, 9, 11, 13]
    engine.start(prompt)
    start = engine.state.length
    ver = {name: np.array(a) for name, a in engine.forward(Slot.VERIFY, tokens, in_place=False).items()}
    io = engine.desc.target
    recurrent = [s for s in io.states if s.kind == "recurrent"]
    assert {s.layer for s in recurrent} == set(io.position_states)
    for s in recurrent:  # one state per token but the last, whose state is the verify's own present
        assert ver[states_name(s.layer)].shape == (len(tokens) - 1, 1, *s.shape[1:])
    for j, token in enumerate(tokens):  # the same tokens decoded one at a time from the same start
        engine.state.length = start + j
        engine.forward(Slot.PRIMARY, [token])
        for s in recurrent:
            want = ver[states_name(s.layer)][j] if j < len(tokens) - 1 else ver[s.present]
            np.testing.assert_allclose(want, engine.state.gdn[s.layer], rtol=1e-5, atol=1e-6,
                                       err_msg=f"layer {s.layer} after token {j}")


def test_a_decode_on_the_copy_writes_no_state_and_is_priced_as_the_copys(tiny):
    """shared-max: Primary runs the copy too (its If sends a decode to the op itself); sibling-pinned: the graph before
    the surgery, at every batch size."""
    engine = Engine(_run(policy="shared-max"), tiny)
    engine.start([1, 2, 3])
    out = engine.forward(Slot.PRIMARY, [4])
    assert all(out[name].shape[0] == 0 for name in engine.desc.target.position_states.values())
    assert engine.primary_runs_copy
    for batch in (1, 2):
        apart = Engine(_run(batch=batch), tiny)
        assert not apart.primary_runs_copy and not apart.primary_desc.target.position_states


def test_the_copy_is_made_once_and_the_users_folder_is_left_as_it_was():
    desc = open_model(str(BUILDER)).description
    before = {p.name: p.stat().st_mtime_ns for p in BUILDER.iterdir()}
    one, two = per_position_form(desc), per_position_form(desc)
    assert one.target.path == two.target.path and BUILDER not in one.target.path.parents
    assert one.own_graph().target.path == desc.original_target  # a decode still runs the user's own graph
    assert {p.name: p.stat().st_mtime_ns for p in BUILDER.iterdir()} == before


def test_a_commit_taking_the_state_one_token_early_is_caught_naming_the_state(tiny, monkeypatch):
    real = batch_commits.position_update

    def early(desc):
        apply = real(desc)

        def planted(st, ver, n, row=None):  # the conv carry right, the recurrent state one token early
            apply(st, ver, n, row)
            if n >= 2:
                for layer, name in desc.target.position_states.items():
                    st.gdn[layer][...] = ver[name][n - 2]
        return planted

    monkeypatch.setattr(batch_commits, "position_update", early)
    r = run_point(_run(rounds=1), tiny)
    assert not r.lossless
    assert r.identity["state_first_divergence"]["tensor"].startswith("gdn_state.")


def test_it_holds_k_states_per_layer_and_says_so(tiny):
    r = run_point(_run(rounds=1), tiny)
    assert r.lossless, r.verdict
    pp = r.extra["per_position"]
    layers = [s for s in tiny.description.target.states if s.kind == "recurrent"]
    one = int(np.prod(layers[0].shape)) * 4
    assert pp == {"states_per_verify": 3, "layers": len(layers), "state_bytes": one, "bytes": 3 * len(layers) * one}
    assert r.slots["verify"]["captures"] == 1 and r.slots["verify"]["invalidations"] == 0


def test_it_is_refused_in_one_line_where_it_cannot_run(tiny):
    desc = tiny.description
    with pytest.raises(ConfigError, match="CUDA graphs cannot capture"):  # beside any problem of the machine's
        _run(backend="cuda")
    spec = dataclasses.replace(_run().engine_spec(), backend="cuda")  # an engine's spec, made without a RunConfig
    assert any("CUDA graphs cannot capture" in p for p in spec_problems(spec, desc))
    no_select = dataclasses.replace(desc, select="", select_refused="its conv is dilated")
    assert per_position_problem(no_select) == ("commit='per-position' on tiny keeps select's conv inputs, and select "
                                               "cannot run: its conv is dilated")
