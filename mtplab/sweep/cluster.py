"""Sweep points as Ray tasks. No shared filesystem: a task returns its point's files to the driver.

Each task runs the same papermill execution as the local pool, in a scratch folder on whatever
node it lands on, and returns every file of the finished point (result.json or error.json, the
executed notebook, the figure). The driver installs them atomically into points/<id>/.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from mtplab.engine.strategies import PLUGINS_ENV

INSTALL_HINT = "the ray executor needs Ray: pip install 'mtplab[cluster]' (or: pip install 'ray>=2.9')"
WORKER_RETRIES = 2  # a worker that dies (not a point that raises) is retried this many times


def require_ray():
    try:
        import ray
    except ImportError as err:
        raise ValueError(INSTALL_HINT) from err
    return ray


def address_problem(address: str | None, timeout: float = 3.0) -> str | None:
    """Why nothing would answer a Ray cluster `address` (host:port, or ray://host:port), or None: told before the
    sweep's calibration, where ray.init would retry for minutes. "auto", "local" and no address are Ray's own."""
    import socket

    if not address or address in ("auto", "local"):
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return f"--address {address}: a Ray cluster's address is host:port or ray://host:port (or auto)"
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        return f"--address {address}: nothing answers there ({err.strerror or err}); is the cluster's head running?"
    return None


def run_point_task(point, timeout: int, threads: int) -> tuple[str, str, str | None, dict[str, bytes]]:
    """Body of a Ray task: execute one point in scratch space and hand back its files."""
    from mtplab.sweep.point_exec import execute_point

    scratch = Path(tempfile.mkdtemp(prefix="mtplab-point-"))
    try:
        point_id, status, error = execute_point(point, str(scratch), timeout, threads)
        folder = scratch / point_id
        files = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        return point_id, status, error, files
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def install_point(points_dir: Path, point_id: str, files: dict[str, bytes]) -> None:
    """Install a point's returned files into points/<id>/, atomically as the local pool does."""
    from mtplab.sweep.store import point_folder

    with point_folder(points_dir, point_id) as tmp:
        for rel, blob in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(blob)


def _short_temp_dir(preferred: Path) -> str:
    # Ray puts unix sockets under its temp dir; their paths must stay under ~107 bytes.
    if len(str(preferred)) <= 48:
        preferred.mkdir(parents=True, exist_ok=True)
        return str(preferred)
    return tempfile.mkdtemp(prefix="mtplab-ray-")


class RayPool:
    """Points as Ray tasks: one CPU each, or one GPU for cuda points, unless the spec overrides."""

    def __init__(self, address: str | None, sweep_dir: Path, resources: dict | None = None):
        ray = self.ray = require_ray()
        self.resources = dict(resources or {})
        self.started_here = not ray.is_initialized()
        if self.started_here:
            # Strategies a plugin registers reach the points: every task imports the same plugin modules. So does
            # malloc's huge pages setting, where GLIBC_TUNABLES gives one: the points run as the calibration did.
            passed = {name: os.environ[name] for name in (PLUGINS_ENV, "GLIBC_TUNABLES") if os.environ.get(name)}
            env = {"env_vars": passed} if passed else None
            if address:
                ray.init(address=address, log_to_driver=False, runtime_env=env)
            else:
                ray.init(
                    num_cpus=os.cpu_count(),
                    include_dashboard=False,
                    log_to_driver=False,
                    _temp_dir=_short_temp_dir(sweep_dir / ".ray"),
                    runtime_env=env,
                )
        self.cancelled, self.running = False, {}
        self.task = ray.remote(max_retries=WORKER_RETRIES, retry_exceptions=False)(run_point_task)

    def options_for(self, point) -> dict:
        opts = {"num_cpus": 1, "num_gpus": 1 if point.run.backend == "cuda" else 0}
        opts.update(self.resources)
        return opts

    def run(self, points, points_dir: Path, timeout: int, threads: int, stopping=lambda: False):
        """As LocalPool.run: at most one task per cluster CPU in flight, nothing new once stopping()."""
        ray = self.ray
        window = max(1, int(ray.cluster_resources().get("CPU", 1)))
        queue, self.running = list(points), {}
        while self.running or (queue and not stopping() and not self.cancelled):
            while queue and len(self.running) < window and not stopping() and not self.cancelled:
                p = queue.pop(0)
                self.running[self.task.options(**self.options_for(p)).remote(p, timeout, threads)] = p
            done, _ = ray.wait(list(self.running), num_returns=1)
            point = self.running.pop(done[0])
            try:
                point_id, status, error, files = ray.get(done[0])
                install_point(points_dir, point_id, files)
            except Exception as err:  # noqa: BLE001 - the worker died past its retries: record the cause
                if self.cancelled:
                    continue
                from mtplab.sweep.point_exec import record_failure

                point_id, status = point.id, "failed"
                error = f"worker lost after {WORKER_RETRIES} retries: {type(err).__name__}: {err}"[:4000]
                record_failure(points_dir, point, error)
            yield point_id, status, error

    def cancel(self) -> None:
        """End the running tasks now; their points stay missing for --resume."""
        self.cancelled = True
        for ref in list(self.running):
            self.ray.cancel(ref, force=True)

    def close(self) -> None:
        if self.started_here:
            self.ray.shutdown()
