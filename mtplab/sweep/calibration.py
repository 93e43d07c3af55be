"""A sweep's cost-model calibration: measured (or taken from this machine's cache) for every CPU mtplab model of
the sweep before its points run, each in a process of its own, and measured again at the end to see how far the
machine drifted meanwhile."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import threading
from pathlib import Path

from mtplab.base.files import write_atomic
from mtplab.measure.result import dumps
from mtplab.sweep import store


def calibrate_sweep(spec, sweep_dir: Path, threads: int, quiet: bool, fresh: bool = False) -> None:
    """The cost model's calibration for every CPU mtplab model of the sweep, on the points' threads, written to
    calibration.json beside the sweep (the points read it there): measured now when `fresh` or when this
    machine has none cached, else the cached one; each says which (`source`). A resumed sweep keeps the ones it
    started with, and gets those of models it did not hold yet (a grid grown by the resume), so that every point
    is predicted from the sweep's calibration.
    """
    from mtplab.experiment.calibrate import cache_key, cache_path
    from mtplab.experiment.config import model_name

    target, target_batched = sweep_dir / "calibration.json", sweep_dir / "calibration_batch.json"
    resumed = target.exists()  # its points so far were predicted from this one
    calibrations = json.loads(target.read_text()) if resumed else {}
    batched = json.loads(target_batched.read_text()) if resumed and target_batched.exists() else {}
    held = set(calibrations) | set(batched)
    cpu = [p.run for p in spec.points if p.run.engine == "mtplab" and p.run.backend == "cpu"]
    # (model, int4, threads, batch): a preset's int4 form is a model of its own, calibrated apart ("tiny-int4");
    # calibration.json keeps one per model (the sweep's threads first), calibration_batch.json one per model and B > 1
    wanted = sorted({(r.model, r.int4, r.threads or threads, 1) for r in cpu}
                    | {(r.model, r.int4, r.threads or threads, r.batch) for r in cpu if r.batch > 1},
                    key=lambda pt: (pt[0], pt[1], pt[3], pt[2] != threads, pt[2]))
    for spec_, int4, n, B in wanted:
        name = model_name(spec_, int4) + (f"/{B}" if B > 1 else "")
        into = calibrations if B == 1 else batched
        if name in into:
            continue
        path = cache_path(cache_key(spec_, n, int4=int4, batch=B))
        measure = fresh or not path.exists()
        if measure:  # in a process of its own: the sweep process runs no onnxruntime session
            if not quiet:
                print(f"sweep {sweep_dir.name}: measuring the calibration of {name}" + (f" (batch {B})" if B > 1 else "")
                      + f" on {n} threads", file=sys.stderr)
            _calibrate([sys.executable, "-m", "mtplab", "calibrate", "--model", spec_, "--threads", str(n),
                        *(["--batch", str(B)] if B > 1 else []), *(["--int4"] if int4 else [])])
        calib = json.loads(path.read_text())
        calib["source"] = "measured at the sweep's start" if measure else "cached on this machine (--reuse-calibration)"
        if resumed:
            calib["source"] += ", when the sweep was resumed"
        if B == 1:
            calib["model_spec"], calib["int4"] = spec_, int4
        into[name] = calib
    added = sorted((set(calibrations) | set(batched)) - held)
    if resumed and not quiet:
        print(f"sweep {sweep_dir.name}: keeping the calibration it started with"
              + (f", adding {', '.join(added)} (models it did not hold)" if added else ""), file=sys.stderr)
    if resumed and not added:
        return
    if batched:  # written first: calibration.json's presence marks the sweep's calibration as complete
        write_atomic(target_batched, dumps(batched, indent=1))
    if calibrations:
        write_atomic(target, dumps(calibrations, indent=1))


class CalibrationInterrupted(Exception):
    """SIGINT or SIGTERM while the sweep's calibration was measured (its process stopped): the sweep ends as
    interrupted, before any point."""


def _calibrate(cmd: list[str]) -> str:
    """Run `mtplab calibrate` in a process of its own; its standard output. ValueError with its own last words if it
    fails (before any point runs: a model folder it cannot run, say). SIGINT or SIGTERM stops that process and raises
    CalibrationInterrupted."""
    import subprocess

    caught: list[str] = []
    running: list = []  # the calibration's process, once started

    def stop(signum, frame) -> None:
        caught.append(signal.Signals(signum).name)
        for child in running:
            child.terminate()

    previous = {}  # installed before the process starts: a signal in between must not kill this one and orphan it
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        running.append(child)
        if caught:  # a signal before the process existed
            child.terminate()
        out, err = child.communicate()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught:
        raise CalibrationInterrupted(caught[0])
    if child.returncode:
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in (err + out).splitlines()]
        lines = [line for line in lines if line]
        # onnxruntime's own log lines repeat what the error says, at length
        said = ([line for line in lines if not re.search(r"\[[EWI]:onnxruntime", line)] or lines)[-12:]
        when = "at the sweep's end" if "--recheck" in cmd else "before any point ran"
        raise ValueError(f"the calibration failed (exit {child.returncode}) {when}: `{shlex.join(['mtplab', *cmd[3:]])}` "
                         "said:\n  " + "\n  ".join(said or ["nothing"]))
    return out


def recheck_calibration(sweep_dir: Path) -> dict:
    """What every prediction divides, for each calibrated model, measured again at the sweep's end beside the values
    measured at its start: greedy's cost per token (how far the machine moved while the points ran) and each T(M)
    over T(1) (whether the cost ratios the predictions and efficiencies use held: on small, four sweeps' calibrations
    gave T(5)/T(1) from 1.34 to 1.56). Measured as the calibration was, in a process of its own on one thread pool
    (`mtplab calibrate --recheck`): in this process, on pools of their own with spinning off, small's greedy ran
    25-30% slower at 2 threads, which read as a machine that moved. A model whose re-check fails or is interrupted
    has none (the points are done; the summary is written)."""
    path = sweep_dir / "calibration.json"
    out = {}
    for name, calib in (json.loads(path.read_text()) if path.exists() else {}).items():
        start = calib.get("greedy_token")
        if start is None or "model_spec" not in calib:
            continue
        try:
            said = _calibrate([sys.executable, "-m", "mtplab", "calibrate", "--recheck", "--model",
                               calib["model_spec"], "--threads", str(calib["key"]["threads"]),
                               *(["--int4"] if calib.get("int4") else [])])
            now = json.loads(said.strip().splitlines()[-1])
            end, ratios_end = now["greedy_token"], now["ratio_to_t1"]
        except CalibrationInterrupted as err:  # one signal stops every model's re-check
            print(f"sweep {sweep_dir.name}: the re-check at the end stopped ({err}): "
                  f"{', '.join(out) or 'no model'} re-checked", file=sys.stderr)
            break
        except (ValueError, IndexError, KeyError) as err:
            print(f"sweep {sweep_dir.name}: the re-check of {name} at the end did not run: {err}", file=sys.stderr)
            continue
        out[name] = {"greedy_token_start": start, "greedy_token_end": end, "drift": end / start - 1,
                     "load_end": round(os.getloadavg()[0], 2)} | ratio_drift(calib.get("ratio_to_t1") or {}, ratios_end)
    return out


def ratio_drift(start: dict, end: dict) -> dict:
    """{"ratios": {M: [T(M)/T(1) at the start, at the end]}, "ratio_drift": the largest end / start - 1 by size, and
    "ratio_drift_m": its M} over the sizes both hold ({} where none: a calibration from before ratios were kept)."""
    both = sorted((int(name.split("/")[1]), start[name], end[name]) for name in set(start) & set(end)
                  if name.startswith("target/") and name != "target/1" and start[name])
    if not both:
        return {}
    m, a, b = max(both, key=lambda row: abs(row[2] / row[1] - 1))
    return {"ratios": {str(M): [a_, b_] for M, a_, b_ in both}, "ratio_drift": b / a - 1, "ratio_drift_m": m}


def previous_check(sweep_dir: Path) -> dict:
    """The calibration check the sweep's last summary holds ({} when there is none, or it is damaged: this run
    writes a new one)."""
    try:
        return store.read_summary(sweep_dir).get("calibration_check", {})
    except ValueError:
        return {}
