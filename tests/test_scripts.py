"""scripts/gpu-bundle and scripts/gpu-check --wheelhouse: the offline install path, rehearsed on the CPU with
the CPU onnxruntime wheel (the same version as this environment's, from pip's cache or the index)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=240, **kw)


def test_the_state_heavy_model_is_never_written_into_the_fixtures_folder(tmp_path):
    for out in ((), ("--out", SCRIPTS.parent / "tests" / "data" / "heavy")):
        r = _run(SCRIPTS / "make-builder-fixture", "--state-heavy", *out, "--venv", tmp_path / "venv")
        assert r.returncode == 2 and "--state-heavy needs --out DIR outside tests/data" in r.stderr
    assert not (tmp_path / "venv").exists()  # refused before any install


def test_bad_options_fail_before_any_download(tmp_path):
    r = _run(SCRIPTS / "gpu-bundle", "--python", "twelve", "--out", tmp_path / "w")
    assert r.returncode == 2 and "--python twelve: give a version like 3.12" in r.stderr
    r = _run(SCRIPTS / "gpu-bundle", "--runtime", "torch", "--out", tmp_path / "w")
    assert r.returncode == 2 and "--runtime torch" in r.stderr and not (tmp_path / "w").exists()
    r = _run(SCRIPTS / "gpu-check", "--wheelhouse", tmp_path)
    assert r.returncode == 2 and "no mtplab and onnxruntime wheels" in r.stderr


@pytest.mark.full
def test_the_wheelhouse_installs_offline_into_a_target_and_the_check_runs_from_there(tmp_path):
    house, target = tmp_path / "wheelhouse", tmp_path / "site"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = os.environ | {"PYTHON": sys.executable}
    r = _run(
        SCRIPTS / "gpu-bundle",
        *("--python", py, "--runtime", f"onnxruntime=={onnxruntime.__version__}", "--no-deps", "--out", house),
        env=env,
    )
    if r.returncode and not list(house.glob("onnxruntime-*.whl")):
        pytest.skip(f"the onnxruntime wheel could not be fetched here: {r.stderr.strip().splitlines()[-1:]}")
    assert r.returncode == 0, r.stderr
    assert {p.name.split("-")[0] for p in house.glob("*.whl")} == {"mtplab", "onnxruntime"}
    out = tmp_path / "check.json"
    r = _run(
        SCRIPTS / "gpu-check",
        *("--wheelhouse", house, "--target", target),
        *("--backend", "cpu", "--presets", "tiny", "--ks", "1", "--tokens", "16", "--out", out),
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"mtplab from {target}/mtplab/__init__.py; onnxruntime {onnxruntime.__version__} from {target}/" in r.stdout
    assert all(json.loads(out.read_text())["checks"].values())
