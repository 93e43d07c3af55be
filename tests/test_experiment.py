"""run_point: one point on a supplied engine only when the engine was built for that point's config."""

from __future__ import annotations

import pytest

from mtplab.config import RunConfig
from mtplab.engine import Engine
from mtplab.experiment import run_point


@pytest.mark.parametrize("changes", [{"k": 3}, {"commit": "readvance-m1"}, {"seed": 1}])
def test_an_engine_built_for_another_config_is_refused(tiny, changes):
    built = RunConfig(preset="tiny", k=2, tokens=16)
    with pytest.raises(ValueError, match=f"engine was built for another config .*{next(iter(changes))}"):
        run_point(built.replace(**changes), tiny, Engine(built, tiny))


def test_an_engine_runs_a_point_of_its_config_at_another_length(tiny):
    built = RunConfig(preset="tiny", k=2, tokens=16)
    assert run_point(built.replace(tokens=24), tiny, Engine(built, tiny)).lossless
