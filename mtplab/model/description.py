"""One description of a model's runtime contract, whoever made the model.

The runtime (sessions, state buffers, feeds, the lossless stepper) reads only this: the graphs'
I/O names, the KV layout, how lengths and positions are fed, the conv and recurrent state layouts,
where the hidden state comes out, and what the `select` commit can replay. The built-in model is
described from its ModelConfig (`describe_builtin`); a folder written by onnxruntime-genai's model
builder from its genai_config.json and its graphs (`mtplab.model.builder`). `check_graph` holds a
description to the graph's real inputs and outputs.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mtplab.base.arrays import dtype_of
from mtplab.model.config import ModelConfig
from mtplab.model.graph import TransitionLayout, transition_layout
from mtplab.model.onnx_read import graph_io_table


@dataclass(frozen=True)
class KvLayer:
    """One attention layer's KV cache: [1, heads, capacity, head_dim], one buffer for past and present."""

    layer: int
    past_key: str
    past_value: str
    present_key: str
    present_value: str
    heads: int
    head_dim: int
    dtype: str = "float32"

    @property
    def np_dtype(self) -> np.dtype:
        return dtype_of(self.dtype)


# Where an op's kernel registers an output on its input's buffer: {op: {(input, output)}}, as the CUDA kernels
# register it (KernelDefBuilder MayInplace) in onnxruntime 1.30-1.32: GroupQueryAttention KV (past_key 3 ->
# present_key 1, past_value 4 -> present_value 2) and GatedDeltaNet state (6 -> 1). CausalConvWithState allows none
# on any provider: the CUDA kernel's past and present are __restrict__ and the CPU decode path memcpy's past[1:]
# into present. The CPU kernels register no MayInplace; their GroupQueryAttention takes a shared past/present
# buffer by design (past_present_share_buffer).
KERNEL_IN_PLACE: dict[str, frozenset[tuple[int, int]]] = {
    "GroupQueryAttention": frozenset({(3, 1), (4, 2)}), "GatedDeltaNet": frozenset({(6, 1)})}

# Where an aliased run computes what a run into a buffer of its own computes, though the kernel registers nothing:
# the CPU LinearAttention kernel copies past_state (3) into present_state (1), then updates present_state alone, head
# by head, so on one buffer the copy is onto itself. onnxruntime-genai binds it so (its RecurrentState shares past
# and present on every EP but WebGPU); with its own present buffer and the copy back after each forward, a
# state-heavy builder export decoded at 0.67-0.81x genai's rate (tests/test_runtime.py holds the aliased
# run bitwise to the other, at M=1 and M>1, on the installed onnxruntime). CUDA keeps the registrations: its
# LinearAttention kernel is not checked aliased on a GPU here.
ALIASED: dict[str, dict[str, frozenset[tuple[int, int]]]] = {
    "CPUExecutionProvider": {"LinearAttention": frozenset({(3, 1)})}}

# The binding rule, per provider: an output goes onto its input's buffer only where this table allows it
# (mtplab.runtime.sessions.check_in_place holds every binding to it). A StateTensor is in_place where its op's
# ports are in its provider's table (ModelDescription.on_provider; the registrations alone until then).
IN_PLACE: dict[str, dict[str, frozenset[tuple[int, int]]]] = {
    provider: {**KERNEL_IN_PLACE, **ALIASED.get(provider, {})}
    for provider in ("CUDAExecutionProvider", "CPUExecutionProvider")}


