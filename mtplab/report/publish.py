"""`mtplab report`: execute notebooks/report.ipynb (or, with --study, notebooks/04_when_mtp_pays.ipynb) on a sweep and
publish it as code-free HTML."""

from __future__ import annotations

from pathlib import Path

from mtplab.base.files import write_atomic
from mtplab.sweep import store
from mtplab.sweep.kernel import ensure_kernel
from mtplab.sweep.point_exec import notebooks_dir

# a published notebook -> (its page's name, the parameter that names the sweep it reads)
PUBLISHED = {"report": ("report", "sweep_dir"), "04_when_mtp_pays": ("study", "results")}


def make_report(sweep_dir: str | Path, notebook: str = "report", say=lambda line: None) -> Path:
    """Run a published notebook (the report, or the study) on sweep_dir, convert it with nbconvert --no-input,
    refresh results/index.html; say(line) once the sweep is found, before the notebook runs."""
    import nbformat
    import papermill as pm
    from nbconvert import HTMLExporter

    sweep_dir = store.finished_sweep(sweep_dir)
    store.read_summary(sweep_dir)  # a damaged summary is named here, not in a half-run notebook
    store.check_fresh(sweep_dir)
    name, sweep_parameter = PUBLISHED[notebook]
    say(f"rendering {sweep_dir.name}: running notebooks/{notebook}.ipynb on it, then HTML (a quarter of a minute or so)")
    executed = sweep_dir / f"{name}.ipynb"
    pm.execute_notebook(
        str(notebooks_dir() / f"{notebook}.ipynb"),
        str(executed),
        parameters={sweep_parameter: str(sweep_dir)},
        kernel_name=ensure_kernel(),
        progress_bar=False,
        cwd=str(sweep_dir),
    )
    exporter = HTMLExporter()
    exporter.exclude_input = True
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    body, _ = exporter.from_notebook_node(nbformat.read(str(executed), as_version=4))
    out = sweep_dir / f"{name}.html"
    write_atomic(out, body)
    store.write_index(sweep_dir.parent)
    return out
