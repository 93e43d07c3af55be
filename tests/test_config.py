"""RunConfig is the single source of the run parameters: the command line, the grid and the notebook derive from it."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import papermill as pm
import pytest

from mtplab import config, grid, point_exec
from mtplab.cli import _run_config, add_run_options, parser
from mtplab.config import INTEGER_0, RunConfig, param

NB = Path(__file__).resolve().parent.parent / "notebooks"


@dataclasses.dataclass(frozen=True)
class Extended(RunConfig):
    """RunConfig with two more fields, declared as RunConfig declares its own."""

    warmup: int = param(2, "untimed warm-up steps", rule=INTEGER_0, tag="w")
    trace: bool = param(False, "keep a trace of every step")


def _run_options(cls) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_run_options(p, cls)
    return p


def test_a_new_field_reaches_the_command_line_the_grid_and_the_notebook(tmp_path):
    args = _run_options(Extended).parse_args(["--warmup", "5", "--trace", "--k", "2", "--preset", "tiny"])
    run, problems = _run_config(args, Extended)
    assert problems == [] and run == Extended(preset="tiny", k=2, warmup=5, trace=True)
    args = _run_options(Extended).parse_args(["--warmup", "-1"])
    assert _run_config(args, Extended)[1] == ["--warmup -1: must be an integer >= 0"]

    assert {"warmup", "trace"} <= set(config.dimensions(Extended))
    spec = grid.parse({"preset": ["tiny"], "tokens": [16], "warmup": [1, 2], "trace": [False, True]}, Extended)
    ids = sorted(p.id for p in spec.points)
    assert len(ids) == 4 and sum("-w1" in i for i in ids) == 2 and sum(i.endswith("-trace") for i in ids) == 2
    with pytest.raises(ValueError, match=r"warmup=-3: must be an integer >= 0"):
        grid.parse({"warmup": [-3]}, Extended)

    params = point_exec.point_parameters(grid.Point(Extended(preset="tiny", warmup=4)), tmp_path)
    assert params["point"]["warmup"] == 4 and params["point"]["trace"] is False
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
    values = _run_config(args)[0].to_dict()
    assert values["validate"] is False and values["retain_decode_graph_across_spec"] is False
    assert values["prompt_len"] == 4 and values["max_recaptures"] == 1 and values["oracle_free_drafts"] is True
    assert parser().parse_args(["run"]).alpha is None  # not given: told apart from --alpha 0.8


def test_point_ids_name_the_new_dimensions_only_off_their_defaults():
    base = grid.Point(RunConfig(preset="tiny", tokens=16))
    assert base.id == "tiny-k3-mtp-sibling-pinned-select-decode-verify-t16-s0-r0"
    assert grid.Point(base.run.replace(threads=0)).id == base.id
    changed = base.run.replace(validate=False, prompt_len=4, max_recaptures=1, threads=2)
    assert grid.Point(changed).id == base.id + "-p4-novalidate-mr1-th2"


def test_the_k_and_max_recaptures_checks_are_one_definition():
    from mtplab.executor import Executor
    from mtplab.model import preset

    with pytest.raises(ValueError) as err:
        preset("tiny").check_k(8)
    assert str(err.value) in config.run_problems({"preset": "tiny", "k": 8, "tokens": 16})
    with pytest.raises(ValueError, match="max_recaptures=-1: must be an integer >= 0"):
        Executor({}, {}, max_recaptures=-1)
    assert config.run_problems({"max_recaptures": -1}) == ["max_recaptures=-1: must be an integer >= 0"]


def test_threads_are_passed_not_read_from_the_environment(tmp_path):
    from mtplab.device import device_for
    from mtplab.env import environment
    from mtplab.store import same_config

    assert device_for("cpu", threads=2).threads == 2 and device_for("cpu").threads == 0
    assert environment("cpu", 3)["threads"] == 3
    point = grid.Point(RunConfig(preset="tiny"))
    assert point_exec.point_parameters(point, tmp_path, threads=2)["point"]["threads"] == 2  # the sweep's share
    fixed = grid.Point(RunConfig(preset="tiny", threads=1))
    assert point_exec.point_parameters(fixed, tmp_path, threads=2)["point"]["threads"] == 1  # the spec's own
    stored = point_exec.point_parameters(point, tmp_path, threads=2)["point"]
    assert same_config(stored, point.run.to_dict()) and not same_config(stored, fixed.run.to_dict())
    source = Path(config.__file__).parent
    assert not [p for p in source.rglob("*.py") if "MTPLAB_THREADS" in p.read_text()]