@dataclass(frozen=True)
class StateTensor:
    """One conv or recurrent state of a linear-attention layer (batch 1).

    in_place: the op's kernel may write present onto past's buffer (else present goes to a buffer
    of its own and is copied into past after the forward): the registrations' answer (KERNEL_IN_PLACE), or a
    provider's once ModelDescription.on_provider has resolved it.
    ports: (past's input index, present's output index) on its op, where one node reads past and writes present.
    """

    layer: int
    kind: str  # "conv" | "recurrent"
    past: str
    present: str
    shape: tuple[int, ...]
    dtype: str
    layout: str  # e.g. "[B, K-1, C] channels-last", "[B, Hv, Dk, Dv] K-major"
    op: str
    in_place: bool
    ports: tuple[int, int] | None = None

    def in_place_on(self, provider: str | None = None) -> bool:
        """Whether present goes onto past's buffer on `provider` (its IN_PLACE table); None, or a provider without
        one: where the kernel registers it (KERNEL_IN_PLACE)."""
        table = IN_PLACE.get(provider, KERNEL_IN_PLACE) if provider else KERNEL_IN_PLACE
        return self.ports is not None and self.ports in table.get(self.op, ())

    def registered(self) -> StateTensor:
        """This state with in_place as its kernel registers it (KERNEL_IN_PLACE): a description's answer until
        ModelDescription.on_provider resolves it."""
        return dataclasses.replace(self, in_place=self.in_place_on())

    @property
    def np_dtype(self) -> np.dtype:
        return dtype_of(self.dtype)

    @property
    def key(self) -> str:
        """The name the lossless check and the engine use for it: conv_state.{i} / gdn_state.{i}."""
        return f"{'conv_state' if self.kind == 'conv' else 'gdn_state'}.{self.layer}"


