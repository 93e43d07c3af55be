"""Folders written by onnxruntime-genai's model builder (Qwen3.5-style hybrids with an MTP head).

`open_builder(folder)` reads genai_config.json and the graphs' real inputs, outputs and nodes, and
describes the model in mtplab's terms (mtplab.model.description): which layers hold KV and which
hold conv and recurrent state, each state's layout (read from the op that consumes it, never
assumed), how lengths and positions are fed, and where the hidden state comes out. Nothing in the
user's folder is touched: the copy of the target with the outputs `select` needs lives in mtplab's
cache (mtplab.model.surgery).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import onnx

from mtplab.base.files import file_digest
from mtplab.model.description import GraphIO, KvLayer, ModelDescription, StateTensor, check_graph
from mtplab.model.onnx_read import (
    annotated_widths,
    attention_head_size,
    attributes,
    consumer,
    data_extents,
    data_files,
    graph_io_table,
    op_counts,
    parameter_count,
    rotary_rows,
    unproduced_inputs,
    weight_format,
)

# KV capacity mtplab allocates for a builder model, at most its context length.
DEFAULT_CAPACITY = 1024
# The com.microsoft ops a builder model's CPU graphs use, known to the op check; onnxruntime 1.30.0, 1.31.1
# and 1.32.0 each have every one of them (their schemas; a missing kernel is named when a session is made).
BUILDER_OPS = (
    "LinearAttention",
    "LinearAttentionGate",
    "GatedRMSNorm",
    "CausalConvWithState",
    "GatedDeltaNet",
    "MRotaryEmbedding",
    "SkipSimplifiedLayerNormalization",
    "GroupQueryAttention",
    "MatMulNBits",
)
BUILDER_OPS_SEEN_IN = "onnxruntime 1.30.0, 1.31.1 and 1.32.0"
RECURRENT_LAYOUTS = {"LinearAttention": "[B, Hv, Dk, Dv] K-major", "GatedDeltaNet": "[B, Hv, Dv, Dk] V-major"}


# What onnxruntime-genai 0.18's builder writes for a Qwen3.5 hybrid, tried with mtplab on onnxruntime 1.32 (CPU):
# (builder options, what mtplab does with the folder).
BUILDER_FORMS = (
    ("-p fp32 -e cpu", "runs: LinearAttention; every commit (select replays LinearAttention), the head, the peer"),
    ("-p int4 -e cpu [--extra_options int4_accuracy_level=1|4]",
     "runs: MatMulNBits weights; every commit, the head, the peer (accuracy_level 4: int8 matmul inputs, looser state "
     "tolerance)"),
    ("-p fp16|int4 -e cuda", "runs on the CPU too: float16 LinearAttention + GroupQueryAttention; every commit, the "
                             "head, the peer"),
    ("-p fp16|int4 -e cuda --extra_options linear_attn_op=gated_delta_net",
     "runs on the CPU too: GatedDeltaNet; every commit (select replays the op's own transitions), the head, the peer"),
    ("a Cast of `logits` to float16 (what genai's MtpGenerator needs on the CPU)", "runs: logits read as float16"),
    ("-p fp16|bf16 -e cpu, -p fp32 -e cuda", "refused: the builder writes an invalid graph (MultiHeadAttention form)"),
    ("-p bf16 -e cuda", "refused: bfloat16 (the CPU EP lacks bfloat16 kernels; the CUDA backend runs float16)"),
    ("-e cpu --extra_options linear_attn_op=gated_delta_net", "the builder refuses it (GatedDeltaNet needs -e cuda)"),
)


def builder_forms_text() -> str:
    """The builder forms mtplab runs and refuses, one per line (README and `mtplab model inspect --help`)."""
    return "\n".join(f"  {options}: {what}" for options, what in BUILDER_FORMS)


def is_builder_folder(path: str | Path) -> bool:
    return (Path(path) / "genai_config.json").is_file()


@dataclass(frozen=True)
class BuilderModel:
    """A builder output folder as mtplab runs it: the user's files plus mtplab's derived copies."""

    path: Path
    description: ModelDescription
    genai_config: dict  # genai_config.json, as read
    ops: dict  # {"target": {op: count}, "mtp": {...}}
    parameters: dict  # {"target": n, "mtp": n}
    content: str  # hash of the graphs and genai_config (not the weights' data files)
    weights: str = ""  # e.g. "int4 weights (MatMulNBits x24, int8 matmul inputs: accuracy_level 4)"; "" for float

    @property
    def target(self) -> Path:
        return self.description.target.path

    @property
    def mtp(self) -> Path:
        return self.description.mtp.path

    def options(self) -> str:
        """The builder options this folder was made with, as far as its files tell them."""
        d, t = self.description, self.description.target
        precision = "int4" if self.weights.startswith("int4") else {"float32": "fp32", "float16": "fp16",
                                                                     "bfloat16": "bf16"}.get(t.dtype, t.dtype)
        if "accuracy_level 4" in self.weights:
            precision += " (int4_accuracy_level=4)"
        providers = self.genai_config["model"]["decoder"].get("session_options", {}).get("provider_options", [])
        target = ", ".join(k for p in providers for k in p) or "cpu"
        recurrent = {s.op for s in d.target.states if s.kind == "recurrent"}
        op = "gated_delta_net" if "GatedDeltaNet" in recurrent else "linear_attention (default)"
        return f"-p {precision} -e {target}, linear_attn_op={op}, logits {t.logits_type.name}"

    def identity(self) -> dict:
        """What a result records about the model it ran on."""
        return {"name": self.description.name, "hash": self.content, "summary": self.summary(),
                "parameters": self.parameters, "kind": "builder", "path": str(self.path)}

    def summary(self) -> str:
        d = self.description
        ops = sorted(set(self.ops["target"]) | set(self.ops["mtp"]))
        return (
            f"{d.name}: onnxruntime-genai builder model ({self.genai_config['model'].get('type', '?')}), "
            f"{self.parameters['target'] / 1e6:.2f}M params (MTP head {self.parameters['mtp'] / 1e6:.2f}M), "
            f"{d.layers_line()}, {d.dtype} activations{', ' + self.weights if self.weights else ''}, "
            f"ops: {', '.join(o.split(':')[-1] for o in ops)}"
        )


def _template(pattern: str) -> re.Pattern:
    return re.compile("^" + re.escape(pattern).replace("%d", r"(\d+)") + "$")


def _layers(names, pattern: str | None) -> dict[int, str]:
    if not pattern:
        return {}
    rx = _template(pattern)
    return {int(m.group(1)): n for n in names if (m := rx.match(n))}


def whole_number(value) -> int | None:
    """A JSON value as a whole number above 0 (32, or 32.0 as some writers give it), else None (a string, a
    bool, 32.5, 0)."""
    if type(value) is float and value.is_integer():
        value = int(value)
    return value if type(value) is int and value > 0 else None


def _fail(folder: Path, what: str) -> ValueError:
    return ValueError(f"{folder}: {what}")


def _load_graph(folder: Path, filename: str, role: str) -> onnx.ModelProto:
    path = folder / filename
    if not path.is_file():
        raise _fail(folder, f"missing file {filename} (genai_config.json names it as the {role} graph)")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends: name the file instead
        raise _fail(folder, f"{filename} is not a readable ONNX model ({type(err).__name__}: {err})") from None
    missing = sorted(f for f in data_files(model) if not (folder / f).is_file())
    if missing:
        raise _fail(folder, f"missing file {', '.join(missing)} (external weights of {filename})")
    for name, need in sorted(data_extents(model).items()):
        if (size := (folder / name).stat().st_size) < need:
            raise _fail(folder, f"{name} holds {size:,} bytes, but {filename}'s weights reach {need:,} into it: the "
                                "file is cut short (copy it again from where the model was built)")
    dangling = unproduced_inputs(model)
    if dangling:
        node, name = dangling[0]
        hint = (" (seen with onnxruntime-genai 0.18's MultiHeadAttention exports, -p fp16/bf16 -e cpu and -p fp32 "
                "-e cuda, whose mask subgraph reads layer 0's past key when layer 0 is no attention layer: rebuild "
                "with another precision or execution provider)") if "past_key" in name else ""
        raise _fail(folder, f"{filename} is not a valid graph: node {node} reads {name!r}, which is no graph input, "
                            f"weight or node output ({len(dangling)} such input{'s' * (len(dangling) > 1)}), so "
                            f"onnxruntime refuses to load it{hint}")
    return model


def _dims(folder: Path, name: str, dims: tuple, rank: int) -> tuple[int, ...]:
    """A state's shape at batch 1: every dim after the batch must be a number in the graph."""
    if len(dims) != rank or not all(isinstance(d, int) and d > 0 for d in dims[1:]):
        raise _fail(folder, f"unknown state layout: {name} is declared {list(dims)}, mtplab needs rank {rank} "
                            "with every dim after the batch fixed")
    return (1, *dims[1:])


