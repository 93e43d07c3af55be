"""Sweeps through papermill: grid validation, execution, resume after a kill, failures, and the report."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from html import escape
from pathlib import Path

import pandas as pd
import pytest
import yaml

from mtplab.report.publish import make_report
from mtplab.runtime.device import cuda_available
from mtplab.sweep import grid, store
from mtplab.sweep.run import run_sweep

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
    assert df.status.isin(store.LOSSLESS).all() and df.lossless.all()
    assert {"speedup", "slots.verify.replays", "theory.speedup", "config.k"} <= set(df.columns)
    s = json.loads((smoke / "sweep.json").read_text())
    assert (s["ok"] + s["suspect"], s["failed"], s["points"]) == (len(spec.points), 0, len(spec.points))
    ran = sorted({int(t) for t in df["config.threads"]})  # what the points ran, as the header tells it
    assert s["threads_per_point"] == (ran[0] if len(ran) == 1 else ran)
    for p in spec.points:
        point = smoke / "points" / p.id
        assert {"result.json", "run_point.ipynb", "point.png"} <= {f.name for f in point.iterdir()}


def test_the_reports_thread_line_names_every_count_points_ran_with():
    from mtplab.report.provenance import threads_text

    assert (threads_text(1), threads_text(2), threads_text([1, 2])) == ("1 ORT thread", "2 ORT threads", "1 or 2 ORT threads")


def test_report_html_embeds_the_figures(smoke):
    html = make_report(smoke).read_text()
    assert html.count("data:image/png;base64") >= 6
    assert "token-identical to greedy" in html and "Best k per alpha" in html
    assert "import " not in html  # --no-input: code-free
    assert (smoke.parent / "index.html").read_text().count("report.html") >= 1


def test_a_small_sweeps_report_stands_alone_with_no_empty_panel(smoke):
    html = make_report(smoke).read_text()
    assert "in this sweep" not in html  # no placeholder panel ("no ... in this sweep")
    assert "1 points" not in html
    for provenance in ("fixed parameters", "varied parameters", "repeats", "onnxruntime-genai", "numpy", "load average"):
        assert provenance in html
    assert "How to read this report" in html and "Download every point as CSV" in html
    assert "Recurrent state and KV checked after every commit at 6 of 6 points" in html
    spec = grid.load(preset="smoke")
    assert all(p.id in html for p in spec.points)  # full ids, never truncated
    table = html[re.search(r"<table class=.counters.>", html).start():]
    table = table[: table.index("</table>")]
    assert "<td>" in table  # the slot counters table has rows
    assert not re.search(r"<td>\d+\.0</td>", table)  # counters are integers (a measured share may read 11.0%)


def test_resume_runs_nothing_when_finished(smoke):
    before = {p.name: p.stat().st_mtime_ns for p in (smoke / "points").iterdir()}
    run_sweep(grid.load(preset="smoke"), smoke.parent, resume=True, quiet=True)
    assert {p.name: p.stat().st_mtime_ns for p in (smoke / "points").iterdir()} == before


def test_rerun_without_resume_refuses(smoke):
    with pytest.raises(ValueError, match="--resume"):
        run_sweep(grid.load(preset="smoke"), smoke.parent, quiet=True)


QUICK = {"name": "quick", "defaults": {"model": "tiny", "tokens": 8, "policy": "shared-max"}, "k": [1, 2, 3]}


def sweep_command(tmp_path, spec: dict = QUICK, workers: int = 2) -> list[str]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return [
        sys.executable,
        "-m",
        "mtplab.cli.main",
        "sweep",
        str(path),
        "--results",
        str(tmp_path / "results"),
        "--workers",
        str(workers),
    ]


def start_sweep(cmd: list[str]) -> subprocess.Popen:
    """A sweep in its own process group (as a shell runs it), its output captured."""
    return subprocess.Popen(
        cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(predicate, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


def finished_points(points: Path) -> dict[str, int]:
    """Installed points (not hidden scratch folders) and their result.json's mtime."""
    return {
        p.name: (p / "result.json").stat().st_mtime_ns
        for p in store.point_folders(points)
        if (p / "result.json").exists()
    }


def assert_resume_runs_exactly_the_missing_points(cmd, points: Path, total: int) -> None:
    before = finished_points(points)
    resumed = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{total - len(before)} of {total} points to run" in resumed.stderr, resumed.stderr.replace("\r", "\n")[:600]
    after = finished_points(points)
    assert len(after) == total and all(after[p] == t for p, t in before.items())
    df = pd.read_parquet(points.parent / "results.parquet")
    assert df.point_id.is_unique and len(df) == total and df.status.isin(store.LOSSLESS).all()
    assert not [p for p in points.iterdir() if p.name.startswith(".")]


