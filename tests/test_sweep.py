"""Sweeps through papermill: grid validation, execution, resume after a kill, failures, and the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from mtplab import grid, store
from mtplab.device import cuda_available
from mtplab.report import make_report
from mtplab.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, tiny):
    root = tmp_path_factory.mktemp("results")
    sweep_dir = run_sweep(grid.load(preset="smoke"), root, quiet=True)
    return sweep_dir


def test_smoke_sweep_writes_one_row_per_point(smoke):
    spec = grid.load(preset="smoke")
    df = pd.read_parquet(smoke / "results.parquet")
    assert sorted(df.point_id) == sorted(p.id for p in spec.points)
    assert (df.status == "ok").all() and df.lossless.all()
    assert {"speedup", "slots.verify.replays", "theory.speedup", "config.k"} <= set(df.columns)
    s = json.loads((smoke / "sweep.json").read_text())
    assert (s["ok"], s["failed"], s["points"]) == (len(spec.points), 0, len(spec.points))
    for p in spec.points:
        point = smoke / "points" / p.id
        assert {"result.json", "run_point.ipynb", "point.png"} <= {f.name for f in point.iterdir()}


def test_report_html_embeds_the_figures(smoke):
    html = make_report(smoke).read_text()
    assert html.count("data:image/png;base64") >= 6
    assert "token-identical to greedy" in html and "Best k per alpha" in html
    assert "import " not in html  # --no-input: code-free
    assert (smoke.parent / "index.html").read_text().count("report.html") >= 1


def test_a_relative_results_folder_works(tmp_path, tiny, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = grid.parse({"name": "rel", "defaults": {"preset": "tiny", "tokens": 8}, "k": [1]})
    sweep_dir = run_sweep(spec, "results", quiet=True)
    assert (tmp_path / "results" / "rel" / "points" / spec.points[0].id / "result.json").exists()
    assert (store.load(sweep_dir).status == "ok").all()


def test_resume_runs_nothing_when_finished(smoke):
    before = {p.name: p.stat().st_mtime_ns for p in (smoke / "points").iterdir()}
    run_sweep(grid.load(preset="smoke"), smoke.parent, resume=True, quiet=True)
    assert {p.name: p.stat().st_mtime_ns for p in (smoke / "points").iterdir()} == before


def test_rerun_without_resume_refuses(smoke):
    with pytest.raises(ValueError, match="--resume"):
        run_sweep(grid.load(preset="smoke"), smoke.parent, quiet=True)


def test_killed_sweep_resumes_with_every_point_exactly_once(tmp_path, tiny):
    cmd = [
        sys.executable,
        "-m",
        "mtplab.cli",
        "sweep",
        "--preset",
        "smoke",
        "--results",
        str(tmp_path),
        "--workers",
        "2",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    points = tmp_path / "smoke" / "points"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(points.glob("*/result.json"))) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(list(points.glob("*/result.json")))
    assert 2 <= finished < len(grid.load(preset="smoke").points), "the kill should land mid-sweep"
    assert subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True).returncode == 0
    df = pd.read_parquet(tmp_path / "smoke" / "results.parquet")
    assert df.point_id.is_unique and len(df) == len(grid.load(preset="smoke").points) and (df.status == "ok").all()
    assert not [p for p in points.iterdir() if p.name.startswith(".")]


def test_a_failing_point_is_recorded_and_the_sweep_completes(tmp_path, tiny, monkeypatch, failing_notebooks):
    spec = grid.parse({"name": "mixed", "defaults": {"preset": "tiny", "tokens": 16}, "k": [1, 2]})
    monkeypatch.setenv("MTPLAB_NOTEBOOKS", str(failing_notebooks))
    sweep_dir = run_sweep(spec, tmp_path / "results", quiet=True)
    df = store.load(sweep_dir)
    assert sorted(df.status) == ["failed", "ok"]
    failed = df[df.status == "failed"].iloc[0]
    assert failed.k == 2 and "planted failure at k=2" in failed.error
    assert (sweep_dir / "points" / failed.point_id / "run_point.ipynb").exists()
    assert json.loads((sweep_dir / "sweep.json").read_text())["failed"] == 1


@pytest.mark.parametrize(
    "source, message",
    [
        ({"k": [1], "alpah": [0.5]}, "unknown key 'alpah'"),
        ({"k": []}, "'k' in the spec is an empty list"),
        ({"policy": ["tiled"]}, "policy in the spec: unknown policy 'tiled'"),
        ({"grids": [{"commit": ["rewind"]}]}, r"commit in grids\[0\]: unknown commit 'rewind'"),
        ({"k": 3}, "'k' in the spec must be a list"),
        ({"repeats": 0}, "'repeats' must be an integer >= 1"),
    ],
)
def test_bad_grid_spec_fails_before_any_point_naming_the_key(source, message):
    with pytest.raises(ValueError, match=message):
        grid.parse({"defaults": {"preset": "tiny"}} | source)


def test_default_grid_covers_every_policy_commit_k_and_alpha():
    pts = grid.load(preset="default").points
    runs = [p.run for p in pts]
    assert {r.policy for r in runs} == {"shared-jit", "shared-max", "sibling", "sibling-pinned"}
    assert {r.commit for r in runs} == {"readvance-batched", "readvance-m1", "select"}
    assert {r.k for r in runs} == {1, 2, 3, 4} and {0.5, 0.7, 0.9} <= {r.alpha for r in runs}
    assert len({p.id for p in pts}) == len(pts)


def test_grid_spec_file(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "defaults": {"preset": "tiny"}, "k": [1, 2], "repeats": 2}))
    spec = grid.load(path)
    assert spec.name == "g" and len(spec.points) == 4


@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA backend")
def test_a_cuda_sweep_without_a_gpu_fails_before_writing_anything(tmp_path):
    with pytest.raises(ValueError, match=r"pip install 'mtplab\[gpu\]'"):
        run_sweep(grid.load(preset="cuda"), tmp_path / "results", quiet=True)
    assert not (tmp_path / "results").exists()