def open_builder(folder: str | Path, capacity: int = DEFAULT_CAPACITY) -> BuilderModel:
    """Read and check a builder output folder; ValueError naming the problem, before any session is made."""
    from mtplab.model.surgery import select_copy

    folder = Path(folder)
    cfg_path = folder / "genai_config.json"
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder (expected an onnxruntime-genai model builder output folder)")
    if not cfg_path.is_file():
        raise _fail(folder, "missing file genai_config.json (not an onnxruntime-genai model builder output folder)")
    try:
        config = json.loads(cfg_path.read_text())
    except ValueError as err:
        raise _fail(folder, f"genai_config.json is not valid JSON ({err})") from None
    try:
        model_cfg, dec = config["model"], config["model"]["decoder"]
        vocab, hidden = int(model_cfg["vocab_size"]), int(dec["hidden_size"])
    except (ValueError, KeyError, TypeError) as err:
        raise _fail(folder, f"genai_config.json lacks what mtplab reads ({type(err).__name__}: {err})") from None
    mtp_cfg = model_cfg.get("mtp")
    if not mtp_cfg or not mtp_cfg.get("enabled", True):
        raise _fail(folder, "genai_config.json has no enabled `mtp` section: mtplab needs the model's MTP head "
                            "(build it with the model builder from a checkpoint that has mtp.* weights)")
    target_model = _load_graph(folder, dec.get("filename", "model.onnx"), "decoder")
    mtp_model = _load_graph(folder, mtp_cfg.get("filename", "mtp.onnx"), "mtp")
    target_path, mtp_path = folder / dec.get("filename", "model.onnx"), folder / mtp_cfg.get("filename", "mtp.onnx")
    t_in, t_out = graph_io_table(target_path)
    context = model_cfg.get("context_length")
    if context is not None:
        if (whole := whole_number(context)) is None:
            raise _fail(folder, f"genai_config.json's model.context_length is {context!r}, not a whole number of "
                                "tokens above 0")
        context = whole
    cap = min(capacity, context or capacity)
    # positions past a rotary table's rows do not run (its cos/sin caches are the graph's own limit)
    cap = min([cap, *(rows for m in (target_model, mtp_model) if (rows := rotary_rows(m)) is not None)])

    target = _graph_io(folder, target_path, target_model, dec, t_in, t_out, dec.get("head_size"),
                       "model.decoder.head_size")
    m_in, m_out = graph_io_table(mtp_path)
    own = "head_size" in mtp_cfg  # the head's own, else the decoder's
    head = dataclasses.replace(_graph_io(folder, mtp_path, mtp_model, mtp_cfg, m_in, m_out, mtp_cfg.get(
        "head_size", dec.get("head_size")), "model.mtp.head_size" if own else "model.decoder.head_size"), counts=False)
    if not head.kv:
        raise _fail(folder, f"{mtp_path.name}: genai_config.json's mtp past_key_names "
                            f"{mtp_cfg.get('inputs', {}).get('past_key_names')!r} matches no input of {mtp_path.name} "
                            f"(its inputs: {sorted(m_in)})")
    if len(head.kv) != 1:
        raise _fail(folder, f"{mtp_path.name}: mtplab runs a one-layer MTP head, this one has {len(head.kv)} KV layers")
    main_hidden = mtp_cfg.get("main_hidden_states")
    if main_hidden is not None and main_hidden != target.hidden:
        raise _fail(folder, f"genai_config.json's mtp.main_hidden_states is {main_hidden!r}, but the decoder's "
                            f"hidden_states output is {target.hidden!r}")
    # the layers as the graph holds them (genai_config.json's num_hidden_layers is not read: the graph is what runs)
    attention = {kv.layer for kv in target.kv}
    layers = attention | {s.layer for s in target.states}
    kinds = tuple("attention" if i in attention else "linear-attention" for i in range(max(layers) + 1 if layers else 0))
    name = folder.name
    int8 = any(n.op_type == "MatMulNBits" and attributes(n).get("accuracy_level", 0) == 4
               for m in (target_model, mtp_model) for n in m.graph.node)
    desc = ModelDescription("builder", name, str(folder), vocab, hidden, cap, target, head, "", layer_kinds=kinds,
                            int8_compute=int8)
    for io, where in ((target, f"{folder.name}/{target_path.name}"), (head, f"{folder.name}/{mtp_path.name}")):
        check_graph(io, where)
    declared = [(f"{target_path.name}'s {target.logits}", t_out, target.logits, vocab, "model.vocab_size"),
                (f"{mtp_path.name}'s {head.logits}", m_out, head.logits, vocab, "model.vocab_size"),
                (f"{target_path.name}'s {target.hidden}", t_out, target.hidden, hidden, "model.decoder.hidden_size"),
                (f"{mtp_path.name}'s {head.hidden_input}", m_in, head.hidden_input, hidden, "model.decoder.hidden_size")]
    wrong = [f"{what} is declared [..., {dims[-1]}], genai_config.json's {field} is {value}"
             for what, table, name, value, field in declared
             if (dims := table.get(name, ((),))[0]) and isinstance(dims[-1], int) and dims[-1] > 0 and dims[-1] != value]
    if wrong:
        raise _fail(folder, "genai_config.json disagrees with the graphs: " + "; ".join(wrong))
    if target.dtype != m_in.get(head.hidden_input, ((), target.dtype))[1]:
        raise _fail(folder, f"the head's {head.hidden_input} is {m_in[head.hidden_input][1]}, "
                            f"the target's hidden states are {target.dtype}")
    check_builder_ops(folder, {n.op_type for m in (target_model, mtp_model) for n in m.graph.node})
    # The content key of every cached derivative (select's copy, the peer's folder, the calibration): the config, both
    # graphs and their external weights (a copy holds the weights too, so changed weights must make a new copy).
    weights = sorted({folder / f for m in (target_model, mtp_model) for f in data_files(m)})
    blob = cfg_path.read_bytes() + target_path.read_bytes() + mtp_path.read_bytes()
    blob += "".join(f"{w.name}:{file_digest(w)};" for w in weights).encode()
    content = hashlib.sha256(blob).hexdigest()[:16]
    desc = select_copy(desc, target_model, content)
    return BuilderModel(
        folder, desc, config, {"target": op_counts(target_model), "mtp": op_counts(mtp_model)},
        {"target": parameter_count(target_model), "mtp": parameter_count(mtp_model)}, content, weight_format(target_model),
    )


