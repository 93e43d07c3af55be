"""Notebooks: a parameters cell each, jupytext twins in sync, and the executor story runs."""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import papermill as pm
import pytest

NB = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NB.glob("*.ipynb"))


def test_every_notebook_is_listed():
    assert {p.stem for p in NOTEBOOKS} == {
        "run_point",
        "01_two_slot_executor",
        "02_k_acceptance",
        "03_arena_and_commit",
        "report",
    }


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell_and_jupytext_twin(path):
    nb = nbformat.read(str(path), as_version=4)
    assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
    twin = jupytext.read(str(path.with_suffix(".py")))
    assert [c.source for c in twin.cells] == [c.source for c in nb.cells], (
        f"{path.name} and its .py twin differ: run jupytext --sync"
    )


def test_two_slot_story_notebook_runs(tmp_path, tiny):
    out = tmp_path / "01.ipynb"
    pm.execute_notebook(
        str(NB / "01_two_slot_executor.ipynb"),
        str(out),
        parameters={"preset": "tiny", "tokens": 48},
        kernel_name="mtplab",
        progress_bar=False,
        cwd=str(tmp_path),
    )
    text = out.read_text()
    assert "sibling (validation off)" in text and "image/png" in text


def test_sweep_notebooks_run_on_a_sweep(tmp_path, tiny):
    from mtplab import grid
    from mtplab.sweep import run_sweep

    sweep_dir = run_sweep(grid.load(preset="smoke"), tmp_path / "r", quiet=True)
    for name in ("02_k_acceptance", "03_arena_and_commit"):
        out = tmp_path / f"{name}.ipynb"
        pm.execute_notebook(
            str(NB / f"{name}.ipynb"),
            str(out),
            parameters={"sweep_dir": str(sweep_dir)},
            kernel_name="mtplab",
            progress_bar=False,
            cwd=str(tmp_path),
        )
        assert out.read_text().count("image/png") >= 3
