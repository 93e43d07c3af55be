"""The report's findings state ratios from paired rounds: mtplab beside onnxruntime-genai."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mtplab.report import findings


def _rounds(pairs):
    return json.dumps([{"round": r, "greedy_tokens_per_s": genai, "mtplab_greedy_tokens_per_s": mine, "speedup": 0.8}
                       for r, (mine, genai) in enumerate(pairs)])


def _sweep(peer_rounds):
    base = {"status": "ok", "drafter": "mtp", "temperature": 0.0, "policy": "sibling-pinned", "commit": "select",
            "lossless": True, "draft_acceptance": 0.7, "speedup_ci": "[1.4, 1.6]", "stable": True}
    own = [base | {"engine": "mtplab", "k": 2, "schedule": s, "speedup": spd, "tokens_per_s": 30.0 * spd,
                   "greedy_tokens_per_s": 30.0} for s, spd in (("fused", 1.5), ("decode-verify", 1.2))]
    # the peer's greedy measured while the machine was three times faster: its absolute rate says nothing paired
    peer = [base | {"engine": "ort-genai", "k": 2, "schedule": "decode-verify", "speedup": 0.6, "tokens_per_s": 54.0,
                    "greedy_tokens_per_s": 90.0, "round_samples": peer_rounds}]
    return pd.DataFrame(own + peer)


def test_greedy_against_the_peer_is_the_ratio_of_the_peer_points_own_rounds_not_of_medians_taken_apart():
    df = _sweep(_rounds([(72.0, 90.0), (64.0, 80.0), (70.0, 100.0)]))  # 0.8, 0.8, 0.7
    g = findings.peer_greedy_ratio(df[df.engine == "ort-genai"])
    assert g["median"] == pytest.approx(0.8) and g["rounds"] == 3
    text = findings.peer(df)
    assert "mtplab / genai **0.80x**" in text and "over 3 paired rounds" in text
    # k=2: mtplab's best 1.5x its greedy, genai's MTP 0.6x its own: 1.5 * 0.8 / 0.6 = 2.0x genai's MTP
    assert "mtplab's best 1.50x its own (fused" in text and "about 2.00x genai's MTP" in text
    (line,) = [f for f in findings.headline_findings(df) if "onnxruntime-genai" in f]
    assert "**0.80x**" in line and "about **1.20x genai's plain greedy** (faster" in line


def test_a_sweep_whose_peer_rounds_lack_mtplabs_greedy_says_its_absolute_ratio_moves_with_the_load():
    df = _sweep(json.dumps([{"round": 0, "greedy_tokens_per_s": 90.0}]))
    assert findings.peer_greedy_ratio(df[df.engine == "ort-genai"]) is None
    assert "their ratio, 0.33x, moves with the load" in findings.peer(df)


def test_greedy_moving_between_the_calibration_and_the_sweeps_end_is_a_finding_and_a_steady_machine_is_not():
    check = {"greedy_token_start": 0.0422, "greedy_token_end": 0.0142, "drift": -0.66, "load_end": 2.9}
    text = findings.drift_findings({"calibration_check": {"small": check}})
    assert "greedy on `small` took 42.20 ms a token" in text and "14.20 ms at its end (-66%" in text
    assert findings.drift_findings({"calibration_check": {"small": check | {"drift": 0.04}}}) == ""
    assert findings.drift_findings({}) == ""


def test_rounds_without_a_usable_pair_are_left_out_and_one_round_says_it_has_no_ci():
    df = _sweep(_rounds([(72.0, 90.0), (float("nan"), 80.0), (70.0, 0.0)]))  # only the first is a pair
    g = findings.peer_greedy_ratio(df[df.engine == "ort-genai"])
    assert g["rounds"] == 1 and "**0.80x** (no CI from one round) over 1 paired round" in findings.peer(df)


def test_peer_points_timed_without_waiting_for_the_threads_before_them_are_named_and_settled_ones_are_not():
    df = _sweep(_rounds([(72.0, 90.0), (64.0, 80.0)]))
    text = findings.peer(df)
    assert "**1 peer point timed each side at once after the one before**" in text
    assert "once the threads of the one before were idle" not in text  # the greedy line claims no settling
    assert any("Read the side-by-side's caveat first" in f for f in findings.headline_findings(df))
    df["extra"] = [None, None, json.dumps({"settle_max_ms": 48.1, "settle_limited": 0})]
    text = findings.peer(df)
    assert "at once after the one before" not in text and "once the threads of the one before were idle" in text
    assert not any("caveat" in f for f in findings.headline_findings(df))


def test_a_peer_point_on_one_thread_has_no_spin_to_wait_for():
    df = _sweep(_rounds([(72.0, 90.0)]))
    df["threads"] = 1
    assert "at once after the one before" not in findings.peer(df)
    assert not any("caveat" in f for f in findings.headline_findings(df))


def test_sides_that_began_at_settles_limit_are_counted_in_the_caveat():
    df = _sweep(_rounds([(72.0, 90.0)]))
    df["extra"] = [None, None, json.dumps({"settle_max_ms": 502.6, "settle_limited": 4})]
    text = findings.peer(df)
    assert "**4 timed sides of the peer points began with this process's threads still busy**" in text
    assert "once the threads of the one before were idle" not in text


def test_the_acceptance_the_steps_realized_is_told_apart_from_the_efficiency():
    df = _sweep(_rounds([(72.0, 90.0)]))
    mine = df.engine == "mtplab"
    df.loc[mine, "efficiency"], df.loc[mine, "efficiency_ci"] = [0.95, 1.02], ["[0.9, 1.0]", "[0.98, 1.06]"]
    df.loc[mine, "theory.verify_cost_ratio"], df.loc[mine, "theory.draft_cost_ratio"] = 1.4, 0.04
    df.loc[mine, "theory.alpha"] = 0.7
    # priced for the steps made against priced at alpha: one point's steps kept fewer drafts (-8%), one more (+5%)
    df.loc[mine, "predicted.speedup"], df.loc[mine, "predicted.at_alpha"] = [1.84, 1.26], [2.0, 1.2]
    text = findings.sweep_findings(df)
    assert "median 0.98, 0.95-1.02 over 2 points" in text
    assert "moved the calibration's price by -8% to +5%" in text and "The efficiency prices the steps made" in text


def test_the_report_answers_first_with_the_real_heads_best_point_its_interval_and_the_identity():
    df = _sweep(_rounds([(72.0, 90.0)])).assign(model_name="tiny", point_id=["a", "b", "c"])
    line = findings.answer(df)
    assert line.startswith("**The answer.** Real MTP head: speculative decoding beats greedy (CI above 1) at 2 of 2")
    assert "Best stable: **1.50x** [1.40, 1.60] (stable) at k=2, fused" in line
    assert "every point token-identical to greedy" in line
    best = df.speedup.idxmax()  # an unstable best is not the answer: the best stable point is, the other named
    shaky = df.assign(stable=[i != best for i in df.index])
    line = findings.answer(shaky)
    assert "Best stable: " in line and "**1.50x**" not in line.split("Best stable: ")[1].split(";")[0]
    assert "(an unstable point reads higher: 1.50x at k=2, fused)" in line
    lossy = df.assign(lossless=[True, False, True])
    assert "**1 of 3 points NOT identical to greedy**" in findings.answer(lossy)
    assert findings.answer(df[df.engine == "ort-genai"]).startswith("**No speculative point of mtplab's own engine")
    first = findings.sweep_findings(df.assign(**{"theory.alpha": 0.7})).splitlines()[0]
    assert first.startswith("- Real MTP head:")  # the answer heads the findings; how sure and the caveats follow


def test_suspect_points_are_named_with_why_in_how_sure():
    import pandas as pd

    from mtplab.report.findings import suspect_findings

    df = pd.DataFrame({"point_id": ["a", "b"], "status": ["ok", "suspect"],
                       "suspect": ["[]", '["greedy: 40.0 us a token beyond the bare replays"]']})
    (line,) = suspect_findings(df)
    assert line.startswith("- **Suspect timing**: 1 point had a timed side beyond its timing floor's band")
    assert "`b`: greedy: 40.0 us a token" in line and "`a`" not in line
    assert suspect_findings(df[df.status == "ok"]) == []


def test_timing_floors_say_how_close_each_side_came_to_its_band_and_where_a_floor_priced_part_of_it():
    import json

    import pandas as pd

    from mtplab.report.findings import floor_findings

    def extra(host: float, share: float) -> str:
        side = {"host_per_unit": host, "allowed_per_unit": 20.0, "priced_share": share}
        return json.dumps({"floor": {"greedy": side, "speculative": side}})

    (line,) = floor_findings(pd.DataFrame({"extra": [extra(5.0, 1.0), extra(15.0, 1.0), extra(30.0, 0.5)]}))
    assert "greedy held to its band at 2 of 3 points (its host time at most 75% of the band), priced in part at the " \
           "other 1" in line
    assert floor_findings(pd.DataFrame({"extra": [json.dumps({})]})) == []
