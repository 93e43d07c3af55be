"""Sweeps on a local Ray (2 CPUs): same points and tokens as the local pool, worker deaths, failures, resume."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from mtplab.sweep import grid
from mtplab.sweep.run import run_sweep

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'mtplab[cluster]' (make test installs it)")
psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory):
    """A local Ray whose workers run a run_point that raises at k=2 (a planted failure; the local pool's is real)."""
    from conftest import planted_notebooks

    failing = planted_notebooks(tmp_path_factory.mktemp("ray-notebooks") / "nb",
                                ["if point.get('k') == 2:\n", "    raise RuntimeError('planted failure at k=2')\n"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(tmp_path_factory.mktemp("ray")),
             runtime_env={"env_vars": {"MTPLAB_NOTEBOOKS": str(failing)}})
    yield
    ray.shutdown()


def _tokens(sweep_dir: Path) -> dict[str, list[int]]:
    df = pd.read_parquet(sweep_dir / "results.parquet")
    return {r.point_id: json.loads(r.tokens) for r in df.itertuples()}


def _spec(ks: list[int]):
    """Quick points (one round of 16 tokens each): what a cluster run must get right is where they run."""
    return grid.parse({"name": "ray", "defaults": {"model": "tiny", "tokens": 16, "rounds": 1, "drafter": "oracle",
                                                  "alpha": 0.7}, "k": ks})


@pytest.mark.full
def test_ray_sweep_matches_the_local_pool(tmp_path, tiny, ray_session):
    spec = _spec([3])
    local = run_sweep(spec, tmp_path / "local", quiet=True)
    remote = run_sweep(spec, tmp_path / "ray", executor="ray", quiet=True)
    assert _tokens(local) == _tokens(remote)
    assert json.loads((remote / "sweep.json").read_text())["executor"] == "ray"
    assert all((remote / "points" / p.id / "run_point.ipynb").exists() for p in spec.points)
    # resume: a second run of a finished sweep executes nothing
    before = {p.name: p.stat().st_mtime_ns for p in (remote / "points").iterdir()}
    run_sweep(spec, tmp_path / "ray", executor="ray", resume=True, quiet=True)
    assert {p.name: p.stat().st_mtime_ns for p in (remote / "points").iterdir()} == before


def _kill_one_worker(stop: threading.Event, killed: list) -> None:
    while not stop.is_set() and not killed:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if "ray::run_point_task" in cmd:
                time.sleep(1.0)  # let it get into the point
                try:
                    proc.kill()
                    killed.append(proc.pid)
                except psutil.NoSuchProcess:
                    continue
                return
        time.sleep(0.1)


@pytest.mark.full
def test_a_killed_worker_is_retried_a_point_that_raises_is_recorded_and_every_point_lands_once(
        tmp_path, tiny, ray_session):
    spec = _spec([1, 2, 3])
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_one_worker, args=(stop, killed))
    killer.start()
    try:
        sweep_dir = run_sweep(spec, tmp_path, executor="ray", quiet=True)
    finally:
        stop.set()
        killer.join()
    assert killed, "no Ray worker was seen running a point"
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert df.point_id.is_unique and sorted(df.point_id) == sorted(p.id for p in spec.points)
    # suspect: a side beyond its timing band, a verdict on the machine's load, not on where the point ran
    assert sorted(df.status.replace("suspect", "ok")) == ["failed", "ok", "ok"]
    assert "planted failure at k=2" in df[df.status == "failed"].error.iloc[0]


def test_ray_executor_without_ray_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ValueError, match=r"pip install 'mtplab\[cluster\]'"):
        run_sweep(grid.load(preset="smoke"), tmp_path, executor="ray", quiet=True)


def test_a_cluster_address_nothing_answers_is_refused_before_the_calibration(tmp_path):
    import socket

    from mtplab.sweep.cluster import address_problem

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=rf"--address 127.0.0.1:{port}: nothing answers there"):
            run_sweep(grid.load(preset="smoke"), tmp_path, executor="ray", address=f"127.0.0.1:{port}", quiet=True)
    assert not list(tmp_path.iterdir())  # no sweep folder, no calibration
    assert "host:port or ray://host:port" in address_problem("bogus")
    assert address_problem("auto") is None and address_problem(None) is None


def test_resources_can_be_overridden_in_the_spec():
    spec = grid.parse({"defaults": {"model": "tiny"}, "k": [1], "resources": {"num_cpus": 2}})
    assert spec.resources == {"num_cpus": 2}
    with pytest.raises(ValueError, match="unknown key 'gpus' in resources"):
        grid.parse({"defaults": {"model": "tiny"}, "k": [1], "resources": {"gpus": 1}})
