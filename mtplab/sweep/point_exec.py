"""One sweep point executed through papermill into points/<id>/: what the local pool and Ray tasks both run."""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import asdict
from pathlib import Path

from mtplab.sweep import grid, store
from mtplab.sweep.kernel import ensure_kernel

Outcome = tuple[str, str, str | None]  # (point id, status, error, lossless verdict or why it is suspect)


def notebooks_dir() -> Path:
    """notebooks/ beside the package (an editable install or a checkout), or $MTPLAB_NOTEBOOKS."""
    env = os.environ.get("MTPLAB_NOTEBOOKS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "notebooks"


def point_run(point: grid.Point, threads: int = 0):
    """The RunConfig a point runs: its own, with the sweep's `threads` per point unless the spec fixes them."""
    return point.run if point.run.threads or not threads else point.run.replace(threads=threads)


def point_parameters(point: grid.Point, run_dir: Path, threads: int = 0, calibration_file: str = "") -> dict:
    """run_point.ipynb's parameters: the point's RunConfig fields (`point`), its folder and the sweep's calibration."""
    return {"point": point_run(point, threads).to_dict(), "run_dir": str(run_dir), "calibration_file": calibration_file}


KERNEL_STARTS = 3  # a point's kernel that dies before it answers is started again, up to this many times in all
_DIED_AT_START = "before replying to kernel_info"  # jupyter_client's words: the kernel never ran a cell


def _run_notebook(point: grid.Point, tmp: Path, points_dir: str, timeout: int, threads: int) -> None:
    """papermill's run of run_point.ipynb for the point into its folder `tmp`. A kernel that dies while starting (it
    ran nothing: a port taken between its choice and its bind, say) is started again, KERNEL_STARTS times in all;
    after that the last such error is raised, saying how often."""
    import papermill as pm

    for start in range(1, KERNEL_STARTS + 1):
        try:
            pm.execute_notebook(
                str(notebooks_dir() / "run_point.ipynb"),
                str(tmp / "run_point.ipynb"),
                parameters=point_parameters(point, tmp, threads, str(Path(points_dir).parent / "calibration.json")),
                kernel_name=ensure_kernel(),
                # a point sized by rounds 'auto' may spend its whole budget in its timed rounds' cell
                execution_timeout=max(timeout, int(point.run.rounds_budget * 2) + 300) if point.run.rounds == "auto"
                else timeout,
                progress_bar=False,
                cwd=str(tmp),
            )
            return
        except RuntimeError as err:
            if _DIED_AT_START not in str(err):
                raise
            if start == KERNEL_STARTS:
                raise RuntimeError(f"{err} (the point's kernel died while starting, {start} times)") from err


def execute_point(point: grid.Point, points_dir: str, timeout: int, threads: int) -> Outcome:
    """Run one point through papermill into points/<id>/; returns (id, ok|suspect|mismatch|failed, error,
    verdict or why it is suspect).

    threads: the intra-op threads of the point's sessions, unless its spec fixes them (RunConfig.threads).
    """
    error = None
    # The folder is absolute: the notebook runs with its cwd there, so a relative run_dir would nest.
    with store.point_folder(points_dir, point.id) as tmp:
        try:
            _run_notebook(point, tmp, points_dir, timeout, threads)
            if not (tmp / store.RESULT).exists():
                error = "the notebook finished without writing result.json"
        except Exception as err:  # noqa: BLE001 - a failed point is recorded, the sweep goes on
            # papermill's error names the cell's exception in ename/evalue: that line first, then the text's end
            # (a long traceback kept from its start would lose the exception it ends with)
            cause = f"{err.ename}: {err.evalue}\n" if getattr(err, "ename", None) else ""
            text = f"{type(err).__name__}: {err}".strip()
            error = (cause + (text if len(text) <= 4000 else "...\n" + text[-4000:])) or traceback.format_exc()[-4000:]
        if error is not None:
            store.write_error(tmp, asdict(point_run(point, threads)), error)
            return point.id, "failed", error
        result = json.loads((tmp / store.RESULT).read_text())
    status = store.result_status(result)
    return point.id, status, "; ".join(result["suspect"]) if status == "suspect" else result.get("verdict")


def record_failure(points_dir: Path, point: grid.Point, error: str) -> None:
    """A point that never produced a folder (its worker died): record the cause as its error."""
    with store.point_folder(points_dir, point.id) as tmp:
        store.write_error(tmp, asdict(point.run), error)
