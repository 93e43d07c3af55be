"""Shared fixtures: small presets, built once per session into a temporary cache."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

_CACHE = tempfile.mkdtemp(prefix="mtplab-test-cache-")
os.environ["MTPLAB_CACHE"] = _CACHE  # before anything reads it: tests never write the user's cache


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)

from mtplab.model import build_model, preset  # noqa: E402
from mtplab.runtime.arena import Arena  # noqa: E402 - after the cache is set
from mtplab.runtime.executor import Executor, Slot  # noqa: E402
from mtplab.runtime.plans import CpuPlanBackend  # noqa: E402
from mtplab.runtime.sessions import graph_session  # noqa: E402
from mtplab.runtime.slot_memory import SlotMemory  # noqa: E402
from mtplab.runtime.state import TargetState, target_io  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def mtplab_kernel():
    """Notebooks in tests run on this interpreter (see mtplab.sweep.kernel)."""
    from mtplab.sweep.kernel import ensure_kernel

    return ensure_kernel()


@pytest.fixture(scope="session")
def tiny():
    return build_model(preset("tiny"))


@pytest.fixture(scope="session")
def small():
    """Built by `mtplab model build` in a process of its own (one thread pool for its thousands of reference
    forwards, as the command gives it), then loaded from the session's cache."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "mtplab", "model", "build", "--preset", "small"], check=True,
                   capture_output=True)
    return build_model(preset("small"))


class Runner:
    """Eager target forwards through IOBinding on persistent state (what the executor binds)."""

    def __init__(self, art):
        self.cfg = art.config
        self.session = graph_session(art.description.target)
        self.state = TargetState.allocate(art.description, Arena("test"))

    def forward(self, tokens, in_place: bool = True) -> dict:
        feeds, outputs, bound = target_io(self.state.desc, self.state, np.asarray(tokens, dtype=np.int64), in_place)
        ex = Executor({Slot.PRIMARY: self.session}, {Slot.PRIMARY: SlotMemory(Arena("io"))})
        out = ex._eager_temporaries(Slot.PRIMARY, feeds, outputs, bound)
        if in_place:
            self.state.carry()
        self.state.length += len(tokens)
        return out


@pytest.fixture
def runner_for():
    return Runner


@pytest.fixture
def plan_backend():
    return CpuPlanBackend()


def planted_notebooks(folder, source: list[str]):
    """A notebooks folder whose run_point runs `source` first (a planted bug), for MTPLAB_NOTEBOOKS."""
    import json
    from pathlib import Path

    src = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "run_point.ipynb").read_text())
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "planted",
        "metadata": {},
        "outputs": [],
        "source": source,
    }
    src["cells"].insert(2, cell)
    folder.mkdir()
    (folder / "run_point.ipynb").write_text(json.dumps(src))
    return folder


@pytest.fixture
def failing_notebooks(tmp_path):
    """run_point raises at k=2 (a planted failure)."""
    return planted_notebooks(
        tmp_path / "failing-notebooks", ["if point.get('k') == 2:\n", "    raise RuntimeError('planted failure at k=2')\n"]
    )


@pytest.fixture
def overaccepting_notebooks(tmp_path):
    """run_point's engine accepts one draft more than matched (a planted over-accept bug)."""
    return planted_notebooks(
        tmp_path / "overaccepting-notebooks",
        [
            "import mtplab.engine.acceptance as planted\n",
            "planted.GreedyMatch.accept = lambda self, xp, d, lg, g, n, rows=None: (xp.minimum(n + 1, d.shape[-1]), g)\n",
        ],
    )


def plant_over_accept(monkeypatch) -> None:
    """Plant: every verify keeps one draft more than matched (greedy-match's verdict, GreedyMatch.accept)."""
    from mtplab.engine import acceptance

    monkeypatch.setattr(acceptance.GreedyMatch, "accept",
                        lambda self, xp, d, lg, g, n, rows=None: (xp.minimum(n + 1, d.shape[-1]), g))


def synthetic_calibration(t1: float = 1e-3) -> dict:
    """A synthetic calibration (a test double of calibrate.measure's result): T(M) = t1 * (1 + 0.1 (M-1)), cheap
    head and commits; for tests whose subject is not the prediction."""
    from mtplab.engine.strategies import COMMITS

    return {
        "key": {"model": "tiny", "synthetic": True},
        "target": {str(m): t1 * (1 + 0.1 * (m - 1)) for m in range(1, 9)},
        "head": 0.2 * t1,
        "commit": {s: {str(n): 0.05 * t1 * n for n in range(1, 9)} for s in COMMITS},
        "mtp_acceptance": {"alpha": 0.6, "per_position": [0.6], "steps": 1, "seeds": [1000]},
    }
