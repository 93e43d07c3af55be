"""The device check, rehearsed on the CPU EP: every policy and commit runs, the checks are computed
from the counters, and the JSON holds what was printed."""

from __future__ import annotations

import json

from mtplab.cli.gpucheck import checks, plan
from mtplab.cli.main import main


def test_plan_covers_every_policy_and_commit_on_small_and_select_on_base():
    runs = plan(["small", "base"], [1, 2, 3])
    small = {(p, c, k) for n, p, c, k, s in runs if n == "small" and s == "decode-verify"}
    base = {(p, c, k) for n, p, c, k, s in runs if n == "base" and s == "decode-verify"}
    assert len(small) == 4 * 3 * 3 and {c for _, c, _ in base} == {"select"} and len(base) == 4 * 3


def test_gpu_check_on_the_cpu_passes_and_writes_its_json(tiny, tmp_path, capsys):
    out = tmp_path / "check.json"
    code = main(
        ["doctor", "--gpu-check", "--backend", "cpu", "--presets", "tiny", "--ks", "1", "2"]
        + ["--tokens", "16", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert code == 0, printed
    assert len(doc["runs"]) == len(plan(["tiny"], [1, 2])) and not doc["skipped"]
    assert all(doc["checks"].values()) and "PASS  identity true everywhere" in printed
    jit = [r for r in doc["runs"] if r["policy"] == "shared-jit"]
    assert all(r["slots"]["verify"]["replays"] == 0 and r["slots"]["verify"]["fallbacks"] > 0 for r in jit)
    assert doc["capture"]["tiny"]["identical"] and doc["capture"]["tiny"]["replays"] > 0
    cap = doc["capture"]["tiny"]  # the CPU EP returns from a replay when it is done: queued and done alike
    assert 0 < cap["replays_queued_us"] <= cap["replays_done_us"] and "8 replays queued in" in printed
    changing = doc["k_changing"]  # the head's confidence policy: a plan per M used, or one padded plan
    assert changing["per-length"]["captures"] == len(changing["per-length"]["m_used"])
    assert changing["padded"]["captures"] == 1 and [p["tokens"] for p in changing["padded"]["plans"]] == [3]
    assert "K changing every step, verify plans padded: M used" in printed


def test_a_fallback_in_a_pinned_policy_fails_the_check():
    slots = {"primary": {"replays": 5, "fallbacks": 0}, "verify": {"replays": 5, "fallbacks": 0}}
    row = {
        "schedule": "decode-verify",
        "policy": "shared-max",
        "commit": "select",
        "identical": True,
        "slots": slots,
        "reasons": {"verify": ""},
    }
    assert checks([row])["sibling-pinned and shared-max (select, readvance-m1): both slots replay, fallbacks=0"]
    slots["verify"]["fallbacks"] = 1
    assert not checks([row])["sibling-pinned and shared-max (select, readvance-m1): both slots replay, fallbacks=0"]


def test_bad_check_options_fail_before_any_work(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main(["doctor", "--gpu-check", "--backend", "cpu", "--presets", "huge", "--out", str(out)]) == 2
    assert "presets ['huge'] unknown" in capsys.readouterr().err and not out.exists()
    for budget in ("-1", "nan"):
        assert main(["doctor", "--gpu-check", "--backend", "cpu", "--budget", budget, "--out", str(out)]) == 2
        assert f"budget={float(budget)} s: must be a number of seconds > 0" in capsys.readouterr().err


def test_a_capture_failure_is_reported_with_its_op_and_nothing_moves_to_host_memory(monkeypatch):
    from mtplab.cli import gpucheck
    from mtplab.runtime import device

    def capture_check(art, backend, tokens):  # test double: capture refused as the CUDA EP words it
        raise RuntimeError(
            "Non-zero status code returned while running GatedDeltaNet node. Name:'GatedDeltaNet_33' "
            "Status Message: operation not permitted when stream is capturing\ndetails"
        )

    monkeypatch.setattr(gpucheck, "capture_check", capture_check)
    check = gpucheck.checked_capture(None, "cuda", 8)
    assert check["identical"] is False and check["op"] == "GatedDeltaNet"
    assert check["error"].startswith("RuntimeError: Non-zero status code returned while running GatedDeltaNet")
    assert device.CUDA_HOST_INPUTS == {"total_sequence_length"}  # the one input an op reads on the host
    assert not hasattr(gpucheck, "resolve_host_inputs") and not hasattr(device, "cuda_host_inputs")


def test_a_failed_run_is_a_row_naming_its_op():
    from mtplab.cli.gpucheck import _format, _row

    err = RuntimeError("Failed to find kernel for com.microsoft.GatedDeltaNet(1) (node:'GatedDeltaNet_33' ep:'X')")
    row = _row(("small", "sibling-pinned", "select", 1, "decode-verify"), error=err)
    assert row["op"] == "GatedDeltaNet" and row["identical"] is False
    assert "ERROR in op GatedDeltaNet: RuntimeError: Failed to find kernel" in _format(row)
