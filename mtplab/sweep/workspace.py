"""Where notebooks run directly (JupyterLab, papermill by hand) read sweeps from and write outputs to: results/."""

from __future__ import annotations

from pathlib import Path

from mtplab.base.paths import results_root

SMOKE = "smoke"  # the sweep a notebook runs itself with quick=True



def make_command(name: str) -> str:
    """The command that makes the sweep results/<name>."""
    from mtplab.sweep import grid

    if name == "demo":
        return "make demo"
    if name in grid.presets():  # a preset grid writes results/<its name>
        return f"mtplab sweep --grid {name}"
    return f"mtplab sweep --grid smoke --name {name}"


def sweep_folder(results: str, quick: bool = False) -> Path:
    """The sweep a notebook reads: results/<results> (or a path); with quick, the smoke sweep, run here if missing.

    A sweep named under results/ that is not there yet gives the quick form, said with the command that makes the
    named one (so that every notebook runs with its defaults on a fresh clone); a missing path is an error.
    """
    if quick:
        return _smoke_sweep()
    is_path = "/" in results or results.startswith(".")
    folder = Path(results) if is_path else results_root() / results
    if (folder / "results.parquet").exists():
        return folder
    command = make_command(folder.name)
    if is_path:
        if folder.parent != results_root():
            command = f"mtplab sweep --grid smoke --name {folder.name} --results {folder.parent}"
        raise ValueError(f"{folder}: no sweep there yet. Make it with `{command}`, "
                         "or set quick=True to run the smoke sweep (seconds) and use that.")
    print(f"{folder}: no sweep there yet (`{command}` makes it). This run uses the quick form instead: the smoke "
          "sweep, a little of everything, in seconds.")
    return _smoke_sweep()


def made_sweep(results: str) -> Path | None:
    """results/<results> (or a path) where that sweep has been run, else None, said with the command that makes it
    (a notebook's optional part: it shows nothing rather than another sweep's points)."""
    folder = Path(results) if "/" in results or results.startswith(".") else results_root() / results
    if (folder / "results.parquet").exists():
        return folder
    print(f"{folder}: no sweep there yet (`{make_command(folder.name)}` makes it); this part shows nothing.")
    return None


def _smoke_sweep() -> Path:
    """results/smoke, run first where it is missing."""
    folder = results_root() / SMOKE
    if not (folder / "results.parquet").exists():
        from mtplab.sweep import grid
        from mtplab.sweep.run import run_sweep

        print(f"running the smoke sweep into {folder} (seconds)")
        run_sweep(grid.load(preset="smoke"), results_root(), SMOKE, resume=True, quiet=True)
    return folder


def output_folder(name: str) -> Path:
    """results/<name>/, created: where a notebook run by hand writes its files."""
    folder = results_root() / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