def test_sigkill_of_the_main_process_leaves_no_worker_and_resume_completes(tmp_path, tiny):
    import psutil

    cmd = sweep_command(tmp_path)
    proc = start_sweep(cmd)
    points = tmp_path / "results" / "quick" / "points"
    wait_for(lambda: len(finished_points(points)) >= 1)
    family = psutil.Process(proc.pid).children(recursive=True)  # pool workers and their kernels
    assert family
    os.kill(proc.pid, signal.SIGKILL)  # the main process only, not its group
    proc.communicate()
    gone, alive = psutil.wait_procs(family, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"still running 10 s after the sweep was killed: {alive}"
    assert 1 <= len(finished_points(points)) < 3, "the kill should land mid-sweep"
    assert_resume_runs_exactly_the_missing_points(cmd, points, 3)


def test_sigint_finishes_running_points_collects_and_resume_runs_the_rest(tmp_path, tiny):
    cmd = sweep_command(tmp_path, QUICK | {"k": [1, 2]}, workers=1)
    proc = start_sweep(cmd)
    points = tmp_path / "results" / "quick" / "points"
    wait_for(lambda: points.exists() and any(p.name.startswith(".") for p in points.iterdir()))  # the first point runs
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "--resume" in err and "interrupted: 1 of 2 points finished" in err
    finished = finished_points(points)
    assert len(finished) == 1, "the running point finishes, no other starts"
    assert not [p for p in points.iterdir() if p.name.startswith(".")], "scratch folders left behind"
    s = json.loads((points.parent / "sweep.json").read_text())
    assert s["interrupted"] and s["ok"] + s["suspect"] == 1
    assert sorted(pd.read_parquet(points.parent / "results.parquet").point_id) == sorted(finished)
    assert_resume_runs_exactly_the_missing_points(cmd, points, 2)


@pytest.mark.parametrize("how", ["Ctrl-C", "kill"])
def test_a_signal_while_the_calibration_is_measured_ends_the_sweep_as_interrupted(tmp_path, tiny, how):
    import psutil

    proc = start_sweep(sweep_command(tmp_path, QUICK | {"k": [1]}, workers=1))
    calibrating = lambda: [c for c in psutil.Process(proc.pid).children() if "calibrate" in c.cmdline()]  # noqa: E731
    wait_for(lambda: bool(calibrating()))
    child = calibrating()[0]
    if how == "Ctrl-C":
        os.killpg(proc.pid, signal.SIGINT)  # the whole process group, the calibration's process too
    else:
        os.kill(proc.pid, signal.SIGTERM)  # the sweep's process only: it stops the calibration's
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    said = "SIGINT" if how == "Ctrl-C" else "SIGTERM"
    assert f"{said}: the calibration was being measured; no point ran" in err and "--resume" in err, err
    assert "Traceback" not in err
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    sweep_dir = tmp_path / "results" / "quick"
    s = json.loads((sweep_dir / "sweep.json").read_text())
    assert s["interrupted"] and s["ok"] == 0 and not (sweep_dir / "calibration.json").exists()
    assert not (sweep_dir / ".sweep.lock").exists() and not list((sweep_dir / "points").iterdir())


def test_a_second_signal_cancels_the_running_points(tmp_path, tiny):
    import psutil

    proc = start_sweep(sweep_command(tmp_path))
    points = tmp_path / "results" / "quick" / "points"
    wait_for(lambda: len(list(points.glob(".*"))) >= 1)  # a point is running
    family = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "cancelling" in err, err
    assert not [p for p in points.iterdir() if p.name.startswith(".")]
    assert not [p for p in psutil.wait_procs(family, timeout=10)[1] if p.status() != psutil.STATUS_ZOMBIE]


def test_a_second_sweep_on_the_same_folder_is_refused_naming_the_holder(tmp_path, tiny):
    one = QUICK | {"k": [1]}
    proc = start_sweep(sweep_command(tmp_path, one, workers=1))
    lock = tmp_path / "results" / "quick" / ".sweep.lock"
    wait_for(lambda: lock.exists() and str(proc.pid) in lock.read_text())
    with pytest.raises(ValueError, match=rf"locked by another process \(pid {proc.pid}, started 20\d\d-"):
        run_sweep(grid.parse(one), tmp_path / "results", resume=True, quiet=True)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    df = pd.read_parquet(tmp_path / "results" / "quick" / "results.parquet")
    assert df.point_id.is_unique and len(df) == 1 and df.status.isin(store.LOSSLESS).all()


@pytest.mark.parametrize("damage, words", [
    (("sweep.json", "{}"), "sweep.json: not a sweep's summary (it lacks name, points, ok, mismatch, failed, interrupted)"),
    (("sweep.json", "x\n{"), "sweep.json: not a sweep's summary (Expecting value"),
    (("results.parquet", "junk"), "results.parquet: not a readable results table (Parquet"),
])
def test_a_damaged_summary_or_table_is_named_before_a_report_starts(smoke, tmp_path, damage, words):
    import shutil

    from mtplab.report.compare import compare_html

    sweep_dir = tmp_path / "smoke"
    shutil.copytree(smoke, sweep_dir, ignore=shutil.ignore_patterns("report.*"))  # another test may have reported
    name, text = damage
    (sweep_dir / name).write_text(text)
    for make in (lambda: make_report(sweep_dir), lambda: compare_html(sweep_dir, sweep_dir)):
        with pytest.raises(ValueError, match=re.escape(words)) as err:
            make()
        assert "--resume" in str(err.value)
    assert not (sweep_dir / "report.ipynb").exists() and not (sweep_dir / "report.html").exists()


def test_a_result_whose_field_has_another_kind_of_value_is_corrupt(smoke, tmp_path):
    import shutil

    folders = store.point_folders(smoke / "points")
    assert folders and all(store.corrupt_reason(f) is None for f in folders)  # what a sweep writes passes
    folder = tmp_path / "point"
    shutil.copytree(folders[0], folder)
    data = json.loads((folder / "result.json").read_text())
    for name, value, words in (("speedup", "fast", "a number"), ("steps", True, "an integer"), ("slots", [], "an object")):
        (folder / "result.json").write_text(json.dumps(data | {name: value}))
        assert store.corrupt_reason(folder) == f"invalid result.json: {name} is {value!r}: it takes {words}"


@pytest.mark.parametrize("edit, words", [
    ({"speedup": float("nan")}, "speedup nan is not the median of its rounds"),
    ({"speedup": 9.88}, "speedup 9.88 is not the median of its rounds"),
    ({"tokens_per_s": "double"}, "tokens_per_s"),
    ({"speedup_ci": [1.0, 1.01]}, "speedup_ci [1.0, 1.01] is not its rounds' bootstrap CI"),
])
def test_a_result_edited_on_disk_is_refused_named_and_not_published(smoke, tmp_path, edit, words):
    import shutil

    sweep_dir = tmp_path / "smoke"
    shutil.copytree(smoke, sweep_dir)
    point = store.point_folders(sweep_dir / "points")[0]
    data = json.loads((point / "result.json").read_text())
    if edit.get("tokens_per_s") == "double":
        edit = {"tokens_per_s": 2 * data["tokens_per_s"]}
    before = (point / "result.json").stat()
    (point / "result.json").write_text(json.dumps(data | edit))
    os.utime(point / "result.json", ns=(before.st_atime_ns, before.st_mtime_ns))  # an edit that kept the file's time
    os.utime(point, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert words in store.corrupt_reason(point)  # a resumed sweep moves it aside and runs it again
    row = next(r for r in store.point_rows(sweep_dir) if r["point_id"] == point.name)
    assert row["status"] == "failed" and words in row["error"] and "speedup" not in row  # no number of it published
    status = "suspect" if data["suspect"] else "ok"  # suspect: a side beyond its timing floor's band
    with pytest.raises(ValueError, match=f"point {point.name}'s status is '{status}' in the table and 'failed' in its folder"):
        store.load(sweep_dir)  # the table collected before the edit says otherwise than the folder now


def test_a_suspect_flag_edited_on_disk_either_way_is_refused(smoke, tmp_path):
    import shutil

    sweep_dir = tmp_path / "smoke"
    shutil.copytree(smoke, sweep_dir)
    point = store.point_folders(sweep_dir / "points")[0]
    data = json.loads((point / "result.json").read_text())
    flipped = [] if data["suspect"] else ["greedy: planted"]  # cleared where its rounds say suspect, else set
    (point / "result.json").write_text(json.dumps(data | {"suspect": flipped}))
    assert f"suspect={flipped!r}, but its rounds' timing floors say" in store.corrupt_reason(point)


def test_a_results_table_edited_on_disk_is_refused_naming_the_point(smoke, tmp_path):
    import shutil

    sweep_dir = tmp_path / "smoke"
    shutil.copytree(smoke, sweep_dir)
    table = pd.read_parquet(sweep_dir / "results.parquet")
    table.loc[0, "speedup"] = 9.88
    table.to_parquet(sweep_dir / "results.parquet", index=False)
    with pytest.raises(ValueError, match=f"point {table.point_id[0]}'s speedup is 9.88 in the table and"):
        store.load(sweep_dir)


def test_a_corrupt_point_is_named_moved_aside_and_run_again(smoke, tmp_path, capsys):
    import shutil

    spec = grid.load(preset="smoke")
    sweep_dir = tmp_path / "smoke"
    shutil.copytree(smoke, sweep_dir)
    bad = spec.points[0].id
    result = sweep_dir / "points" / bad / "result.json"
    truncated = result.read_text()[:400]
    result.write_text(truncated)
    with pytest.raises(ValueError, match=r"older than the points.*mtplab sweep .*--resume"):
        make_report(sweep_dir)
    capsys.readouterr()
    run_sweep(spec, tmp_path, resume=True, quiet=True)
    err = capsys.readouterr().err
    assert f"point {bad}: unreadable result.json" in err and "it runs again" in err
    assert (sweep_dir / "points" / ".corrupt" / bad / "result.json").read_text() == truncated
    assert json.loads(result.read_text())["lossless"] is True
    assert store.load(sweep_dir).status.isin(store.LOSSLESS).all()


def test_a_point_that_fails_its_lossless_check_is_a_mismatch_and_fails_the_sweep(
    tmp_path, tiny, monkeypatch, overaccepting_notebooks, capsys
):
    from mtplab.cli.main import main

    monkeypatch.setenv("MTPLAB_NOTEBOOKS", str(overaccepting_notebooks))
    path = tmp_path / "g.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "m", "defaults": {"model": "tiny", "tokens": 24, "drafter": "oracle", "alpha": 0.5}, "k": [2]}
        )
    )
    args = ["sweep", str(path), "--results", str(tmp_path / "r"), "--workers", "1"]
    assert main(args) == 1
    assert "0 ok, 1 mismatch, 0 failed of 1 points" in capsys.readouterr().out
    df = store.load(tmp_path / "r" / "m")
    assert list(df.status) == ["mismatch"] and not df.lossless.iloc[0] and df.speedup.notna().all()
    assert json.loads((tmp_path / "r" / "m" / "sweep.json").read_text())["mismatch"] == 1
    assert main(args + ["--resume", "--allow-mismatch"]) == 0