def _check_kv_node(folder: Path, where: str, model, past_k: str, past_v: str, pres_k: str, pres_v: str) -> None:
    """The names must sit where GroupQueryAttention reads and writes them: past key/value inputs 3/4, present 1/2."""
    node = consumer(model, past_k)
    if node is None or node.op_type != "GroupQueryAttention":
        return  # another attention op: its own slots are not known here; the graph check still holds the names
    ins, outs = list(node.input) + [""] * 5, list(node.output) + [""] * 3
    got = {"past key": ins[3], "past value": ins[4], "present key": outs[1], "present value": outs[2]}
    want = {"past key": past_k, "past value": past_v, "present key": pres_k, "present value": pres_v}
    wrong = [f"{role} is {want[role]!r} in genai_config.json, {got[role]!r} in {node.name}"
             for role in want if got[role] != want[role]]
    if wrong:
        raise _fail(folder, f"{where}: KV names do not match the attention node: " + "; ".join(wrong))


def check_builder_ops(folder: Path, ops: set[str]) -> None:
    """ValueError naming every op the graphs use that the installed onnxruntime does not know."""
    import onnxruntime

    from mtplab.model.artifact import available_ops

    missing = sorted(ops - available_ops())
    if missing:
        known = [op for op in missing if op in BUILDER_OPS]
        hint = f" ({', '.join(known)}: {BUILDER_OPS_SEEN_IN} have them)" if known else ""
        raise _fail(folder, f"onnxruntime {onnxruntime.__version__} lacks ops its graphs use: {missing}{hint}")


