"""Where sweep points run: a local process pool whose workers die with the sweep (or Ray: mtplab.sweep.cluster).

Pools submit lazily, at most one point per worker in flight, so a stopped sweep starts nothing
new; `cancel` ends the running points.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from mtplab.sweep import grid
from mtplab.sweep.point_exec import Outcome, execute_point, record_failure

PR_SET_PDEATHSIG = 1  # linux/prctl.h


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
        # Spawned, not forked: a fork copies locks that the parent's other threads (numpy's BLAS, onnxruntime's
        # pools, Ray's and gRPC's) may hold at that moment, and a forked worker can wait on one forever (seen after
        # Ray ran in the process). A spawned worker starts clean, a second or two later, as the sweep's own child.
        return ProcessPoolExecutor(max_workers=self.workers, initializer=die_with_parent, initargs=(os.getpid(),),
                                   mp_context=multiprocessing.get_context("spawn"))

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
    from mtplab.sweep.cluster import RayPool

    return RayPool(address, sweep_dir, spec.resources)
