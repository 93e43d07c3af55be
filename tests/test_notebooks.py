"""Notebooks: a parameters cell each, jupytext twins in sync, and the executor story runs."""

from __future__ import annotations

import shutil
import subprocess
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
        "04_when_mtp_pays",
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


def _clone(tmp_path: Path) -> Path:
    """A fresh clone's files (tracked and untracked, nothing ignored): no results, no executed notebooks."""
    root = NB.parent
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    clone = tmp_path / "clone"
    for f in files:
        if (root / f).is_file():
            (clone / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, clone / f)
    return clone


def _outside_results(clone: Path) -> dict:
    return {
        str(p.relative_to(clone)): p.stat().st_mtime_ns
        for p in clone.rglob("*")
        if p.is_file() and p.relative_to(clone).parts[0] != "results" and "__pycache__" not in p.parts
    }


@pytest.mark.full
def test_notebooks_run_from_a_fresh_clone_and_write_only_under_results(tmp_path, tiny, monkeypatch):
    clone = _clone(tmp_path)
    monkeypatch.setenv("MTPLAB_RESULTS", str(clone / "results"))  # the clone's results/ (mtplab is the one under test)
    before = _outside_results(clone)
    out = clone / "results" / "executed"
    out.mkdir()

    def run(name: str, **parameters) -> str:
        pm.execute_notebook(
            str(clone / "notebooks" / f"{name}.ipynb"),
            str(out / f"{name}.ipynb"),
            parameters=parameters,
            kernel_name="mtplab",
            progress_bar=False,
            cwd=str(clone / "notebooks"),  # as JupyterLab runs them
        )
        return (out / f"{name}.ipynb").read_text()

    # each with its defaults: results="demo" (or "study") is not there yet, so it runs the quick form and says which
    # command makes the sweep it names
    first = run("02_k_acceptance")
    assert "`make demo` makes it" in first and first.count("image/png") >= 3  # runs the smoke sweep itself
    assert run("03_arena_and_commit").count("image/png") >= 3
    study = run("04_when_mtp_pays")  # the smoke sweep's policy grid, its calibration, your hardware
    assert "`mtplab sweep --grid study` makes it" in study
    assert study.count("image/png") >= 3 and "never" in study and "shared-jit, select -> sibling-pinned, select" in study
    text = run("01_two_slot_executor", tokens=32)
    assert "sibling (validation off)" in text and "image/png" in text
    assert (clone / "results" / "two-slot-executor" / "counters.png").exists()
    assert _outside_results(clone) == before


def test_run_point_by_hand_writes_its_files_under_results_not_the_cwd(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("MTPLAB_RESULTS", str(tmp_path / "results"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (tmp_path / "results").mkdir()
    pm.execute_notebook(
        str(NB / "run_point.ipynb"),
        str(tmp_path / "results" / "run_point.ipynb"),
        parameters={"point": {"k": 2, "tokens": 16}},
        kernel_name="mtplab",
        progress_bar=False,
        cwd=str(cwd),
    )
    assert list(cwd.iterdir()) == []
    point = tmp_path / "results" / "run_point" / "tiny-k2-oracle0.8-sibling-pinned-select-decode-verify-t16-s0-r0"
    assert {"result.json", "point.png"} <= {f.name for f in point.iterdir()}


def test_a_missing_sweep_names_the_command_that_makes_it_and_a_named_one_gives_the_quick_form(
        tmp_path, monkeypatch, capsys):
    from mtplab.sweep import workspace

    monkeypatch.setenv("MTPLAB_RESULTS", str(tmp_path))
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "results.parquet").write_bytes(b"")  # the quick form's sweep, as if it had run
    for name, command in (("demo", "make demo"), ("study", "mtplab sweep --grid study"),
                          ("mine", "mtplab sweep --grid smoke --name mine")):
        assert workspace.sweep_folder(name) == tmp_path / "smoke"
        said = capsys.readouterr().out
        assert f"`{command}` makes it" in said and "uses the quick form instead" in said
    with pytest.raises(ValueError, match="`mtplab sweep --grid smoke --name gone --results "):
        workspace.sweep_folder(str(tmp_path / "elsewhere" / "gone"))
