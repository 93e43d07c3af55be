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



def test_a_new_peer_form_deletes_the_older_forms_folders_and_nothing_else(tmp_path):
    from mtplab.experiment.genai_export import drop_older_forms

    for name in ("small-genai-v2-t2", "small-genai-v3-t2", "small-genai-v2-t1", "other-genai-v2-t2"):
        (tmp_path / name / "target").mkdir(parents=True)
    drop_older_forms(tmp_path / "small-genai-v3-t2", "small-genai-v*-t2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-genai-v2-t2", "small-genai-v2-t1", "small-genai-v3-t2"]