def test_a_failing_point_is_recorded_the_sweep_completes_in_a_relative_results_folder_and_its_report_says_so(
        tmp_path, tiny, monkeypatch, failing_notebooks):
    import shutil

    from mtplab.report import findings, provenance, quality

    spec = grid.parse({"name": "mixed", "defaults": {"model": "tiny", "tokens": 16}, "k": [1, 2]})
    monkeypatch.setenv("MTPLAB_NOTEBOOKS", str(failing_notebooks))
    monkeypatch.chdir(tmp_path)
    sweep_dir = run_sweep(spec, "results", quiet=True)
    assert sweep_dir == tmp_path / "results" / "mixed"
    assert (sweep_dir / "points" / spec.points[0].id / "result.json").exists()
    df = store.load(sweep_dir)
    assert sorted(df.status.replace("suspect", "ok")) == ["failed", "ok"]  # suspect: a side beyond its timing band
    failed = df[df.status == "failed"].iloc[0]
    assert failed.k == 2 and "planted failure at k=2" in failed.error
    assert (sweep_dir / "points" / failed.point_id / "run_point.ipynb").exists()
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert sweep["failed"] == 1
    # The report's text reads the failed point's row (no measurements) without tripping on it.
    text = findings.sweep_findings(df)
    assert f"1 point(s) failed to run** (nothing measured, left out of every figure): `{failed.point_id}` " \
           "(RuntimeError: planted failure at k=2)" in text, text
    assert "Every one of the 1 point is token-identical" in text
    ran = json.loads((sweep_dir / "points" / spec.points[0].id / "result.json").read_text())
    rounds = 3 + ran["extra"]["rounds"]["floor_rounds"]  # more where a side was beyond its timing floor's band
    assert f"each point ran {rounds} paired" in provenance.header_html(sweep, df)
    assert escape(provenance.pages_text(sweep["env"]["huge_pages"])) in provenance.header_html(sweep, df)
    # an interrupted sweep's header says its fixed parameters are the finished points', not the spec's
    assert "(over the 2 points that finished; the spec has 3)" in provenance.header_html(sweep | {"points": 3}, df)
    assert failed.point_id not in quality.quality_markdown(df, sweep, {})  # not an "unstable" point: it never ran
    # A sweep whose every point failed has no result columns in its parquet: the report still reads it.
    shutil.rmtree(sweep_dir / "points" / spec.points[0].id)
    store.collect(sweep_dir)
    only = store.load(sweep_dir)
    assert list(only.status) == ["failed"] and only.lossless.isna().all()
    assert "**No point ran**: this sweep measured nothing." in findings.sweep_findings(only)
    assert "an unrecorded number of paired" in provenance.header_html(sweep, only)
    quality.quality_markdown(only, sweep, {})
    shutil.rmtree(sweep_dir / "points" / failed.point_id)  # the table names a point no folder holds now
    with pytest.raises(ValueError, match=r"results.parquet names other points than those in .*points: re-collect"):
        store.load(sweep_dir)


