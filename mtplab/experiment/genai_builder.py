"""The onnxruntime-genai peer on a builder output folder: what genai 0.18 needs on the CPU, made in mtplab's cache.

The user's folder stays as the builder wrote it. The copy differs only where genai needs it:
- `shared_initializers` removed from genai_config (on the CPU, og.Model fails with "GetMemoryInfo
  for CPU should not be used" while it is there);
- the main model's logits cast to float16 (og.MtpGenerator on the CPU fails with "Cast - input
  and output types are the same" on float32 logits); argmax over fp16 logits equals the fp32
  argmax unless two logits fall within fp16 rounding, and identity against greedy is checked;
- the MTP head as an og.Model folder of its own (the builder writes it beside the main model);
- session_options with mtplab's intra-op thread count (the head's on HEAD_THREADS, genai_export says why).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from mtplab.experiment.genai_export import HEAD_THREADS, PEER_FORM, drop_older_forms, session_options
from mtplab.model import cache_dir
from mtplab.model.onnx_read import copy_data_files


def _cast_logits(model: onnx.ModelProto, logits: str) -> onnx.ModelProto:
    """The model with its `logits` output cast to float16 (the graph's own logits renamed)."""
    if next(o for o in model.graph.output if o.name == logits).type.tensor_type.elem_type == TensorProto.FLOAT16:
        return model
    inner = logits + ".fp32"
    for node in model.graph.node:
        node.output[:] = [inner if o == logits else o for o in node.output]
        node.input[:] = [inner if i == logits else i for i in node.input]
    model.graph.node.append(helper.make_node("Cast", [inner], [logits], to=TensorProto.FLOAT16, name="mtplab_logits_fp16"))
    out = next(o for o in model.graph.output if o.name == logits)
    out.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def builder_peer_folder(model, threads: int) -> Path:
    """folder/target and folder/mtp, each an og.Model folder, made once per (model, threads) in the cache."""
    folder = cache_dir() / "genai" / f"{model.description.name}-{model.content}-t{threads}-v{PEER_FORM}"
    if (folder / "ready").exists():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    src, config = model.path, copy.deepcopy(model.genai_config)
    m = config["model"]
    dec, mtp = m["decoder"], m.pop("mtp")
    dec.pop("shared_initializers", None)
    dec["session_options"] = session_options(threads)
    # target: the builder's main model, logits in float16
    target = tmp / "target"
    target.mkdir(parents=True)
    main = onnx.load(str(src / dec["filename"]), load_external_data=False)
    onnx.save(_cast_logits(main, dec["outputs"].get("logits", "logits")), str(target / dec["filename"]))
    copy_data_files(main, src, target)
    (target / "genai_config.json").write_text(json.dumps(config, indent=1))
    # mtp: the head as a model of its own (its weights point into both data files)
    head_dir = tmp / "mtp"
    head_dir.mkdir()
    head = onnx.load(str(src / mtp["filename"]), load_external_data=False)
    shutil.copy2(src / mtp["filename"], head_dir / mtp["filename"])
    copy_data_files(head, src, head_dir)
    head_cfg = copy.deepcopy(config)
    hd = head_cfg["model"]["decoder"]
    hd.update(filename=mtp["filename"], num_hidden_layers=mtp.get("num_hidden_layers", 1),
              inputs=mtp["inputs"], outputs=mtp["outputs"])
    for key in ("num_key_value_heads", "head_size"):
        if key in mtp:
            hd[key] = mtp[key]
    hd["session_options"] = session_options(HEAD_THREADS)
    (head_dir / "genai_config.json").write_text(json.dumps(head_cfg, indent=1))
    (tmp / "ready").write_text(str(src))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    stem = f"{model.description.name}-{model.content}-t{threads}"
    drop_older_forms(folder, stem, f"{stem}-v*")  # the form before PEER_FORM had no -v
    return folder