@dataclass(frozen=True)
class SelectOutput:
    """An output the `select` commit reads: its name, shape (None stands for M, the tokens of the forward), dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str

    def sized(self, M: int) -> tuple[int, ...]:
        return tuple(M if d is None else d for d in self.shape)

    @property
    def np_dtype(self) -> np.dtype:
        return dtype_of(self.dtype)


@dataclass(frozen=True)
class GraphIO:
    """One graph's I/O contract.

    lengths: "seqlens" (seqlens_k + total_sequence_length [+ query_seqlens] [+ capture_count], mtplab's
    built-in form) or "attention_mask" (a [1, total] mask; the graph derives the lengths from it).
    positions: the leading shape of position_ids before the M axis: () for none, (1,) for [1, M],
    (3, 1) for MRoPE's [3, 1, M].
    """

    path: Path
    input_ids: str
    logits: str
    hidden: str  # the hidden-state output the MTP head takes (target) / chains on (head)
    lengths: str
    positions: tuple[int, ...] = ()
    hidden_input: str | None = None  # the head's hidden-state input
    kv: tuple[KvLayer, ...] = ()
    states: tuple[StateTensor, ...] = ()
    query_seqlens: bool = False
    capture_count: bool = False
    dtype: str = "float32"  # activations: the hidden state (each KV layer and state names its own)
    logits_dtype: str = ""  # "" = dtype (a builder folder may cast its logits, e.g. to float16 for genai)
    # Extra outputs the `select` commit reads, per linear-attention layer: {layer: {role: SelectOutput}}.
    select_outputs: dict[int, dict[str, SelectOutput]] = field(default_factory=dict)
    # per-position's outputs, per recurrent layer: the state after each verified token (mtplab.model.per_position)
    position_states: dict[int, str] = field(default_factory=dict)
    counts: bool = True  # its session outputs the kept drafts' count beside its greedy tokens (greedy_outputs)

    @property
    def logits_type(self) -> np.dtype:
        return dtype_of(self.logits_dtype or self.dtype)

    @property
    def hidden_type(self) -> np.dtype:
        return dtype_of(self.dtype)


@dataclass(frozen=True)
class ModelDescription:
    """What mtplab needs to run a model: its target graph, its MTP head, and what each commit can do."""

    kind: str  # "built-in" | "builder"
    name: str
    source: str
    vocab_size: int
    hidden_size: int
    capacity: int  # KV positions mtplab allocates (prompt + tokens + verify headroom must fit)
    target: GraphIO
    mtp: GraphIO
    select: str  # "transitions" (GatedDeltaNet's compact state update), "replay-op" (LinearAttention replayed), or ""
    select_refused: str = ""  # why `select` cannot run, when it cannot
    transition_capacity: int = 0  # tokens per verify GatedDeltaNet's transitions hold (select="transitions"); 0: no limit
    transitions: TransitionLayout | None = None  # their layout, for select="transitions"
    config: ModelConfig | None = None  # the built-in model's config
    layer_kinds: tuple[str, ...] = ()  # per decoder layer: "attention" | "linear-attention"
    original_target: Path | None = None  # the user's graph, where `target` is mtplab's copy with extra outputs
    # the graph a decode runs where `target` is a copy whose extra outputs only a verify reads (per-position's)
    decode_target: GraphIO | None = None
    int8_compute: bool = False  # matmul inputs rounded to int8 (MatMulNBits accuracy_level 4)

    def on_provider(self, provider: str) -> ModelDescription:
        """This description as `provider` runs it: each state in_place where its kernel there allows it (IN_PLACE).
        The engine resolves its model's once, for its device: buffers, bindings and carries follow it."""
        states = tuple(dataclasses.replace(s, in_place=s.in_place_on(provider)) for s in self.target.states)
        if all(a.in_place == b.in_place for a, b in zip(states, self.target.states)):
            return self
        return dataclasses.replace(self, target=dataclasses.replace(self.target, states=states))

    def own_graph(self) -> ModelDescription | None:
        """The user's own graph, where `target` is mtplab's copy with select's extra outputs (else None).

        A forward that reads none of those outputs (a decode, greedy, a prefill, a re-advance) runs it:
        the copy computes bitwise what it computes, and its extra outputs cost time a baseline must not pay.
        """
        if self.decode_target is not None:
            return dataclasses.replace(self, target=self.decode_target, decode_target=None, original_target=None)
        if self.original_target is None:
            return None
        own = dataclasses.replace(self.target, path=self.original_target, select_outputs={}, position_states={},
                                  capture_count=False)
        return dataclasses.replace(self, target=own, original_target=None)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(kv.layer for kv in self.target.kv)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(sorted({s.layer for s in self.target.states}))

    @property
    def dtype(self) -> str:
        return self.target.dtype

    @property
    def precision(self) -> str:
        """"fp16", "fp32" or "int8" (int8 matmul inputs): the key of the tolerance tables (mtplab.check.verdict, lossless)."""
        if self.int8_compute:
            return "int8"
        return "fp16" if self.target.dtype == "float16" else "fp32"

    def max_k(self) -> int | None:
        """The largest draft length a verify can take (None: no limit from the model)."""
        return self.transition_capacity - 1 if self.transition_capacity else None

    def layers_line(self) -> str:
        attn, lin = len(self.attention_layers), len(self.linear_layers)
        ops = sorted({s.op for s in self.target.states if s.kind == "recurrent"})
        return f"{len(self.layer_kinds) or attn + lin} layers = {lin} linear-attention ({', '.join(ops)}) + {attn} attention"


def beyond_capacity(reach: int, capacity: int) -> ValueError:
    """The refusal of a forward whose sequence would reach `reach` tokens, over the KV capacity (raised by whoever
    checks, before any run)."""
    return ValueError(f"sequence would reach {reach} tokens, beyond the KV capacity {capacity}")