@pytest.mark.parametrize(
    "source, message",
    [
        ({"k": [1], "alpah": [0.5]}, "unknown key 'alpah' \\(did you mean 'alpha'\\?\\)"),
        ({"k": [1], "alpah": [0.5], "tokenz": [8]},  # every unknown key in one problem, the allowed keys once
         r"unknown keys 'alpah' \(did you mean 'alpha'\?\), 'tokenz' \(did you mean 'tokens'\?\) \(allowed: [^;]*\]\)$"),
        ({"k": []}, "'k' in the spec is an empty list"),
        ({"k": [1, 2], "grids": [{"k": [3]}]}, r"k set at the top level and in grids\[0\]: the grid's values would replace"),
        ({"k": [1], "policy": ["nope"]}, r"^grid spec: policy in the spec: unknown policy 'nope'"),
        ({"grids": [{"commit": ["rewind"]}]}, r"commit in grids\[0\]: unknown commit 'rewind'"),
        ({"k": 3}, "'k' in the spec must be a list"),
        ({"repeats": 0}, "'repeats' must be an integer >= 1"),
        ({"defaults": [1, 2]}, r"defaults must be a mapping of dimension: values \(got \[1, 2\]\)"),
        ({"grids": [[1, 2]]}, r"grids\[0\] must be a mapping"),
        ({"alpha": ["0.5"]}, r"alpha in the spec: alpha='0.5': must be within \[0, 1\], a number"),
        ({"seed": ["x", 1, -1]}, r"seed in the spec: seed='x', -1: must be an integer >= 0"),
        ({"int4": ["no"]}, r"int4 in the spec: int4='no': must be true or false"),
        ({"k": [0, "x", 2]}, r"k in the spec: k=0, 'x': must be an integer >= 1"),
        ({"tokens": [1, 8]}, r"tokens in the spec: tokens=1: must be an integer >= 2"),  # one token times no decode
        ({"drafter": ["mtp"], "alpha": [0.5, 0.7]}, r"alpha=0.5 with drafter='mtp': alpha belongs to the oracle drafter"),
        ({"grids": [{"engine": ["mtplab", "ort-genai"], "drafter": ["mtp"], "schedule": ["fused"]}]},
         r"schedule='fused' with engine='ort-genai': onnxruntime-genai's MtpGenerator runs its own decoder"),
        ({"name": "../escaped"}, r"name='../escaped': must be a folder name"),
        ({"tokens": [300]}, r"tokens=300: .*exceeds the tiny model's max_seq_len 256 .*\(in grids\[0\]\)"),
        ({"grids": [{"preset": ["small"], "model": ["tiny"]}]}, r"preset and model in grids\[0\]: name the model once"),
    ],
)
def test_bad_grid_spec_fails_before_any_point_naming_the_key(source, message):
    with pytest.raises(ValueError, match=message) as err:
        grid.parse({"defaults": {"model": "tiny"}} | source)
    assert "\n" not in str(err.value)


