"""The study's tables and figures (mtplab.report.study) on a sweep frame made here."""

from __future__ import annotations

import pandas as pd
from conftest import synthetic_calibration

from mtplab.engine.strategies import COMMITS
from mtplab.measure import breakeven
from mtplab.report import study


def _frame() -> pd.DataFrame:
    rows = []
    for commit in ("select", "readvance-m1", "readvance-batched"):
        for policy, fallbacks, invalidations in (("sibling-pinned", 0, 0), ("shared-jit", 20, 0), ("sibling", 0, 10)):
            rows.append({"engine": "mtplab", "drafter": "oracle", "alpha": 0.8, "k": 3, "schedule": "decode-verify",
                         "policy": policy, "commit": commit, "validate": True, "status": "ok", "steps": 20,
                         "speedup": 0.5 + 0.1 * len(rows), "speedup_ci": [0.45 + 0.1 * len(rows), 0.55 + 0.1 * len(rows)],
                         "tokens_per_s": 50.0, "greedy_tokens_per_s": 60.0, "temperature": 0.0,
                         "slots.verify.fallbacks": fallbacks, "slots.verify.invalidations": invalidations,
                         "slots.verify.hazards": 0, "slots.primary.fallbacks": 0,
                         "slots.primary.invalidations": 20 if commit == "readvance-batched" else 0,
                         "slots.primary.hazards": 0})
    rows.append(rows[-1] | {"policy": "sibling", "commit": "select", "validate": False, "status": "mismatch",
                            "slots.verify.hazards": 4, "slots.verify.invalidations": 0})
    return pd.DataFrame(rows)


def test_the_seed_path_is_in_the_seeds_order_with_counters_per_step():
    path = study.seed_path(_frame())
    assert list(path.stage[:3]) == ["shared-jit, readvance-batched", "sibling, readvance-batched",
                                    "sibling-pinned, readvance-batched"]
    assert list(path.stage[-3:]) == ["sibling, select", "sibling (validation off), select", "sibling-pinned, select"]
    first = path.iloc[0]
    assert first["verify fallbacks/step"] == 1.0 and first["primary invalidations/step"] == 1.0
    assert first.point == "k=3, oracle alpha=0.8, decode-verify"


def test_each_fix_says_which_counter_it_moved():
    lines = study.path_changes(study.seed_path(_frame()))
    assert any(line.startswith("- shared-jit, select -> sibling, select:") and "verify fallbacks/step 1.00 -> 0.00"
               in line for line in lines)
    assert any("sibling-pinned, readvance-batched -> sibling-pinned, readvance-m1" in line
               and "primary invalidations/step 1.00 -> 0.00" in line for line in lines)
    assert any("sibling (validation off), select: 0.20 hazards per step" in line and "mismatch" in line
               for line in lines)


def test_the_break_even_table_says_never_where_no_alpha_wins():
    t = study.break_even_table(breakeven.hardware_calibration(17.9, 0.1, 1.0, 0.3), ks=(1, 3))
    m1 = t[t.commit == "readvance-m1"]
    assert set(m1["break-even alpha"]) == {"never"} and (m1["speedup at alpha=1"] < 1).all()
    assert len(t) == 3 * 2 * 2
    assert any("readvance-m1, fused, k=1, an infinitely long run: alpha* = no solution" in line
               for line in study.closed_forms(breakeven.hardware_calibration(17.9, 0.1, 1.0, 0.3)))


def test_costs_that_do_not_price_a_commit_leave_it_out_and_name_it():
    yours = breakeven.hardware_calibration(17.9, 0.1, 1.0, 0.3)  # no per-position verify in someone's own costs
    assert study.priced(yours) == ([c for c in COMMITS if c != "per-position"], ["per-position"])
    table = study.at_alpha(yours, 0.7)
    assert "per-position" not in table.index.get_level_values("commit") and not table.isna().any().any()
    assert len(study.curves(yours, ks=(1,)).axes) == 2 * (len(COMMITS) - 1)


def test_the_curves_draw_a_panel_per_commit_and_schedule_with_the_measured_points():
    fig = study.curves(synthetic_calibration(), _frame(), ks=(3,))
    assert len(fig.axes) == 2 * len(COMMITS)  # every commit the calibration prices x the two schedules
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "k=3 predicted" in labels and "k=3 measured" in labels


def test_the_path_table_shows_a_row_per_stage_and_only_counters_that_moved():
    shown = study.path_table(study.seed_path(_frame()))
    assert shown.index[0] == "shared-jit, readvance-batched" and shown["tok/s"].notna().all()
    assert "primary fallbacks/step" not in shown and "verify hazards/step" in shown
    assert shown["speedup [95% CI]"].iloc[0] == "1.20x [1.15, 1.25]"


def test_the_measurement_lines_count_points_within_target_and_name_the_others():
    from mtplab.report import quality

    plans = [{"mode": "auto", "stopped": "within target", "rounds": 6, "half_width": 0.02, "target": 0.03,
              "budget_s": 30, "seconds": 12.0},
             {"mode": "auto", "stopped": "budget spent", "rounds": 9, "half_width": 0.071, "target": 0.03,
              "budget_s": 30, "seconds": 29.0},
             {"mode": "fixed", "stopped": "fixed", "rounds": 3}]
    df = pd.DataFrame({"point_id": ["a", "b", "c"], "extra": [{"rounds": p} for p in plans]})
    lines = quality.auto_rounds_lines(df)
    assert lines[0].startswith("- Rounds sized automatically on 2 points: 1 reached the speedup CI target (3% "
                               "half-width) in a median 6 rounds; their timed rounds took 41 s in all")
    assert lines[1].endswith("`b` (7.1%, budget spent)")
    assert quality.auto_rounds_lines(df.iloc[2:]) == []


def test_the_seed_form_prints_each_stages_counters_as_the_seed_did():
    frame = _frame().assign(**{f"slots.{s}.{c}": 3 for s in ("primary", "verify") for c in ("captures", "replays")})
    text = study.seed_form(study.seed_path(frame))
    lines = text.splitlines()
    assert lines[0] == "shared-jit, readvance-batched"
    assert lines[1] == "    primary: captures=3 replays=3 fallbacks=0 invalidations=20"
    assert lines[2] == "    verify: captures=3 replays=3 fallbacks=20 invalidations=0"