def _graph_io(folder: Path, path: Path, model: onnx.ModelProto, section: dict, ins: dict, outs: dict,
              head_size, head_size_key: str) -> GraphIO:
    names_in, names_out = section.get("inputs", {}), section.get("outputs", {})
    where = f"{folder.name}/{path.name}"
    if head_size is not None:
        if (whole := whole_number(head_size)) is None:
            raise _fail(folder, f"genai_config.json's {head_size_key} is {head_size!r}, not a whole number above 0")
        head_size = whole

    def need(table: dict, key: str, default: str, kind: str) -> str:
        name = (names_in if kind == "input" else names_out).get(key, default)
        if name not in table:
            raise _fail(folder, f"{where} has no {kind} named {name!r} (genai_config.json: {key}; "
                                f"the graph's {kind}s: {sorted(table)})")
        return name

    input_ids = need(ins, "input_ids", "input_ids", "input")
    logits = need(outs, "logits", "logits", "output")
    hidden = need(outs, "hidden_states", "hidden_states", "output")
    hidden_input = need(ins, "hidden_states", "hidden_states", "input") if "hidden_states" in names_in else None
    mask = names_in.get("attention_mask", "attention_mask")
    if mask != "attention_mask" or "attention_mask" not in ins:
        raise _fail(folder, f"{where} has no input named 'attention_mask' (genai_config.json: {mask!r}; mtplab feeds "
                            f"builder graphs their lengths through it; the graph's inputs: {sorted(ins)})")
    positions: tuple[int, ...] = ()
    if "position_ids" in names_in and names_in["position_ids"] not in ins:
        raise _fail(folder, f"{where} has no input named {names_in['position_ids']!r} (genai_config.json: "
                            f"position_ids; the graph's inputs: {sorted(ins)})")
    if "position_ids" in ins:
        dims = ins["position_ids"][0]
        positions = (3, 1) if len(dims) == 3 else (1,)
    widths = annotated_widths(model)
    past_k, past_v = _layers(ins, names_in.get("past_key_names")), _layers(ins, names_in.get("past_value_names"))
    pres_k, pres_v = _layers(outs, names_out.get("present_key_names")), _layers(outs, names_out.get("present_value_names"))
    kv = []
    for i in sorted(past_k):
        for table, what in ((past_v, "past value"), (pres_k, "present key"), (pres_v, "present value")):
            if i not in table:
                raise _fail(folder, f"{where}: attention layer {i} has a past key but no {what} "
                                    f"(genai_config.json names: {names_in.get('past_key_names')}, ...)")
        dims = ins[past_k[i]][0]
        heads = dims[1] if len(dims) == 4 and isinstance(dims[1], int) else None
        declared = dims[3] if len(dims) == 4 and isinstance(dims[3], int) and dims[3] > 0 else None
        computed = attention_head_size(model, past_k[i], widths)
        size = declared or head_size or (computed[0] if computed else None)
        if heads is None or not size:
            raise _fail(folder, f"unknown KV layout: {past_k[i]} is declared {list(dims)} (mtplab needs "
                                "[B, kv_heads, past, head_size] with kv_heads fixed and head_size known)")
        said = [(f"{past_k[i]} is declared [..., {declared}]", declared),
                (f"genai_config.json's {head_size_key} is {head_size}", head_size)]
        if computed:
            said.append((f"attention layer {i} computes heads of {computed[0]} ({computed[1]})", computed[0]))
        if len({value for _, value in said if value}) > 1:
            raise _fail(folder, f"{where}: the head size disagrees: " + "; ".join(text for text, value in said if value))
        _check_kv_node(folder, where, model, past_k[i], past_v[i], pres_k[i], pres_v[i])
        kv.append(KvLayer(i, past_k[i], past_v[i], pres_k[i], pres_v[i], int(heads), int(size), ins[past_k[i]][1]))
    states = []
    for kind, key_in, key_out in (("conv", "past_conv_names", "present_conv_names"),
                                  ("recurrent", "past_recurrent_names", "present_recurrent_names")):
        past, present = _layers(ins, names_in.get(key_in)), _layers(outs, names_out.get(key_out))
        for i in sorted(past):
            if i not in present:
                raise _fail(folder, f"{where}: {past[i]} has no present output ({names_out.get(key_out)} for layer {i})")
            node = consumer(model, past[i])
            op = node.op_type if node is not None else "none"
            dims, dtype = ins[past[i]]
            shape = _dims(folder, past[i], dims, 3 if kind == "conv" else 4)
            if kind == "conv":
                if op != "CausalConvWithState":
                    raise _fail(folder, f"unknown state layout: {past[i]} feeds {op}, mtplab knows CausalConvWithState")
                last = attributes(node).get("channels_last", 0) or attributes(node).get("state_channels_last", 0)
                layout = "[B, K-1, C] channels-last" if last else "[B, C, K-1] channels-first"
            else:
                if op not in RECURRENT_LAYOUTS:
                    raise _fail(folder, f"unknown state layout: {past[i]} feeds {op}, mtplab knows "
                                        f"{sorted(RECURRENT_LAYOUTS)}")
                layout = RECURRENT_LAYOUTS[op]
            # where its node reads past and writes present: the ports a provider's IN_PLACE table is read at
            ports = ((list(node.input).index(past[i]), list(node.output).index(present[i]))
                     if present[i] in node.output else None)
            states.append(StateTensor(i, kind, past[i], present[i], shape, dtype, layout, op, False, ports).registered())
    dtype, logits_dtype = outs[hidden][1], outs[logits][1]
    return GraphIO(path, input_ids, logits, hidden, "attention_mask", positions, hidden_input, tuple(kv),
                   tuple(states), dtype=dtype, logits_dtype="" if logits_dtype == dtype else logits_dtype)