def test_mtplab_engine_settings_from_defaults_pass_to_the_genai_points_unused():
    """As the sampling grid does: defaults are for every point; only a grid naming them beside the peer is refused."""
    spec = grid.parse({"defaults": {"model": "tiny", "drafter": "mtp", "schedule": "fused", "commit": "select"},
                       "grids": [{"engine": ["mtplab", "ort-genai"], "k": [2]}]})
    assert sorted(p.run.engine for p in spec.points) == ["mtplab", "ort-genai"]


def test_a_model_named_at_a_more_specific_level_replaces_an_older_specs_defaults_preset():
    spec = grid.parse({"name": "m", "defaults": {"preset": "small", "tokens": 8}, "model": ["tiny"], "k": [1]})
    assert [p.run.model for p in spec.points] == ["tiny"]


def test_every_problem_of_a_spec_is_reported_at_once():
    with pytest.raises(ValueError) as err:
        grid.parse({"defaults": {"model": "tiny"}, "k": [0], "policy": ["nope"], "repeats": 0, "name": "a/b"})
    assert [m in str(err.value) for m in ("k in the spec", "policy in the spec", "'repeats'", "name='a/b'")] == [
        True
    ] * 4


def test_distinct_floats_make_distinct_points():
    spec = grid.parse({"defaults": {"model": "tiny", "drafter": "oracle"}, "alpha": [0.7, 0.70000001]})
    assert sorted(p.id.split("-")[2] for p in spec.points) == ["oracle0.7", "oracle0.70000001"]


@pytest.mark.parametrize("text, message", [
    ("name: g\ndefaults: {model: tiny}\nk: [1, 2]\nk: [3]\n", r"at line 4, column 1: key 'k' given twice in one mapping"),
    ("name: g\ndefaults: {model: tiny}\ngrids: []\n", r"'grids' is an empty list"),
    ("name: g\ndefaults: {model: tiny}\ngrids: [{k: [1]}, {}]\n", r"grids\[1\] is empty: name at least one dimension"),
    ("name: g\n", r"the spec names no dimension \(no defaults, no grid\)"),
    ("name: g\ndefaults: {model: tiny}\nk: [1, 2, 1]\n", r"'k' in the spec repeats 1: give each value once"),
])
def test_a_spec_that_says_less_or_twice_what_it_means_is_refused(tmp_path, text, message):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        grid.load(path)
    with pytest.raises(ValueError, match="is a folder; give a YAML file"):
        grid.load(tmp_path)


def test_a_yaml_syntax_error_is_one_line_with_its_line(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("name: g\nk: [1, 2\npolicy: [shared-max]\n")
    with pytest.raises(ValueError, match=r"^grid spec .*g\.yaml: YAML syntax error at line 3, column \d+: [^\n]+$"):
        grid.load(path)


def test_an_engine_whose_package_is_missing_is_refused_with_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # as if not installed
    spec = grid.parse({"defaults": {"model": "tiny"}, "engine": ["ort-genai"]})
    with pytest.raises(ValueError, match=r"engine: .*pip install 'mtplab\[peer\]'"):
        run_sweep(spec, tmp_path / "results", quiet=True)
    assert not (tmp_path / "results").exists()


def test_default_grid_covers_every_policy_commit_k_and_alpha_and_the_trained_head():
    pts = grid.load(preset="default").points
    runs = [p.run for p in pts]
    assert {r.policy for r in runs} == {"shared-jit", "shared-max", "sibling", "sibling-pinned"}
    assert {r.commit for r in runs} == {"readvance-batched", "readvance-m1", "select"}
    assert {r.k for r in runs} == {1, 2, 3, 4} and {0.5, 0.7, 0.9} <= {r.alpha for r in runs}
    head = [r for r in runs if r.drafter == "mtp"]  # the trained head on held-out text, mtplab's and the peer's
    assert head and all(r.model.endswith("pycode") and r.prompts == "code" for r in head)
    assert {r.engine for r in head} == {"mtplab", "ort-genai"}
    assert len({p.id for p in pts}) == len(pts)


def test_a_grid_of_a_million_points_is_refused_at_once_unless_confirmed(tmp_path, capsys):
    from mtplab.cli.main import main

    huge = {"name": "huge", "defaults": {"model": "tiny"}, "seed": list(range(1000)), "tokens": list(range(2, 1002))}
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"it makes 1,000,000 points, more than 2,000: confirm with `mtplab sweep --yes`"):
        grid.parse(huge)
    assert time.perf_counter() - t0 < 5  # counted, not expanded (expanding takes minutes)
    assert grid.planned_points({"k": [1, 2], "grids": [{"commit": ["select"]}, {"seed": [1, 2, 3]}], "repeats": 2}) == 16
    with pytest.raises(ValueError, match="it makes 3 points, more than 2"):
        grid.parse({"name": "s", "defaults": {"model": "tiny"}, "seed": list(range(3))}, max_points=2)
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(huge))
    assert main(["sweep", str(path), "--results", str(tmp_path / "r")]) == 2
    assert "--yes" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_grid_over_temperature_samples_its_hot_points_with_rejection_sampling():
    spec = grid.parse({"name": "t", "defaults": {"model": "tiny", "drafter": "mtp"}, "temperature": [0.0, 0.7]})
    assert sorted((p.run.temperature, p.run.acceptance) for p in spec.points) == [
        (0.0, "greedy-match"), (0.7, "rejection-sampling")]


