"""`mtplab sweep`: every point runs notebooks/run_point.ipynb through papermill, in a process pool.

Each point executes in a hidden temporary folder that is renamed to points/<id>/ only when it
is complete, so a killed sweep leaves no half-written point and `--resume` skips finished ones.
One sweep at a time holds a results folder (a lock); the first SIGINT/SIGTERM lets the running
points finish and starts no more, the second cancels them; either way what finished is collected.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from tqdm import tqdm

from mtplab.base import paths
from mtplab.base.files import output_folder_problem, write_atomic
from mtplab.base.lock import folder_lock
from mtplab.base.memory import calibration_pages
from mtplab.measure.env import environment
from mtplab.sweep import grid, store
from mtplab.sweep.calibration import CalibrationInterrupted, calibrate_sweep, previous_check, recheck_calibration
from mtplab.sweep.kernel import ensure_kernel
from mtplab.sweep.point_exec import point_run
from mtplab.sweep.pool import EXECUTORS, make_pool

LOCK = ".sweep.lock"
INTERRUPTED = 130  # exit status of a sweep stopped by SIGINT/SIGTERM (128 + SIGINT)


class Stopper:
    """SIGINT/SIGTERM while points run: the first stops submitting, the second cancels the running ones."""

    def __init__(self, pool):
        self.pool, self.signals = pool, 0

    def __call__(self, signum, frame) -> None:
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals == 1:
            print(
                f"\n{name}: starting no new points; the running ones finish (send it again to cancel them)",
                file=sys.stderr,
            )
        else:
            print(f"\n{name} again: cancelling the running points", file=sys.stderr)
            self.pool.cancel()

    def stopping(self) -> bool:
        return self.signals > 0

    def install(self) -> dict:
        """Install for SIGINT and SIGTERM (main thread only); returns the previous handlers."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self) for sig in (signal.SIGINT, signal.SIGTERM)}


def quarantine_corrupt(spec: grid.GridSpec, points_dir: Path) -> list[str]:
    """Move every unusable point folder into points/.corrupt/, naming it and why; returns their ids."""
    configs = {p.id: asdict(p.run) for p in spec.points}
    moved = []
    for folder in store.point_folders(points_dir):
        reason = store.corrupt_reason(folder, configs.get(folder.name))
        if reason:
            dest = store.move_corrupt(points_dir, folder)
            print(f"point {folder.name}: {reason}; moved to {dest}, it runs again", file=sys.stderr)
            moved.append(folder.name)
    return moved


def run_sweep(
    spec: grid.GridSpec,
    results_root: str | Path | None = None,
    name: str | None = None,
    workers: int = 1,
    timeout: int = 600,
    resume: bool = False,
    quiet: bool = False,
    executor: str = "local",
    address: str | None = None,
    calibration: str = "cached",
) -> Path:
    """Run every point not yet finished, collect results.parquet and write sweep.json; returns the sweep folder.

    sweep.json's `interrupted` is true when a signal stopped the sweep before every point ran.
    calibration: "fresh" measures the cost model at the sweep's start, under its conditions (what
    `mtplab sweep` does); "cached" uses this machine's cached one where there is one, and says so.
    results_root: where sweeps live (default: mtplab.base.paths.results_root()).
    A resumed sweep keeps the calibration it started with. Either way its points use calibration.json.
    """
    if calibration not in ("fresh", "cached"):
        raise ValueError(f"calibration={calibration!r}: allowed values are ['fresh', 'cached']")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r}: must be an integer >= 1")
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}: allowed executors are {list(EXECUTORS)}")
    if name is not None and (problem := grid.check_name(name)):
        raise ValueError(problem.replace("name=", "--name ", 1))
    grid.require_engines(spec)
    grid.check_models(spec)
    ensure_kernel()
    results_root = Path(results_root).resolve() if results_root is not None else paths.results_root()
    sweep_dir = results_root / (name or spec.name)
    points_dir = sweep_dir / "points"
    if executor == "ray":
        from mtplab.sweep.cluster import address_problem, require_ray

        require_ray()
        if problem := address_problem(address):
            raise ValueError(problem)
    if executor == "local" and any(p.run.backend == "cuda" for p in spec.points):
        from mtplab.runtime.device import require_cuda

        require_cuda()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with folder_lock(sweep_dir / LOCK, f"sweep folder {sweep_dir}"):
        if not resume and any(points_dir.glob("*/result.json")):
            raise ValueError(
                f"{sweep_dir} already holds results: pass --resume to continue it, or choose another --name"
            )
        wanted = {p.id for p in spec.points}
        others = [f.name for f in store.point_folders(points_dir) if f.name not in wanted]
        if others:  # its table and report would mix two specs' points under the new spec's name
            raise ValueError(
                f"{sweep_dir} holds {len(others)} point(s) this spec does not name (e.g. {others[0]}): --resume continues "
                "the spec a sweep ran (or one that adds points to it); give that spec, or choose another --name"
            )
        if problem := pages_problem(sweep_dir):
            raise ValueError(problem)
        return _run_locked(spec, sweep_dir, results_root, workers, timeout, quiet, executor, address, calibration)


