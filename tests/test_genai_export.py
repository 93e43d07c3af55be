"""The built-in model in onnxruntime-genai's form: its sessions run on mtplab's threads."""

from __future__ import annotations

import json

from mtplab.experiment.genai_export import export_genai


def test_the_export_runs_genai_on_mtplabs_threads(tmp_path, tiny):
    folder = export_genai(tiny, tmp_path / "g", threads=3)
    options = json.loads((folder / "target" / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert options["intra_op_num_threads"] == 3 and options["inter_op_num_threads"] == 1