def test_grid_spec_file(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "defaults": {"model": "tiny"}, "k": [1, 2], "repeats": 2}))
    spec = grid.load(path)
    assert spec.name == "g" and len(spec.points) == 4


@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA backend")
def test_a_cuda_sweep_without_a_gpu_fails_before_writing_anything(tmp_path):
    with pytest.raises(ValueError, match=r"pip install 'mtplab\[gpu\]'"):
        run_sweep(grid.load(preset="cuda"), tmp_path / "results", quiet=True)
    assert not (tmp_path / "results").exists()


def test_the_sweep_writes_its_calibration_and_the_quality_view_reads_it(smoke):
    from mtplab.report import quality
    from mtplab.sweep import store

    calibration = quality.load_calibration(smoke)
    assert set(calibration) == {"tiny"} and "target" in calibration["tiny"]
    summary = json.loads((smoke / "sweep.json").read_text())
    assert all(isinstance(summary[k], float) for k in ("load_start", "load_end"))
    df = store.load(smoke)
    assert (df.rounds == 3).all()  # the table's `rounds` is the config's; result.json keeps every round
    for point in (smoke / "points").iterdir():  # and the rounds a side beyond its timing floor's band added
        result = json.loads((point / "result.json").read_text())
        assert len(result["round_samples"]) == 3 + result["extra"]["rounds"]["floor_rounds"]
    text = quality.quality_markdown(df, summary, calibration)
    assert "of 6 stable" in text and "T(M)/T(1)" in text and "Threads per point" in text
    assert "onnxruntime-genai rows included" not in text  # the smoke sweep has none
    assert not quality.efficiency_table(df).empty
    for fig in (quality.speedup_with_ci(df, calibration), quality.drift(df)):
        assert fig.axes
    assert quality.speedup_with_ci(df[df.drafter == "mtp"], calibration) is None  # no oracle point: no empty panel


def test_a_sweep_naming_a_broken_builder_folder_is_refused_before_any_point(tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(Path(__file__).parent / "data" / "builder-tiny", broken)
    (broken / "model.onnx.data").unlink()
    spec = grid.parse({"name": "broken", "defaults": {"tokens": 16, "drafter": "oracle"}, "model": [str(broken)]})
    with pytest.raises(ValueError, match=r"missing file model\.onnx\.data"):
        run_sweep(spec, tmp_path / "results", quiet=True)
    assert not (tmp_path / "results" / "broken").exists()


def test_a_point_whose_commit_the_model_refuses_is_refused_before_any_point_with_the_reason(tmp_path, monkeypatch):
    from mtplab.engine.strategies import COMMITS

    # a test double's refusal, as a folder whose form select cannot replay refuses it
    monkeypatch.setattr(COMMITS.get("select"), "refusal", lambda desc: "select refused for this test")
    folder = str(Path(__file__).parent / "data" / "builder-tiny-gdn")
    spec = grid.parse({"name": "refused", "defaults": {"tokens": 16, "drafter": "oracle"}, "model": [folder],
                       "commit": ["readvance-m1", "select"]})
    with pytest.raises(ValueError, match=r"point builder-tiny-gdn-.*select.*: select refused for this test"):
        run_sweep(spec, tmp_path / "results", quiet=True)
    assert not (tmp_path / "results" / "refused").exists()


def test_a_column_of_numbers_and_text_is_stored_as_text():
    df = store.mixed_as_text(pd.DataFrame({"config.rounds": [3, "auto", None], "config.k": [1, 2, 3]}))
    assert list(df["config.rounds"][:2]) == ["3", "auto"] and pd.isna(df["config.rounds"][2])
    assert list(df["config.k"]) == [1, 2, 3]
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)  # raised ArrowInvalid with the mixed column


def test_the_results_index_lists_an_unreadable_sweep_json_and_still_lists_the_others(tmp_path):
    for name, text in {"good": json.dumps({"name": "good", "finished": "2026-12-04", "ok": 3}), "broken": "{bad",
                       "alist": "[]", "binary": b"\xff\xfe".decode("latin-1")}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "sweep.json").write_text(text, encoding="latin-1" if name == "binary" else "utf-8")
    page = store.write_index(tmp_path).read_text()
    assert "<td>good</td><td>2026-12-04</td>" in page and "<td>3</td>" in page
    assert "<td>broken</td><td colspan='7'>unreadable sweep.json: Expecting property name" in page
    assert "<td>alist</td><td colspan='7'>unreadable sweep.json: a JSON list, not an object" in page
    assert "<td>binary</td><td colspan='7'>unreadable sweep.json:" in page