def length_feeds(io: GraphIO, length, M: int, total: int, into: dict | None = None) -> dict[str, np.ndarray]:
    """Feeds that tell a graph the M new tokens sit at positions length..length+M-1.

    length: an int (batch 1), or an int array [B]: each row's own length (the built-in graphs' seqlens form).
    total: the attention span the graph sees (the KV capacity for a static-shape replay, or
    length + M for a growing cache). Static shapes keep a replayed plan valid across lengths.
    into: what an earlier call returned for the same io, M, total and batch, rewritten in place and returned (a
    forward's hot path allocates nothing). Whoever passes `into` uses the feeds before the next call: the
    executor stages them into its slot's buffers, or binds them for the one synchronous eager run.
    """
    if into is None:
        batch = 1 if np.ndim(length) == 0 else len(length)
        into = {}
        if io.lengths == "seqlens":
            into["seqlens_k"] = np.zeros(batch, dtype=np.int32)
            into["total_sequence_length"] = _constant(total, ())
            if io.query_seqlens:
                into["query_seqlens"] = _constant(M, (batch,))
        else:
            into["attention_mask"] = np.zeros((batch, total), dtype=np.int64)
            if io.query_seqlens:  # mtplab's batch copy of a builder graph (mtplab.model.batch_form)
                into["query_seqlens"] = _constant(M, (batch,))
        if io.positions:  # the batch axis is the last before M's: [B, M], or MRoPE's [3, B, M]
            into["position_ids"] = np.zeros((*io.positions[:-1], batch, M), dtype=np.int64)
        if io.capture_count:
            into["capture_count"] = _constant(M, (batch,))
    seqlens, positions = into.get("seqlens_k"), into.get("position_ids")
    rows = isinstance(length, np.ndarray) and length.ndim == 1  # each row's own length
    if seqlens is not None:
        np.add(length, M - 1, out=seqlens, casting="unsafe")
    elif not rows:
        mask = into["attention_mask"]
        mask[0, : length + M] = 1
        mask[0, length + M :] = 0
    else:  # row b's ones up to its own length + M
        np.less(_span(into["attention_mask"].shape[1]), (length + M)[:, None], out=into["attention_mask"],
                casting="unsafe")
    if positions is not None:
        if not rows:
            positions[...] = length if M == 1 else np.arange(length, length + M)
        else:
            np.add(length[:, None], _span(M), out=positions)
    return into


@functools.cache
def _span(n: int) -> np.ndarray:
    """0..n-1, read-only (a per-row mask's and positions' offsets)."""
    out = np.arange(n, dtype=np.int64)
    out.flags.writeable = False
    return out


@functools.cache
def _constant(value: int, shape: tuple) -> np.ndarray:
    """A read-only int32 feed that never changes for its value (feeds are copied into the slot's buffers)."""
    a = np.full(shape, value, dtype=np.int32)
    a.flags.writeable = False
    return a


def describe_builtin(cfg: ModelConfig, target: Path, mtp: Path) -> ModelDescription:
    """The built-in model in the same terms as any other: names as mtplab's graph writes them."""
    T = "float16" if cfg.dtype == "fp16" else "float32"
    kv = tuple(
        KvLayer(i, f"past_key.{i}", f"past_value.{i}", f"present_key.{i}", f"present_value.{i}",
                cfg.attn_kv_heads, cfg.attn_head_dim, T)
        for i in cfg.attention_layer_ids
    )
    states = []
    for i in cfg.gdn_layer_ids:
        states.append(StateTensor(i, "conv", f"conv_state.{i}", f"present_conv_state.{i}",
                                  (1, cfg.conv_kernel - 1, cfg.gdn_conv_channels), T,
                                  "[B, K-1, C] channels-last", "CausalConvWithState", False, (3, 1)))
        states.append(StateTensor(i, "recurrent", f"gdn_state.{i}", f"present_gdn_state.{i}",
                                  (1, cfg.gdn_value_heads, cfg.gdn_head_dim_v, cfg.gdn_head_dim_k), "float32",
                                  "[B, Hv, Dv, Dk] V-major", "GatedDeltaNet", False, (6, 1)))
    states = [s.registered() for s in states]
    form = cfg.form
    target_io = GraphIO(
        Path(target), "input_ids", "logits", "hidden", "seqlens", kv=kv, states=tuple(states),
        query_seqlens=form.query_seqlens, capture_count=True, dtype=T,
        select_outputs={
            i: {
                "transitions": SelectOutput(
                    f"gdn_transitions.{i}", (1, cfg.transition_capacity * transition_layout(cfg).width), "float32"
                ),
                "conv_input": SelectOutput(f"conv_input.{i}", (1, None, cfg.gdn_conv_channels), T),
            }
            for i in cfg.gdn_layer_ids
        },
    )
    head_kv = (KvLayer(0, "past_key.0", "past_value.0", "present_key.0", "present_value.0",
                       cfg.attn_kv_heads, cfg.attn_head_dim, T),)
    mtp_io = GraphIO(Path(mtp), "input_ids", "logits", "mtp_hidden", "seqlens", hidden_input="hidden_states",
                     kv=head_kv, query_seqlens=form.query_seqlens, dtype=T, counts=False)
    kinds = tuple("attention" if i in cfg.attention_layer_ids else "linear-attention" for i in range(cfg.num_layers))
    return ModelDescription(
        "built-in", cfg.name, str(Path(target).parent), cfg.vocab_size, cfg.hidden_size, cfg.max_seq_len,
        target_io, mtp_io, "transitions", transition_capacity=cfg.transition_capacity, config=cfg, layer_kinds=kinds,
        transitions=transition_layout(cfg),
    )


