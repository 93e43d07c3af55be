"""Where sweep points run: a local process pool whose workers die with the sweep (or Ray: mtplab.cluster).

Pools submit lazily, at most one point per worker in flight, so a stopped sweep starts nothing
new; `cancel` ends the running points.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path

from . import grid, store
from .kernel import ensure_kernel

PR_SET_PDEATHSIG = 1  # linux/prctl.h
Outcome = tuple[str, str, str | None]  # (point id, status, error or lossless verdict)


def notebooks_dir() -> Path:
    """notebooks/ beside the package (an editable install or a checkout), or $MTPLAB_NOTEBOOKS."""
    env = os.environ.get("MTPLAB_NOTEBOOKS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "notebooks"


def point_run(point: grid.Point, threads: int = 0):
    """The RunConfig a point runs: its own, with the sweep's `threads` per point unless the spec fixes them."""
    return point.run if point.run.threads or not threads else point.run.replace(threads=threads)


def point_parameters(point: grid.Point, run_dir: Path, threads: int = 0) -> dict:
    """run_point.ipynb's parameters: the point's RunConfig fields (`point`) and its folder."""
    return {"point": point_run(point, threads).to_dict(), "run_dir": str(run_dir)}


def execute_point(point: grid.Point, points_dir: str, timeout: int, threads: int) -> Outcome:
    """Run one point through papermill into points/<id>/; returns (id, ok|mismatch|failed, error or verdict).

    threads: the intra-op threads of the point's sessions, unless its spec fixes them (RunConfig.threads).
    """
    import papermill as pm

    error = None
    # The folder is absolute: the notebook runs with its cwd there, so a relative run_dir would nest.
    with store.point_folder(points_dir, point.id) as tmp:
        try:
            pm.execute_notebook(
                str(notebooks_dir() / "run_point.ipynb"),
                str(tmp / "run_point.ipynb"),
                parameters=point_parameters(point, tmp, threads),
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
            store.write_error(tmp, asdict(point_run(point, threads)), error)
            return point.id, "failed", error
        result = json.loads((tmp / store.RESULT).read_text())
    return point.id, store.result_status(result), result.get("verdict")


def record_failure(points_dir: Path, point: grid.Point, error: str) -> None:
    """A point that never produced a folder (its worker died): record the cause as its error."""
    with store.point_folder(points_dir, point.id) as tmp:
        store.write_error(tmp, asdict(point.run), error)


def _ignore(signum, frame) -> None:
    """A worker leaves SIGINT/SIGTERM to the sweep (a handler, not SIG_IGN: the kernel it starts gets the defaults)."""


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def die_with_parent(parent: int) -> None:
    """Pool worker start: die with the sweep's main process however it ends, leave signals to it.

    Linux delivers SIGKILL when the parent dies (prctl PR_SET_PDEATHSIG); a thread watching the
    parent pid covers other systems and the race before prctl. The point's Jupyter kernel polls
    its own parent (the worker) and exits after it.
    """
    signal.signal(signal.SIGINT, _ignore)
    signal.signal(signal.SIGTERM, _ignore)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


class LocalPool:
    """Points in a local process pool. The seam a cluster executor plugs into: run, cancel, close."""

    def __init__(self, workers: int):
        self.workers = workers
        self.cancelled = False
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, initializer=die_with_parent, initargs=(os.getpid(),))

    def run(
        self, points, points_dir: Path, timeout: int, threads: int, stopping: Callable[[], bool] = lambda: False
    ) -> Iterator[Outcome]:
        """Yield each point's outcome; submit nothing more once stopping() is true. Cancelled points yield nothing."""
        queue, running = list(points), {}
        broken = False
        while running or (queue and not stopping() and not self.cancelled):
            while queue and len(running) < self.workers and not stopping() and not self.cancelled and not broken:
                p = queue.pop(0)
                running[self.pool.submit(execute_point, p, str(points_dir), timeout, threads)] = p
            done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            for f in done:
                point = running.pop(f)
                try:
                    yield f.result()
                except BrokenProcessPool as err:
                    broken = True
                    if self.cancelled:
                        continue
                    error = f"the worker running this point died: {err}"
                    record_failure(points_dir, point, error)
                    yield point.id, "failed", error
            if broken and not running:  # a worker died (killed, out of memory): go on with a fresh pool
                self.pool.shutdown(wait=True)
                self.pool, broken = self._new_pool(), False

    def cancel(self) -> None:
        """End the running points now (their workers are killed; they stay missing for --resume)."""
        self.cancelled = True
        for proc in list((self.pool._processes or {}).values()):
            proc.kill()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


EXECUTORS = ("local", "ray")


def make_pool(executor: str, workers: int, sweep_dir: Path, spec: grid.GridSpec, address: str | None):
    """The one seam between the sweep and where its points run: local processes or a Ray cluster."""
    if executor == "local":
        return LocalPool(workers)
    from .cluster import RayPool

    return RayPool(address, sweep_dir, spec.resources)