def test_a_model_whose_weights_are_cut_short_stops_the_sweep_before_any_calibration(tmp_path, capsys):
    import shutil

    from mtplab.cli.main import main

    folder = tmp_path / "weights-cut"
    shutil.copytree(ROOT / "tests" / "data" / "builder-tiny", folder)
    with open(folder / "model.onnx.data", "r+b") as f:
        f.truncate(1000)
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"name": "cut", "defaults": {"model": str(folder), "drafter": "oracle", "alpha": 0.5,
                                                                "commit": "readvance-m1", "tokens": 8}, "k": [1]}))
    assert main(["sweep", str(path), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "model.onnx.data holds 1,000 bytes, but model.onnx's weights reach" in err and "calibrat" not in err
    assert not (tmp_path / "r" / "cut" / "points").exists() or not list((tmp_path / "r" / "cut" / "points").iterdir())


def test_a_calibration_that_fails_stops_the_sweep_before_any_point_with_what_it_said(tmp_path, capsys, monkeypatch):
    import types

    from mtplab.cli.main import main
    from mtplab.sweep import calibration as sweep_calibration

    fake = tmp_path / "fake-python"  # test double of the calibration's process: onnxruntime's noise, then its error
    fake.write_text("#!/bin/sh\necho '[E:onnxruntime:, inference_session.cc:1] a long log line' >&2\n"
                    "echo 'mtplab calibrate: the model does not run here' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sweep_calibration, "sys", types.SimpleNamespace(executable=str(fake), stderr=sys.stderr))
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"name": "fails", "defaults": {"model": "tiny", "tokens": 8}, "k": [1]}))
    assert main(["sweep", str(path), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "the calibration failed (exit 2) before any point ran: `mtplab calibrate --model tiny --threads" in err
    assert "said:\n  mtplab calibrate: the model does not run here" in err and "[E:onnxruntime" not in err
    assert not list((tmp_path / "r" / "fails" / "points").iterdir())


def test_the_recheck_at_the_sweeps_end_runs_in_a_process_of_its_own_and_compares_the_cost_ratios(
        tmp_path, monkeypatch, capsys):
    """As the calibration at the start: on one thread pool, never on the sweep process's own sessions (pools of
    their own, spinning off: on small at 2 threads 25-30% slower, which the report read as a machine that moved).
    Beside greedy's cost it measures each T(M)/T(1) again, against the start's."""
    from mtplab.cli.main import main
    from mtplab.experiment import calibrate
    from mtplab.report import findings, quality
    from mtplab.sweep.calibration import recheck_calibration

    def here(*args, **kwargs):  # test double: the sweep process must not measure
        raise AssertionError("the re-check ran in the sweep's process")

    monkeypatch.setattr(calibrate, "recheck_now", here)
    ratios = {"target/1": 1.0, "target/2": 1.0, "target/3": 0.5}  # the start's: T(3) far below its value on tiny
    calib = {"tiny": {"greedy_token": 1e-4, "model_spec": "tiny", "int4": False, "key": {"threads": 1},
                      "ratio_to_t1": ratios},
             "gone": {"greedy_token": 1e-4, "model_spec": str(tmp_path / "gone"), "key": {"threads": 1}}}
    (tmp_path / "calibration.json").write_text(json.dumps(calib))
    check = recheck_calibration(tmp_path)
    tiny = check["tiny"]
    assert list(check) == ["tiny"] and tiny["greedy_token_end"] > 0  # measured over there
    assert tiny["drift"] == pytest.approx(tiny["greedy_token_end"] / 1e-4 - 1)
    assert sorted(tiny["ratios"]) == ["2", "3"] and tiny["ratio_drift_m"] == 3  # the sizes both hold; T(3) moved most
    assert tiny["ratio_drift"] == pytest.approx(tiny["ratios"]["3"][1] / 0.5 - 1) and tiny["ratio_drift"] > 0.05
    assert f"T(3)/T(1) on `tiny` was 0.500 at the calibration and {tiny['ratios']['3'][1]:.3f}" in \
        findings.drift_findings({"calibration_check": check})
    assert "M=3 0.500 -> " in " ".join(quality.calibration_lines("tiny", calib["tiny"], tiny))
    err = capsys.readouterr().err
    assert "the re-check of gone at the end did not run: the calibration failed (exit 2) at the sweep's end" in err
    assert main(["calibrate", "--model", "tiny", "--recheck", "--batch", "2"]) == 2
    assert "--recheck measures at batch 1 and writes nothing" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny", "--recheck", "--batch", "abc"]) == 2
    assert "--batch 'abc'" in capsys.readouterr().err


def test_a_presets_points_are_named_by_their_config_failed_and_older_ones_too():
    """A failed point has no model record, and an int4 point from before int4 had a name of its own recorded "tiny":
    a preset's name comes from the config, int4 included, so each sits with its own model's points in the report.
    A folder's is its record's."""
    df = pd.DataFrame({"model": ["tiny", "tiny", "tiny", "/x/builder-out"], "int4": [False, True, True, False]})
    info = pd.Series([None, None, json.dumps({"name": "tiny"}), json.dumps({"name": "qwen-mini"})])
    assert store.model_names(df, info) == ["tiny", "tiny-int4", "tiny-int4", "qwen-mini"]


def test_a_sweep_over_int4_calibrates_each_weight_form_apart(tmp_path, monkeypatch):
    """int4: [false, true] on one preset is two models to the cost model: calibration.json holds one calibration
    each, by the name its points' results carry, each measured by `mtplab calibrate` with its own --int4."""
    from mtplab.experiment import calibrate
    from mtplab.sweep import calibration as sweep_calibration

    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path / "cache"))
    commands = []

    def calibrate_double(cmd):  # a test double of the calibration's own process: writes the cache file it would
        int4, threads = "--int4" in cmd, int(cmd[cmd.index("--threads") + 1])
        path = calibrate.cache_path(key := calibrate.cache_key(cmd[cmd.index("--model") + 1], threads, int4=int4))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key}))
        commands.append(cmd[3:])

    monkeypatch.setattr(sweep_calibration, "_calibrate", calibrate_double)
    spec = grid.parse({"name": "q", "defaults": {"model": "tiny", "tokens": 8, "threads": 1}, "int4": [False, True]})
    sweep_calibration.calibrate_sweep(spec, tmp_path, threads=1, quiet=True)
    written = json.loads((tmp_path / "calibration.json").read_text())
    assert {name: (c["key"]["preset"], c["int4"]) for name, c in written.items()} == {
        "tiny": ("tiny", False), "tiny-int4": ("tiny-int4", True)}
    assert sorted(commands) == [["calibrate", "--model", "tiny", "--threads", "1"],
                                ["calibrate", "--model", "tiny", "--threads", "1", "--int4"]]


