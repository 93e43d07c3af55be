"""The built-in model exported in onnxruntime-genai's form, for the side-by-side peer (mtplab.experiment.genai_runner).

The export is the same network with the same weights; only the form differs where genai needs it:
- I/O names: input_ids, attention_mask, position_ids, past_key_values.%d.key/value (attention
  layers), past.%d.conv / past.%d.recurrent (GatedDeltaNet layers), present.* likewise, hidden_states;
- lengths: seqlens_k and total_sequence_length are computed in the graph from attention_mask, and
  the KV cache is genai's separate past/present buffers (no query_seqlens, no shared buffer);
- logits are cast to float16: onnxruntime-genai 0.18 on CPU fails with float32 logits ("Cast -
  input and output types are the same"). Argmax over fp16 logits equals fp32 argmax unless two
  logits fall within fp16 rounding (~4e-3 here); identity against greedy is checked every run;
- GatedDeltaNet keeps state_update_capacity, fed capture_count=0 (genai does not read transitions).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mtplab.model import Artifact, ModelConfig

LENGTH_INPUTS = ("seqlens_k", "total_sequence_length", "query_seqlens", "capture_count")


def _names(cfg: ModelConfig, part: str) -> dict[str, str]:
    m: dict[str, str] = {"logits": "logits_fp32"}
    for i in cfg.attention_layer_ids if part == "target" else [0]:
        m |= {
            f"past_key.{i}": f"past_key_values.{i}.key",
            f"past_value.{i}": f"past_key_values.{i}.value",
            f"present_key.{i}": f"present.{i}.key",
            f"present_value.{i}": f"present.{i}.value",
        }
    if part == "target":
        for i in cfg.gdn_layer_ids:
            m |= {
                f"conv_state.{i}": f"past.{i}.conv",
                f"gdn_state.{i}": f"past.{i}.recurrent",
                f"present_conv_state.{i}": f"present.{i}.conv",
                f"present_gdn_state.{i}": f"present.{i}.recurrent",
            }
        m["hidden"] = "hidden_states"
    else:
        m["mtp_hidden"] = "hidden_states_out"
    return m


def to_genai_form(model: onnx.ModelProto, cfg: ModelConfig, part: str) -> onnx.ModelProto:
    """Rewrite one of mtplab's graphs (part = target | mtp) into onnxruntime-genai's I/O form."""
    g = model.graph
    names = _names(cfg, part)
    for n in g.node:
        n.input[:] = [names.get(x, x) for x in n.input]
        n.output[:] = [names.get(x, x) for x in n.output]
        if n.op_type == "GroupQueryAttention":
            n.input[:] = list(n.input)[:9]  # drop query_seqlens: separate past/present buffers
    F, kv = TensorProto.FLOAT, [1, cfg.attn_kv_heads, "past_len", cfg.attn_head_dim]
    inputs = []
    for v in g.input:
        if v.name in LENGTH_INPUTS:
            continue
        name = names.get(v.name, v.name)
        inputs.append(helper.make_tensor_value_info(name, F, kv) if name.startswith("past_key_values") else v)
        inputs[-1].name = name
    inputs += [
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total_len"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "M"]),
    ]
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([1], np.int64), "genai.axes"),
            numpy_helper.from_array(np.array(1, np.int64), "genai.one"),
            numpy_helper.from_array(np.array([0], np.int32), "capture_count"),
        ]
    )
    lengths = [
        helper.make_node("ReduceSum", ["attention_mask", "genai.axes"], ["genai.total_per_row"], keepdims=0),
        helper.make_node("Sub", ["genai.total_per_row", "genai.one"], ["genai.seqlens_k64"]),
        helper.make_node("Cast", ["genai.seqlens_k64"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["genai.mask_shape"]),
        helper.make_node("Gather", ["genai.mask_shape", "genai.one"], ["genai.total64"], axis=0),
        helper.make_node("Cast", ["genai.total64"], ["total_sequence_length"], to=TensorProto.INT32),
    ]
    body = list(g.node)
    del g.node[:]
    g.node.extend(lengths + body + [helper.make_node("Cast", ["logits_fp32"], ["logits"], to=TensorProto.FLOAT16)])
    outputs = []
    for v in g.output:
        name = names.get(v.name, v.name)
        if name == "logits_fp32":
            outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT16, [1, "M", cfg.vocab_size]))
        elif name.startswith("present.") and name.endswith((".key", ".value")):
            outputs.append(
                helper.make_tensor_value_info(name, F, [1, cfg.attn_kv_heads, "total_len", cfg.attn_head_dim])
            )
        elif not name.startswith(("gdn_transitions", "conv_input")):
            v.name = name
            outputs.append(v)
    del g.input[:], g.output[:]
    g.input.extend(inputs)
    g.output.extend(outputs)
    return model


# The MTP head's og.Model runs on one intra-op thread. genai gives each session a pool of its own, spinning
# (0.18 takes no session config entries to turn it off), and og.MtpGenerator alternates head steps and verifies
# every few hundred microseconds: with a head pool of the target's size beside the target's, on as many threads as
# cores, each pool's workers spin on the cores the other's run needs. Measured on 2 cores at 2 threads (interleaved,
# settled): small's MTP k=3 49 tok/s with the head on 2 threads, 85 on 1; the builder fixture's 923 and 1998.
HEAD_THREADS = 1
PEER_FORM = 3  # the peer folders' form: a change here makes the cached ones anew


def drop_older_forms(current: Path, *older: str) -> None:
    """Delete the cache's peer folders of other forms that the `older` globs (beside `current`) match: a form
    change (PEER_FORM) makes new folders, and a built-in model's export is a copy of its weights per thread count."""
    import shutil

    for stale in {p for pattern in older for p in current.parent.glob(pattern)}:
        if stale != current and stale.is_dir() and stale.suffix != ".tmp":  # another process's folder in the making
            shutil.rmtree(stale, ignore_errors=True)


