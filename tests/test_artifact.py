"""The model cache: keyed by everything that decides the bytes, verified on load, safe under concurrent builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtplab.cli.main import main
from mtplab.model import artifact, build_model, load_artifact, preset

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cache_key_covers_the_model_building_code(cache, monkeypatch):
    a = build_model(preset("tiny"))
    assert a.manifest["code_version"] == artifact.code_version() and a.manifest["cache_key"] in a.path.name
    monkeypatch.setattr(artifact, "code_version", lambda: "changed-weight-code")
    b = build_model(preset("tiny"))
    assert b.path != a.path and b.manifest["code_version"] == "changed-weight-code"


def test_a_tampered_cached_weight_is_rebuilt_with_a_message(cache, capsys):
    a = build_model(preset("tiny"))
    target = a.path / "target.onnx"
    good = target.read_bytes()
    i = len(good) // 2
    target.write_bytes(good[:i] + bytes([good[i] ^ 0xFF]) + good[i + 1 :])  # one weight byte flipped
    b = build_model(preset("tiny"))
    err = capsys.readouterr().err
    assert "content hash" in err and "rebuilding it" in err
    assert b.path == a.path and target.read_bytes() == good


def test_a_truncated_model_is_rebuilt_and_never_a_protobuf_traceback(cache, tmp_path, capsys):
    a = build_model(preset("tiny"))
    (a.path / "target.onnx").write_bytes((a.path / "target.onnx").read_bytes()[:1000])
    build_model(preset("tiny"))
    assert "rebuilding it" in capsys.readouterr().err
    external = tmp_path / "mine"  # an external model whose manifest has no content hash
    external.mkdir()
    for name in ("target.onnx", "mtp.onnx"):
        (external / name).write_bytes((a.path / name).read_bytes()[: 1000 if name == "target.onnx" else None])
    manifest = json.loads((a.path / "manifest.json").read_text())
    manifest.pop("content_hash")
    (external / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"target\.onnx: not a readable ONNX model"):
        load_artifact(external)


def test_out_holding_another_config_is_refused(tmp_path, capsys):
    out = str(tmp_path / "out1")
    assert main(["model", "build", "--preset", "tiny", "--out", out]) == 0
    assert main(["model", "build", "--preset", "tiny", "--int4", "--out", out]) == 2
    assert "holds an artifact of another config" in capsys.readouterr().err
    assert load_artifact(out).config.weight_format == "fp32"


def test_concurrent_forced_builds_of_one_model_all_succeed(cache):
    cmd = [sys.executable, "-m", "mtplab.cli.main", "model", "build", "--preset", "tiny", "--force"]
    env = os.environ | {"MTPLAB_CACHE": str(cache)}
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, [err.decode()[-500:] for _, err in outs]
    paths = {out.decode().splitlines()[0] for out, _ in outs}
    built = load_artifact(paths.pop()).config.replace(graph_form=None)  # the build records its form
    assert len(paths) == 0 and built.config_hash() == preset("tiny").config_hash()
    assert not [p for p in (cache / "models").iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_loading_a_model_built_for_a_newer_runtime_names_the_form(cache, monkeypatch, tiny):
    from mtplab.model import forms

    art = load_artifact(tiny.path)
    # A stand-in for an older runtime's schemas: none of the newer inputs and attributes exist.
    monkeypatch.setattr(forms, "schema_features", lambda: dict.fromkeys(forms.FEATURE_TEXT, False))
    with pytest.raises(ValueError, match=rf"{tiny.path}: graph form {art.config.graph_form} needs onnxruntime >="):
        load_artifact(tiny.path)


def test_the_test_session_builds_into_a_temporary_cache_never_the_users():
    import tempfile

    from mtplab.model.artifact import cache_dir

    assert Path(cache_dir()).is_relative_to(Path(tempfile.gettempdir()))
    assert not Path(cache_dir()).is_relative_to(Path.home() / ".cache")