def test_a_resumed_sweep_keeps_its_calibrations_and_gets_those_of_models_it_did_not_hold(tmp_path, monkeypatch, capsys):
    """A sweep started on fp32 points, resumed with int4 points added: the fp32 calibration it started with stays
    as it was (its points were predicted from it); tiny-int4's is added, so the new points have the sweep's too."""
    from mtplab.experiment import calibrate
    from mtplab.sweep import calibration as sweep_calibration

    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path / "cache"))
    for int4 in (False, True):  # this machine's cached calibrations
        path = calibrate.cache_path(key := calibrate.cache_key("tiny", 1, int4=int4))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "measured": "now"}))
    monkeypatch.setattr(sweep_calibration, "_calibrate", lambda cmd: pytest.fail(f"measured {cmd}: both are cached"))
    started = {"tiny": {"key": calibrate.cache_key("tiny", 1), "measured": "at the start", "model_spec": "tiny"}}
    (tmp_path / "calibration.json").write_text(json.dumps(started))
    spec = grid.parse({"name": "q", "defaults": {"model": "tiny", "tokens": 8, "threads": 1}, "int4": [False, True]})
    sweep_calibration.calibrate_sweep(spec, tmp_path, threads=1, quiet=False)
    written = json.loads((tmp_path / "calibration.json").read_text())
    assert written["tiny"] == started["tiny"] and written["tiny-int4"]["measured"] == "now"
    assert written["tiny-int4"]["source"] == "cached on this machine (--reuse-calibration), when the sweep was resumed"
    assert "keeping the calibration it started with, adding tiny-int4 (models it did not hold)" in capsys.readouterr().err
    before = (tmp_path / "calibration.json").read_text()
    sweep_calibration.calibrate_sweep(spec, tmp_path, threads=1, quiet=True)  # resumed again: nothing to add, nothing written
    assert (tmp_path / "calibration.json").read_text() == before


def test_resume_refuses_a_spec_that_does_not_name_the_points_the_sweep_holds(tmp_path):
    spec = grid.parse({"name": "s", "defaults": {"model": "tiny", "tokens": 8}, "k": [3]})
    held = tmp_path / "s" / "points" / "tiny-k1-mtp-sibling-pinned-select-decode-verify-t8-s0-r0"
    held.mkdir(parents=True)
    store.write_error(held, {}, "a point of the spec it ran")
    with pytest.raises(ValueError, match=r"holds 1 point\(s\) this spec does not name \(e.g. tiny-k1-mtp-.*\): --resume "
                                         "continues the spec a sweep ran"):
        run_sweep(spec, tmp_path, quiet=True, resume=True)
    assert [p.name for p in (tmp_path / "s" / "points").iterdir()] == [held.name]  # nothing ran


def test_a_resume_on_other_pages_than_the_sweeps_calibration_is_refused(tmp_path, monkeypatch):
    """Its points so far ran as its calibration did: a resume on the other kind of page would mix the two."""
    from mtplab.sweep.run import pages_problem

    sweep = tmp_path / "s"
    sweep.mkdir()
    assert pages_problem(sweep) is None  # nothing calibrated yet
    (sweep / "calibration.json").write_text(json.dumps({"small": {"key": {"preset": "small", "malloc_hugetlb": "1"}}}))
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    assert pages_problem(sweep) is None
    monkeypatch.delenv("GLIBC_TUNABLES")
    problem = pages_problem(sweep)
    assert "calibrated (small) with malloc's memory on glibc.malloc.hugetlb=1 (huge pages)" in problem
    assert "would run its points on 4 KiB pages" in problem and "(GLIBC_TUNABLES with glibc.malloc.hugetlb=1)" in problem
    (sweep / "calibration.json").write_text(json.dumps({"small": {"key": {"preset": "small"}}}))
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    assert "(without glibc.malloc.hugetlb in GLIBC_TUNABLES)" in pages_problem(sweep)
