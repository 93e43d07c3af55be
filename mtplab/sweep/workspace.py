"""Where notebooks run directly (JupyterLab, papermill by hand) read sweeps from and write outputs to: results/."""

from __future__ import annotations

from pathlib import Path

from mtplab.base.paths import results_root

SMOKE = "smoke"  # the sweep a notebook runs itself with quick=True



def make_command(name: str) -> str:
    """The command that makes the sweep results/<name>."""
    if name == "demo":
        return "make demo"
    return f"mtplab sweep --grid smoke --name {name}"


def sweep_folder(results: str, quick: bool = False) -> Path:
    """The sweep a notebook reads: results/<results> (or a path); with quick, the smoke sweep, run here if missing.

    A missing sweep without quick is an error naming the command that makes it.
    """
    if quick:
        folder = results_root() / SMOKE
        if not (folder / "results.parquet").exists():
            from mtplab.sweep import grid
            from mtplab.sweep.run import run_sweep

            print(f"quick=True: running the smoke sweep into {folder} (seconds)")
            run_sweep(grid.load(preset="smoke"), results_root(), SMOKE, resume=True, quiet=True)
        return folder
    folder = Path(results) if ("/" in results or results.startswith(".")) else results_root() / results
    if not (folder / "results.parquet").exists():
        command = make_command(folder.name)
        if folder.parent != results_root():
            command = f"mtplab sweep --grid smoke --name {folder.name} --results {folder.parent}"
        raise ValueError(
            f"{folder}: no sweep there yet. Make it with `{command}`, "
            "or set quick=True to run the smoke sweep (seconds) and use that."
        )
    return folder


def output_folder(name: str) -> Path:
    """results/<name>/, created: where a notebook run by hand writes its files."""
    folder = results_root() / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