def session_options(threads: int) -> dict:
    """genai's session_options matching mtplab's sessions: same intra-op threads, one inter-op thread.

    genai 0.18's session_options take no session config entries, so mtplab's
    `session.intra_op.allow_spinning=0` cannot be passed: genai decides spinning itself.
    """
    return {
        "log_id": "onnxruntime-genai",
        "provider_options": [],
        "intra_op_num_threads": threads,
        "inter_op_num_threads": 1,
    }


def genai_config(cfg: ModelConfig, part: str, threads: int = 1) -> dict:
    """genai_config.json for the target (hybrid state keys included) or the MTP head."""
    inputs = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "position_ids": "position_ids",
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
    }
    outputs = {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
    if part == "target":
        inputs |= {"past_conv_names": "past.%d.conv", "past_recurrent_names": "past.%d.recurrent"}
        outputs |= {
            "present_conv_names": "present.%d.conv",
            "present_recurrent_names": "present.%d.recurrent",
            "hidden_states": "hidden_states",
        }
    else:
        inputs["hidden_states"] = "hidden_states"
        outputs["hidden_states"] = "hidden_states_out"
    return {
        "model": {
            "type": "qwen3_5_text",
            "vocab_size": cfg.vocab_size,
            "context_length": cfg.max_seq_len,
            # genai needs an EOS inside the vocabulary; generation stopping on it is reported.
            "bos_token_id": 0,
            "pad_token_id": 0,
            "eos_token_id": [cfg.vocab_size - 1],
            "decoder": {
                "session_options": session_options(threads if part == "target" else HEAD_THREADS),
                "filename": "model.onnx",
                "head_size": cfg.attn_head_dim,
                "hidden_size": cfg.hidden_size,
                "num_attention_heads": cfg.attn_heads,
                "num_key_value_heads": cfg.attn_kv_heads,
                "num_hidden_layers": cfg.num_layers if part == "target" else 1,
                "inputs": inputs,
                "outputs": outputs,
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "max_length": cfg.max_seq_len,
            "min_length": 0,
            "past_present_share_buffer": False,
            "top_k": 1,
            "top_p": 1.0,
            "temperature": 1.0,
        },
    }


def export_genai(art: Artifact, out: str | Path, threads: int = 0) -> Path:
    """Write out/target and out/mtp, each model.onnx + genai_config.json, from a built artifact.

    threads: the sessions' intra-op threads, as RunConfig.threads (0: the core count).
    """
    from mtplab.base.threads import threads_used

    threads = threads_used(threads)
    out = Path(out)
    cfg = art.config
    for part, src in (("target", art.target), ("mtp", art.mtp)):
        folder = out / part
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save(to_genai_form(onnx.load(str(src)), cfg, part), str(folder / "model.onnx"))
        (folder / "genai_config.json").write_text(json.dumps(genai_config(cfg, part, threads), indent=1))
    (out / "manifest.json").write_text(
        json.dumps({"source": str(art.path), "config_hash": cfg.config_hash()}, indent=1)
    )
    return out
