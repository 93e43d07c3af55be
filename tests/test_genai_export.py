"""The built-in model in onnxruntime-genai's form: its sessions run on mtplab's threads."""

from __future__ import annotations

import json

from mtplab.experiment.genai_export import export_genai


def _options(folder, part):
    return json.loads((folder / part / "genai_config.json").read_text())["model"]["decoder"]["session_options"]


def test_the_export_runs_genai_on_mtplabs_threads_and_its_head_on_one(tmp_path, tiny):
    folder = export_genai(tiny, tmp_path / "g", threads=3)
    options = _options(folder, "target")
    assert options["intra_op_num_threads"] == 3 and options["inter_op_num_threads"] == 1
    # the head's own pool would spin beside the target's: one thread, no workers
    assert _options(folder, "mtp")["intra_op_num_threads"] == 1