def pages_problem(sweep_dir: Path) -> str | None:
    """Why a resumed sweep's points would run on other pages than its calibration was measured on (its points so far
    ran as it did): malloc's memory on huge pages or not, as GLIBC_TUNABLES sets it (mtplab.base.memory); None where
    they match or nothing was calibrated yet."""
    held = sweep_dir / "calibration.json"
    if not held.exists():
        return None
    now = calibration_pages()
    for name, calib in json.loads(held.read_text()).items():
        then = calib.get("key", {}).get("malloc_hugetlb")
        if then != now:
            return (f"{sweep_dir.name} was calibrated ({name}) with malloc's memory on {_pages_said(then)}, and "
                    f"this resume would run its points on {_pages_said(now)}: its points would mix the two. Resume it "
                    "as it started (" + (f"GLIBC_TUNABLES with glibc.malloc.hugetlb={then}" if then else
                                         "without glibc.malloc.hugetlb in GLIBC_TUNABLES") + "), or give another --name")
    return None


def _pages_said(hugetlb: str | None) -> str:
    return f"glibc.malloc.hugetlb={hugetlb} (huge pages)" if hugetlb else "4 KiB pages"


def _run_locked(spec, sweep_dir: Path, results_root, workers, timeout, quiet, executor, address, calibration) -> Path:
    points_dir = sweep_dir / "points"
    points_dir.mkdir(parents=True, exist_ok=True)
    store.clear_scratch(points_dir)  # left by a killed run (and Ray's scratch)
    quarantine_corrupt(spec, points_dir)
    done = {p.name for p in store.point_folders(points_dir) if (p / store.RESULT).exists()}
    todo = [p for p in spec.points if p.id not in done]
    threads = max(1, (os.cpu_count() or 1) // workers)  # a point's, unless its spec sets them
    used = sorted({point_run(p, threads).threads for p in spec.points})
    if not quiet:
        print(
            f"sweep {sweep_dir.name}: {len(todo)} of {len(spec.points)} points to run, {workers} at a time with "
            f"{' or '.join(map(str, used))} thread(s) each" + (" (one at a time: timings you can trust)" if workers == 1 else ""),
            file=sys.stderr,
        )
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    interrupted = calibrated = False
    if todo:
        try:
            calibrate_sweep(spec, sweep_dir, threads, quiet, fresh=calibration == "fresh")
            calibrated = True
        except CalibrationInterrupted as err:  # no point has run: what a resume starts with
            interrupted = True
            print(f"\n{err}: the calibration was being measured; no point ran", file=sys.stderr)
    if calibrated:
        pool = make_pool(executor, min(workers, len(todo)), sweep_dir, spec, address)
        stopper = Stopper(pool)
        previous = stopper.install()
        try:
            counts: Counter = Counter()
            bar = tqdm(
                total=len(spec.points),
                initial=len(spec.points) - len(todo),
                desc=f"sweep {sweep_dir.name}",
                unit="pt",
                disable=quiet,
            )
            for point_id, status, message in pool.run(todo, points_dir, timeout, threads, stopper.stopping):
                bar.update(1)
                counts[status] += 1
                bar.set_postfix_str(progress(counts), refresh=True)
                if status != "ok":
                    bar.write(f"point {point_id} {status}: {store.error_summary(message)}")
            bar.close()
        finally:
            pool.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        interrupted = stopper.stopping() and sum(counts.values()) < len(todo)
        store.clear_scratch(points_dir)
    df = store.collect(sweep_dir)
    counts = df["status"].value_counts().to_dict() if len(df) else {}
    if calibrated and not quiet:
        print(f"sweep {sweep_dir.name}: measuring greedy and T(M) again, to see how far the machine moved while the "
              "points ran (half a minute or so)", file=sys.stderr)
    summary = {
        "name": sweep_dir.name,
        "spec": spec.source,
        "points": len(spec.points),
        **{status: int(counts.get(status, 0)) for status in store.STATUSES},
        "interrupted": interrupted,
        "allow_mismatch": spec.allow_mismatch,
        "started": started,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "executor": executor,
        "workers": workers,
        "threads_per_point": used[0] if len(used) == 1 else used,  # what the points ran (the spec's, else the sweep's)
        "load_start": round(load_start, 2),
        "load_end": round(os.getloadavg()[0], 2),
        "calibration_check": recheck_calibration(sweep_dir) if calibrated else previous_check(sweep_dir),
        "env": environment(),
    }
    write_atomic(sweep_dir / "sweep.json", json.dumps(summary, indent=1))
    store.write_index(results_root)
    return sweep_dir


def progress(counts: dict) -> str:
    """The counts the progress line and the summary show (store.status_counts)."""
    return store.status_counts(counts)


def exit_status(summary: dict, allow_mismatch: bool) -> int:
    """130 when interrupted; 1 when a point failed, or mismatched without allow_mismatch; else 0."""
    if summary.get("interrupted"):
        return INTERRUPTED
    if summary["failed"] or (summary["mismatch"] and not allow_mismatch):
        return 1
    return 0


def resume_command(argv: list[str]) -> str:
    """The command line that resumes this sweep."""
    args = [a for a in argv if a != "--resume"]
    return "mtplab " + " ".join(shlex.quote(a) for a in args) + " --resume"


def option_problems(args) -> list[str]:
    """Every problem with `mtplab sweep`'s options, found before any work."""
    problems = []
    if args.workers is not None and not (isinstance(args.workers, int) and args.workers >= 1):
        problems.append(f"--workers {args.workers}: must be an integer >= 1")
    if not (isinstance(args.timeout, int) and args.timeout >= 1):
        problems.append(f"--timeout {args.timeout}: must be an integer number of seconds >= 1")
    if args.executor not in EXECUTORS:
        problems.append(f"--executor {args.executor}: allowed executors are {list(EXECUTORS)}")
    elif args.address is not None and args.executor != "ray":
        problems.append(f"--address {args.address}: a Ray cluster's address, for --executor ray only "
                        f"(this sweep runs on --executor {args.executor})")
    if args.name is not None and (problem := grid.check_name(args.name)):
        problems.append(problem.replace("name=", "--name ", 1))
    try:
        spec = grid.load(args.spec, args.preset, max_points=None if getattr(args, "yes", False) else grid.MAX_POINTS)
    except ValueError as err:
        spec = None
        problems.append(str(err))
    root = Path(args.results) if args.results is not None else paths.results_root()
    if problem := output_folder_problem("--results", root):
        problems.append(problem)
    elif spec is not None and (problem := output_folder_problem("the sweep folder", root / (args.name or spec.name))):
        problems.append(problem + " (choose another --name)")
    return problems, spec


def main(args) -> int:
    problems, spec = option_problems(args)
    if problems:
        print(
            "mtplab sweep: " + "\n  ".join(["bad options:", *problems] if len(problems) > 1 else problems),
            file=sys.stderr,
        )
        return 2
    try:
        sweep_dir = run_sweep(
            spec,
            args.results,
            args.name,
            args.workers,
            args.timeout,
            args.resume,
            executor=args.executor,
            address=args.address,
            calibration="cached" if args.reuse_calibration else "fresh",
        )
    except ValueError as err:
        print(f"mtplab sweep: {err}", file=sys.stderr)
        return 2
    s = store.read_summary(sweep_dir)
    finished = sum(s.get(status, 0) for status in store.STATUSES)
    print(f"{sweep_dir}: {progress(s)} of {s['points']} points in {s['wall_seconds']}s")
    if s["interrupted"]:
        print(
            f"interrupted: {finished} of {s['points']} points finished and collected; "
            f"the rest run with: {resume_command(getattr(args, 'argv', sys.argv[1:]))}",
            file=sys.stderr,
        )
    return exit_status(s, args.allow_mismatch or spec.allow_mismatch)
