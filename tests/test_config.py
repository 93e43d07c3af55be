"""RunConfig is the single source of the run parameters: the command line, the grid and the notebook derive from it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import papermill as pm
import pytest

from mtplab.cli.main import parser
from mtplab.cli.options import run_config
from mtplab.experiment import config, point_ids
from mtplab.experiment.config import RunConfig
from mtplab.experiment.params import GROUPS
from mtplab.sweep import grid, point_exec

NB = Path(__file__).resolve().parent.parent / "notebooks"


def test_every_field_belongs_to_one_group_and_the_command_line_groups_its_options():
    groups = {f.name: f.metadata["group"] for f in config.fields()}
    assert set(groups.values()) == set(GROUPS)
    run = RunConfig(model="tiny", k=2, drafter="oracle", alpha=0.5, tokens=16)
    assert run.group("model") == {"model": "tiny", "int4": False, "backend": "cpu", "engine": "mtplab"}
    assert run.group("decoding")["alpha"] == 0.5 and run.group("measurement")["tokens"] == 16
    sub = parser()._subparsers._group_actions[0].choices["run"]
    shown = {g.title: {a.dest for a in g._group_actions} for g in sub._action_groups}
    for name, group in groups.items():
        assert name in shown[f"{group} options"]


def test_the_notebook_takes_exactly_the_point_its_run_dir_and_calibration(tmp_path):
    params = point_exec.point_parameters(grid.Point(RunConfig(model="tiny", k=2)), tmp_path)
    assert params["point"]["k"] == 2 and params["point"]["model"] == "tiny"
    assert set(params) == set(pm.inspect_notebook(str(NB / "run_point.ipynb"))) == {"point", "run_dir", "calibration_file"}


def test_every_field_is_a_run_option_a_dimension_and_a_notebook_parameter(tmp_path):
    names = [f.name for f in dataclasses.fields(RunConfig)]
    run = [a for a in parser()._subparsers._group_actions[0].choices["run"]._actions if a.option_strings]
    assert set(names) <= {a.dest for a in run}
    assert grid.DIMENSIONS == tuple(names)  # validate too: the negative control can be swept
    assert set(point_exec.point_parameters(grid.Point(RunConfig()), tmp_path)["point"]) == set(names)


def test_todays_option_names_still_work():
    args = parser().parse_args(
        ["run", "--no-validate", "--no-retain", "--prompt-len", "4", "--max-recaptures", "1", "--oracle-free-drafts",
         "--drafter", "oracle"]
    )
    values = run_config(args)[0].to_dict()
    assert values["validate"] is False and values["retain_decode_graph_across_spec"] is False
    assert values["prompt_len"] == 4 and values["max_recaptures"] == 1 and values["oracle_free_drafts"] is True
    assert parser().parse_args(["run"]).alpha is None  # not given: told apart from --alpha 0.8


def test_point_ids_name_the_new_dimensions_only_off_their_defaults():
    base = grid.Point(RunConfig(model="tiny", tokens=16))
    assert base.id == "tiny-k3-mtp-sibling-pinned-select-decode-verify-t16-s0-r0"
    assert grid.Point(base.run.replace(threads=0)).id == base.id
    changed = base.run.replace(validate=False, prompt_len=4, max_recaptures=1, threads=2)
    assert grid.Point(changed).id == base.id + "-p4-novalidate-mr1-th2"


def test_a_point_id_is_a_visible_folder_name_whatever_the_model_folder_is_called(tmp_path):
    import shutil

    data = Path(__file__).parent / "data" / "builder-tiny"
    for name, start in ((".hidden", "m.hidden-k3-"), ("two words é", "two_words__-k3-"), ("x" * 300, "x" * 150)):
        folder = tmp_path / name[:240]
        shutil.copytree(data, folder, ignore=lambda d, names: [n for n in names if n.endswith(".data")])
        pid = grid.Point(RunConfig(model=str(folder), tokens=16)).id
        assert pid.startswith(start) and len(pid) <= 200 and pid[0].isalnum(), pid
        assert re.fullmatch(r"[A-Za-z0-9._+=-]+", pid), pid


def test_the_k_and_max_recaptures_checks_are_one_definition():
    from mtplab.model import preset
    from mtplab.runtime.executor import Executor

    with pytest.raises(ValueError) as err:
        preset("tiny").check_k(8)
    assert str(err.value) in config.run_problems({"model": "tiny", "k": 8, "tokens": 16})
    with pytest.raises(ValueError, match="max_recaptures=-1: must be an integer >= 0"):
        Executor({}, {}, max_recaptures=-1)
    assert config.run_problems({"max_recaptures": -1}) == ["max_recaptures=-1: must be an integer >= 0"]


def test_threads_are_passed_not_read_from_the_environment(tmp_path):
    from mtplab.measure.env import environment
    from mtplab.runtime.device import device_for
    from mtplab.sweep.store import same_config

    assert device_for("cpu", threads=2).threads == 2 and device_for("cpu").threads == 0
    assert environment("cpu", 3)["threads"] == 3
    point = grid.Point(RunConfig(model="tiny"))
    assert point_exec.point_parameters(point, tmp_path, threads=2)["point"]["threads"] == 2  # the sweep's share
    fixed = grid.Point(RunConfig(model="tiny", threads=1))
    assert point_exec.point_parameters(fixed, tmp_path, threads=2)["point"]["threads"] == 1  # the spec's own
    stored = point_exec.point_parameters(point, tmp_path, threads=2)["point"]
    assert same_config(stored, point.run.to_dict()) and not same_config(stored, fixed.run.to_dict())


def test_rounds_are_a_count_or_auto_and_auto_has_a_target_and_a_budget():
    assert RunConfig(rounds="auto", rounds_target=0.05, rounds_budget=20).rounds == "auto"
    with pytest.raises(config.ConfigError, match=r"rounds='often': must be an integer in 1..1000, or 'auto'"):
        RunConfig(rounds="often")
    with pytest.raises(config.ConfigError, match=r"rounds_target=0.05 with rounds=3 \(the default\): it sizes "
                                                 r"rounds='auto' only \(drop it, or give rounds='auto'\)"):
        RunConfig(rounds_target=0.05)
    with pytest.raises(config.ConfigError, match=r"rounds_budget=0: must be a number of seconds > 0"):
        RunConfig(rounds="auto", rounds_budget=0)
    args = parser().parse_args(["run", "--rounds", "auto", "--rounds-target", "0.02"])
    assert run_config(args)[0].rounds == "auto"


def test_a_bad_field_does_not_hide_a_disagreement_between_other_fields():
    with pytest.raises(config.ConfigError) as err:
        RunConfig(rounds=0, temperature=1.0)
    text = str(err.value)
    assert "rounds=0: must be an integer in 1..1000, or 'auto'" in text
    assert "temperature=1.0 samples, but acceptance='greedy-match' decodes greedily" in text
    with pytest.raises(config.ConfigError) as err:
        RunConfig(rounds=0, rounds_budget=5)  # the rounds check needs a valid rounds: only the bad field is named
    assert "rounds_budget=5 with" not in str(err.value)


def test_a_shipped_model_is_named_by_its_name_from_any_directory(tmp_path, monkeypatch):
    from mtplab.model.folders import SHIPPED, open_model

    monkeypatch.chdir(tmp_path)
    run = RunConfig(model="pycode", drafter="mtp")
    assert run.model == str((SHIPPED / "pycode").resolve()) and config.model_name(run.model) == "pycode"
    assert open_model("pycode").description.name == "pycode"
    with pytest.raises(config.ConfigError, match=r"a shipped model \['pycode'\]"):
        RunConfig(model="pycodex")


def test_a_prompt_set_of_the_models_folder_gives_the_prompt_and_names_the_point():
    import json

    from mtplab.model.folders import SHIPPED
    from mtplab.model.prompts import run_prompt

    sets = json.loads((SHIPPED / "pycode" / "prompts.json").read_text())["kinds"]
    assert sorted(sets) == ["code", "comments", "context", "data", "docstrings"] and all(len(v) >= 20 for v in sets.values())
    run = RunConfig(model="pycode", drafter="mtp", prompts="docstrings", seed=len(sets["docstrings"]) + 1)
    assert run_prompt(run, 2048) == sets["docstrings"][1]["tokens"]  # row seed % its size
    assert "prompts-docstrings" in point_ids.point_id(run)
    random = RunConfig(model="pycode", drafter="mtp")
    assert len(run_prompt(random, 2048)) == random.prompt_len and "prompts" not in point_ids.point_id(random)
    with pytest.raises(config.ConfigError, match=r"prompts='nope': pycode has no such prompt set \(allowed: \['code'"):
        RunConfig(model="pycode", prompts="nope")
    with pytest.raises(config.ConfigError, match="prompts='code': tiny ships no prompt sets"):
        RunConfig(model="tiny", prompts="code")


def test_context_cuts_a_prompt_sets_rows_to_their_last_tokens_so_every_length_continues_the_same_text():
    import json

    from mtplab.model.folders import SHIPPED
    from mtplab.model.prompts import run_prompt

    row = json.loads((SHIPPED / "pycode" / "prompts.json").read_text())["kinds"]["context"][3]["tokens"]
    whole = RunConfig(model="pycode", prompts="context", seed=3)
    assert run_prompt(whole, 2048) == row and len(row) == 1024
    cut = whole.replace(context=100)
    assert run_prompt(cut, 2048) == row[-100:]
    assert "ctx100" in point_ids.point_id(cut) and "ctx" not in point_ids.point_id(whole)
    with pytest.raises(config.ConfigError, match=r"context=2000: pycode's prompt set 'context' holds 1024 tokens a "
                                                 r"row \(allowed: 0 for whole rows, or 1..1024\)"):
        whole.replace(context=2000)
    with pytest.raises(config.ConfigError, match=r"context=49: pycode's prompt set 'code' holds 48"):
        RunConfig(model="pycode", prompts="code", context=49)
    with pytest.raises(config.ConfigError, match="context=64: it cuts a prompt set's rows, so it needs prompts"):
        RunConfig(model="pycode", context=64)
