"""`mtplab doctor`: the graph form this onnxruntime gets and why, and the GPU pairing read from the build."""

from __future__ import annotations

from mtplab.cli.doctor import format_report, pairing, report
from mtplab.model.forms import FORMS, check_runtime


def test_doctor_names_a_form_this_runtime_accepts_and_says_why():
    r = report()
    check_runtime(FORMS[r["graph_form"]["name"]])  # raises naming what is missing if doctor picked a form it refuses
    assert r["ops"]["GatedDeltaNet"] and r["graph_form"]["why"]
    text = format_report(r)
    assert f"graph form    {r['graph_form']['name']} ({r['graph_form']['why']})" in text


def test_the_pairing_comes_from_the_wheels_build_info_not_the_version_number():
    ok = pairing("1.31.1", "13.0", True, {"cupy-cuda13x": "13.6.0"})
    assert ok == "onnxruntime-gpu 1.31.1 built for CUDA 13.0 with cupy-cuda13x: OK"
    old = pairing("1.26.0", "12.8", False, {"cupy-cuda12x": "13.6.0"})
    assert "built for CUDA 12.8" in old and "no GatedDeltaNet" in old
    mixed = pairing("1.30.0", "13.0", True, {"cupy-cuda12x": "13.6.0"})
    assert "does not match CUDA 13 (want cupy-cuda13x)" in mixed
    assert "no cupy-cuda* package" in pairing("1.31.1", "13.0", True, {})
