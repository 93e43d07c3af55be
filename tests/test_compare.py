"""`mtplab compare A B`: points matched by their parameters, the ratio B/A, counters that changed, points only in one."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from mtplab.cli.main import main
from mtplab.report.compare import make_compare, match, speedup_changed
from mtplab.sweep import grid, store
from mtplab.sweep.run import run_sweep


def _spec(name: str, ks: list[int]) -> grid.GridSpec:
    # 5 rounds: a 3-round t interval is wide enough that one disturbed round on a busy machine can hide a 10x change
    defaults = {"model": "tiny", "tokens": 24, "drafter": "oracle", "alpha": 0.7, "policy": "sibling-pinned", "rounds": 5}
    return grid.parse({"name": name, "defaults": defaults, "k": ks})


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory, tiny):
    """A: k 1, 2. B: k 1, 3 on an engine planted to sleep 20 ms in every commit (a slower engine: about 20x at k=1)."""
    from conftest import planted_notebooks

    root = tmp_path_factory.mktemp("compare")
    slow = planted_notebooks(
        root / "slow-notebooks",
        [
            "import time\n",
            "import mtplab.engine.engine as planted\n",
            "true_commit = planted.Engine.commit\n",
            "def slow_commit(self, *a, **kw):\n",
            "    time.sleep(0.02)\n",
            "    return true_commit(self, *a, **kw)\n",
            "planted.Engine.commit = slow_commit\n",
        ],
    )
    a = run_sweep(_spec("a", [1, 2]), root, quiet=True)
    os.environ["MTPLAB_NOTEBOOKS"] = str(slow)
    try:
        b = run_sweep(_spec("b", [1, 3]), root, quiet=True)
    finally:
        del os.environ["MTPLAB_NOTEBOOKS"]
    return a, b


def test_compare_shows_the_ratio_the_changed_point_and_points_only_in_one(two_sweeps):
    a, b = two_sweeps
    page = make_compare(a, b).read_text()
    assert "tok/s B/A" in page and "speedup B/A" in page and "data:image/png;base64" in page
    joined, _, _ = match(store.load(a), store.load(b))
    changed = int(joined.changed.sum())  # whether the intervals part is the rounds' draw (test below, and the units)
    assert "1 point matched" in page and f"{changed} point{'s' * (changed != 1)} changed" in page
    assert "1 only in A, 1 only in B" in page
    assert "tiny-k2-oracle0.7" in page.split("Points only in A")[1].split("Points only in B")[0]
    assert "tiny-k3-oracle0.7" in page.split("Points only in B")[1]


def test_the_planted_slow_engine_is_slower_by_the_ratio(two_sweeps):
    from mtplab.sweep import store

    a, b = two_sweeps
    joined, key, differ = match(store.load(a), store.load(b))
    k1 = joined[joined.k == 1].iloc[0]
    assert k1.tokens_per_s_ratio < 0.8 and k1.speedup_ratio < 0.8  # about 20x slower, whatever the machine's load
    # changed is the rule's verdict on the two sweeps' intervals: a loaded machine can widen A's to reach B's, so the
    # test holds the verdict to the rule (the rule itself: the unit tests below), not to a quiet machine
    assert k1.changed == speedup_changed(k1.get("speedup_ci_a"), k1.get("speedup_ci_b"), k1.speedup_ratio,
                                         k1.get("round_samples_a"), k1.get("round_samples_b"))[0]
    assert "k" in key and differ == {}


def test_counters_that_changed_are_named_and_a_differing_fixed_parameter_is_left_out_of_the_key():
    base = {"point_id": "p", "model": "tiny", "k": 1, "drafter": "oracle", "alpha": 0.7, "policy": "shared-jit"}
    a = pd.DataFrame([base | {"backend": "cpu", "tokens_per_s": 100.0, "speedup": 1.0, "slots.verify.fallbacks": 0}])
    b = pd.DataFrame([base | {"backend": "cuda", "tokens_per_s": 100.0, "speedup": 1.0, "slots.verify.fallbacks": 11}])
    joined, key, differ = match(a, b)
    assert differ == {"backend": ("cpu", "cuda")} and "backend" not in key
    assert joined.counters_changed.iloc[0] == "verify.fallbacks 0&rarr;11" and joined.changed.iloc[0]


def test_compare_of_a_folder_that_is_not_a_sweep_is_refused(tmp_path, capsys):
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "holds no sweep (no sweep.json, no points/)" in capsys.readouterr().err


def test_a_sweep_is_found_by_its_folder_or_by_its_name_in_the_results_root_and_every_other_input_is_named(
        tmp_path, monkeypatch, capsys):
    from mtplab.sweep.store import finished_sweep

    root = tmp_path / "elsewhere"
    monkeypatch.setenv("MTPLAB_RESULTS", str(root))
    monkeypatch.chdir(tmp_path)
    sweep = root / "demo"
    (sweep / "points").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"demo: its sweep did not finish .*--name demo --resume` finishes it"):
        finished_sweep("demo")
    for name in ("sweep.json", "results.parquet"):
        (sweep / name).write_text("")
    assert finished_sweep("demo") == finished_sweep(sweep) == sweep.resolve()
    with pytest.raises(ValueError, match=r"demo2: no such folder, nor is there a sweep named demo2 in .*elsewhere"):
        finished_sweep("demo2")
    monkeypatch.delenv("MTPLAB_RESULTS")  # mtplab report --results names the root as mtplab sweep --results does
    assert main(["report", "demo2", "--results", str(root)]) == 2
    assert "nor is there a sweep named demo2 in " + str(root.resolve()) in capsys.readouterr().err
    monkeypatch.setenv("MTPLAB_RESULTS", str(root))
    with pytest.raises(ValueError, match=r"sweep.json is a file: give a sweep's folder"):
        finished_sweep(sweep / "sweep.json")
    (tmp_path / "demo").mkdir()  # a folder of that name here that holds no sweep does not hide the results root's
    assert finished_sweep("demo") == sweep.resolve()
    outside = tmp_path / "work" / "trial"
    (outside / "points").mkdir(parents=True)  # unfinished, outside the results root: its resume names its root
    with pytest.raises(ValueError, match=rf"--name trial --results {tmp_path / 'work'} --resume` finishes it"):
        finished_sweep(outside)


def test_a_point_whose_speedup_cis_overlap_is_unchanged_however_its_tokens_per_s_drifted():
    base = {"point_id": "p", "model": "tiny", "k": 1, "drafter": "oracle", "alpha": 0.7, "slots.verify.fallbacks": 0}
    a = pd.DataFrame([base | {"tokens_per_s": 100.0, "speedup": 1.00, "speedup_ci": "[0.95, 1.06]"}])
    b = pd.DataFrame([base | {"tokens_per_s": 154.0, "speedup": 1.04, "speedup_ci": "[0.98, 1.09]"}])  # machine 54% faster
    joined, _, _ = match(a, b)
    assert joined.tokens_per_s_ratio.iloc[0] == pytest.approx(1.54) and not joined.changed.iloc[0]
    b.loc[0, "speedup_ci"] = "[1.10, 1.20]"  # the speedup itself moved beyond both CIs
    assert match(a, b)[0].changed.iloc[0]


def test_without_cis_a_speedup_ratio_outside_the_band_is_a_change():
    from mtplab.report.compare import speedup_changed

    assert speedup_changed(None, "[1.0, 1.1]", 1.3) == (True, "band")
    assert speedup_changed("[1.0, 1.1]", "[1.05, 1.2]", 1.1) == (False, "CIs")


def test_the_rounds_interval_is_a_t_interval_of_the_geometric_mean_and_decides_before_stored_cis():
    from mtplab.report.compare import rounds_interval, speedup_changed

    rounds = [{"speedup": v} for v in (1.0, 1.1, 1.2)]
    lo, hi = rounds_interval(rounds)
    x = np.log([1.0, 1.1, 1.2])
    half = 4.303 * x.std(ddof=1) / np.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert (lo, hi) == pytest.approx((np.exp(x.mean() - half), np.exp(x.mean() + half)))
    assert rounds_interval(rounds[:1]) is None
    shifted = [{"speedup": v * 1.02} for v in (1.0, 1.1, 1.2)]
    # narrow stored CIs that miss each other, rounds that overlap: the rounds decide
    assert speedup_changed("[1.0, 1.01]", "[1.05, 1.06]", 1.02, rounds, shifted) == (False, "rounds")
