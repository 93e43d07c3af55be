"""`mtplab sweep`: every point runs notebooks/run_point.ipynb through papermill, in a process pool.

Each point executes in a hidden temporary folder that is renamed to points/<id>/ only when it
is complete, so a killed sweep leaves no half-written point and `--resume` skips finished ones.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from tqdm import tqdm

from . import grid, store
from .env import environment
from .kernel import ensure_kernel
from .result import write_atomic


def notebooks_dir() -> Path:
    """notebooks/ beside the package (an editable install or a checkout), or $MTPLAB_NOTEBOOKS."""
    env = os.environ.get("MTPLAB_NOTEBOOKS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "notebooks"


def point_parameters(point: grid.Point, run_dir: Path) -> dict:
    params = asdict(point.run)
    params["run_dir"] = str(run_dir)
    return params


def execute_point(point: grid.Point, points_dir: str, timeout: int, threads: int) -> tuple[str, str, str | None]:
    """Run one point through papermill into points/<id>/; returns (id, status, error)."""
    import papermill as pm

    os.environ["MTPLAB_THREADS"] = str(threads)
    error = None
    # The folder is absolute: the notebook runs with its cwd there, so a relative run_dir would nest.
    with store.point_folder(points_dir, point.id) as tmp:
        try:
            pm.execute_notebook(
                str(notebooks_dir() / "run_point.ipynb"),
                str(tmp / "run_point.ipynb"),
                parameters=point_parameters(point, tmp),
                kernel_name=ensure_kernel(),
                execution_timeout=timeout,
                progress_bar=False,
                cwd=str(tmp),
            )
            if not (tmp / store.RESULT).exists():
                error = "the notebook finished without writing result.json"
        except Exception as err:  # noqa: BLE001 - a failed point is recorded, the sweep goes on
            error = f"{type(err).__name__}: {err}".strip()[:4000] or traceback.format_exc()[-4000:]
        if error is not None:
            store.write_error(tmp, asdict(point.run), error)
    return point.id, "failed" if error else "ok", error


def record_failure(points_dir: Path, point: grid.Point, error: str) -> None:
    """A point that never produced a folder (its worker died): record the cause as its error."""
    with store.point_folder(points_dir, point.id) as tmp:
        store.write_error(tmp, asdict(point.run), error)


class LocalPool:
    """Points in a local process pool. The seam a cluster executor plugs into: submit, then drain."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = ProcessPoolExecutor(max_workers=workers)

    def run(self, points, points_dir: Path, timeout: int, threads: int):
        futures = {self.pool.submit(execute_point, p, str(points_dir), timeout, threads): p for p in points}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                yield f.result()

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


EXECUTORS = ("local", "ray")


def make_pool(executor: str, workers: int, sweep_dir: Path, spec: grid.GridSpec, address: str | None):
    """The one seam between the sweep and where its points run: local processes or a Ray cluster."""
    if executor == "local":
        return LocalPool(workers)
    from .cluster import RayPool

    return RayPool(address, sweep_dir, spec.resources)


def run_sweep(
    spec: grid.GridSpec,
    results_root: str | Path = "results",
    name: str | None = None,
    workers: int = 0,
    timeout: int = 600,
    resume: bool = False,
    quiet: bool = False,
    executor: str = "local",
    address: str | None = None,
) -> Path:
    """Run every point not yet finished, collect results.parquet and write sweep.json; returns the sweep folder."""
    workers = workers or os.cpu_count() or 1
    ensure_kernel()
    sweep_dir = Path(results_root).resolve() / (name or spec.name)
    points_dir = sweep_dir / "points"
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}: allowed executors are {list(EXECUTORS)}")
    if executor == "ray":
        from .cluster import require_ray

        require_ray()
    if executor == "local" and any(p.run.backend == "cuda" for p in spec.points):
        from .device import require_cuda

        require_cuda()
    if sweep_dir.exists() and not resume and any(points_dir.glob("*/result.json")):
        raise ValueError(f"{sweep_dir} already holds results: pass --resume to continue it, or choose another --name")
    points_dir.mkdir(parents=True, exist_ok=True)
    for stale in points_dir.glob(".*"):  # left by a killed run (and Ray's scratch)
        shutil.rmtree(stale, ignore_errors=True)
    done = {p.name for p in points_dir.iterdir() if (p / store.RESULT).exists()}
    todo = [p for p in spec.points if p.id not in done]
    started = datetime.now(UTC).isoformat(timespec="seconds")
    threads = max(1, (os.cpu_count() or 1) // workers)
    failed: list[str] = []
    t0 = time.perf_counter()
    if todo:
        pool = make_pool(executor, min(workers, len(todo)), sweep_dir, spec, address)
        try:
            bar = tqdm(
                total=len(spec.points),
                initial=len(spec.points) - len(todo),
                desc=f"sweep {sweep_dir.name}",
                unit="pt",
                disable=quiet,
            )
            for point_id, status, error in pool.run(todo, points_dir, timeout, threads):
                bar.update(1)
                if status != "ok":
                    failed.append(point_id)
                    bar.write(f"point {point_id} failed: {error.splitlines()[0] if error else ''}")
            bar.close()
        finally:
            pool.close()
    df = store.collect(sweep_dir)
    counts = df["status"].value_counts().to_dict() if len(df) else {}
    summary = {
        "name": sweep_dir.name,
        "spec": spec.source,
        "points": len(spec.points),
        "ok": int(counts.get("ok", 0)),
        "failed": int(counts.get("failed", 0)),
        "started": started,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "executor": executor,
        "workers": workers,
        "threads_per_point": threads,
        "env": environment(),
    }
    write_atomic(sweep_dir / "sweep.json", json.dumps(summary, indent=1))
    store.write_index(results_root)
    return sweep_dir


def main(args) -> int:
    try:
        spec = grid.load(args.spec, args.preset)
        sweep_dir = run_sweep(
            spec,
            args.results,
            args.name,
            args.workers,
            args.timeout,
            args.resume,
            executor=args.executor,
            address=args.address,
        )
    except ValueError as err:
        print(f"mtplab sweep: {err}", file=sys.stderr)
        return 2
    s = json.loads((sweep_dir / "sweep.json").read_text())
    print(f"{sweep_dir}: {s['ok']} ok, {s['failed']} failed of {s['points']} points in {s['wall_seconds']}s")
    return 0 if s["failed"] == 0 else 1