def check_graph(io: GraphIO, where: str, capacity: int | None = None) -> None:
    """ValueError naming every input or output the description expects that the graph lacks or shapes otherwise."""
    inputs, outputs = graph_io_table(io.path)
    problems = graph_problems(io, inputs, outputs, capacity)
    if problems:
        raise ValueError(f"{where} ({io.path.name}): " + "; ".join(problems)
                         + f" (the graph's inputs: {sorted(inputs)}; outputs: {sorted(outputs)})")


def graph_problems(io: GraphIO, inputs: dict, outputs: dict, capacity: int | None = None) -> list[str]:
    """What check_graph finds, on a graph's io tables (onnx_read.io_table's): missing inputs and outputs, states and
    KV caches whose fixed dimensions are not the ones mtplab allocates (a KV's length: `capacity`, where given),
    inputs mtplab would not feed."""
    want_in = {io.input_ids: None}
    want_in.update(length_feeds(io, 0, 1, 1))
    if io.hidden_input:
        want_in[io.hidden_input] = None
    want_out = {io.logits: None, io.hidden: None}
    for kv in io.kv:
        want_in.update(dict.fromkeys((kv.past_key, kv.past_value), kv))
        want_out.update(dict.fromkeys((kv.present_key, kv.present_value), kv))
    for s in io.states:
        want_in[s.past], want_out[s.present] = s, s
    for roles in io.select_outputs.values():
        want_out.update(dict.fromkeys(o.name for o in roles.values()))
    want_out.update(dict.fromkeys(io.position_states.values()))
    problems = []
    for kind, want, have in (("input", want_in, inputs), ("output", want_out, outputs)):
        for name, s in want.items():
            if name not in have:
                problems.append(f"no {kind} named {name!r}")
            elif isinstance(s, StateTensor):
                dims, dtype = have[name]
                fixed = [d for d in dims[1:] if isinstance(d, int) and d > 0]
                if len(dims) != len(s.shape) or (len(fixed) == len(dims) - 1 and tuple(fixed) != s.shape[1:]):
                    problems.append(f"{kind} {name!r} is {list(dims)}, expected {list(s.shape)} ({s.layout})")
                elif dtype != s.dtype:
                    problems.append(f"{kind} {name!r} is {dtype}, expected {s.dtype}")
            elif isinstance(s, KvLayer):
                dims = have[name][0]
                want_dims = (s.heads, capacity, s.head_dim)
                if len(dims) != 4 or any(isinstance(d, int) and d > 0 and w is not None and d != w
                                         for d, w in zip(dims[1:], want_dims)):
                    length = "the KV capacity" if capacity is None else capacity
                    problems.append(f"{kind} {name!r} is {list(dims)}, expected [B, {s.heads}, {length}, {s.head_dim}] "
                                    "(heads, positions, head dim)")
    unfed = sorted(set(inputs) - set(want_in))
    if unfed:
        problems.append(f"inputs mtplab would not feed: {unfed}")
    return problems
