"""The model's persistent state buffers, and the feeds, outputs and bindings of each forward on them.

The target's persistent bindings (attention KV buffers, conv carries, GatedDeltaNet and LinearAttention states)
are owned here and bound by address into every slot, by both sessions when Verify has a sibling.

An op's output is bound onto its own input's buffer (updated in place) only where the provider's kernel allows it
(mtplab.model.description.IN_PLACE; the engine's description says so per state). CausalConvWithState's never is:
its present carry goes to a buffer of its own and carry() copies it into the past carry after the run (on the
device, in stream order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from mtplab.model.description import ModelDescription, StateTensor, beyond_capacity, length_feeds
from mtplab.model.greedy_outputs import ACCEPTED, TOKENS
from mtplab.model.per_position import positions
from mtplab.runtime.arena import Arena, to_numpy
from mtplab.runtime.signature import OutputSpec


class Buffers(dict):
    """A state's buffers by layer or name, counting replacements: what target_io builds once stays valid
    only while no buffer has been replaced (a moved buffer must reach the executor's check)."""

    version = 0

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.version += 1

    def __delitem__(self, key) -> None:
        super().__delitem__(key)
        self.version += 1

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key, *default):
        self.version += 1
        return super().pop(key, *default)


@dataclass
class TargetState:
    """Persistent state of `batch` sequences on the target: buffers bound by address, plus their lengths.

    kv[layer] = (key, value) [B, heads, capacity, head_dim]; conv[layer] and gdn[layer] hold each
    linear-attention layer's conv and recurrent state in the layouts the model description gives, B rows;
    present[past name] is the own output buffer of a state whose kernel cannot write in place.
    lengths [B]: the tokens each row holds (a batch of one's: `length`).
    """

    desc: ModelDescription
    arena: Arena
    batch: int = 1
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))  # [B] int64
    kv: Buffers = field(default_factory=Buffers)  # {layer: (key, value)}
    conv: Buffers = field(default_factory=Buffers)
    gdn: Buffers = field(default_factory=Buffers)
    present: Buffers = field(default_factory=Buffers)
    io_cache: dict = field(default_factory=dict)  # target_io's fixed part by (graph, M, mode), and the carries
    stacks: dict = field(default_factory=dict)  # {kind: (one buffer [L, *shape], its layers)}: see stacked()
    stacked_layout: int = -1  # layout() when the stacks were made

    @property
    def length(self) -> int:
        """The tokens a batch of one holds (row 0's)."""
        return int(self.lengths[0])

    @length.setter
    def length(self, value: int) -> None:
        self.lengths[0] = value

    def layout(self) -> int:
        """Changes whenever a buffer is replaced."""
        return self.kv.version + self.conv.version + self.gdn.version + self.present.version

    @classmethod
    def allocate(cls, desc: ModelDescription, arena: Arena, batch: int = 1) -> TargetState:
        st = cls(desc, arena, batch=batch, lengths=np.zeros(batch, dtype=np.int64))
        for kv in desc.target.kv:
            shape = (batch, kv.heads, desc.capacity, kv.head_dim)
            st.kv[kv.layer] = (
                arena.reserve(f"state.{kv.past_key}", shape, kv.np_dtype),
                arena.reserve(f"state.{kv.past_value}", shape, kv.np_dtype),
            )
        for kind in ("conv", "recurrent"):  # each kind's states (and own presents) in one buffer when they match
            states = [s for s in desc.target.states if s.kind == kind]
            buffers = st.conv if kind == "conv" else st.gdn
            layers = tuple(s.layer for s in states)
            row_bytes = int(np.prod(st.shape(states[0]))) * states[0].np_dtype.itemsize if states else 0
            # rows keep the buffer's alignment (64 bytes, for kernels' vector loads) or the layers get buffers of their own
            if states and len({(s.shape, s.dtype) for s in states}) == 1 and row_bytes % 64 == 0:
                shape, dtype = (len(states), *st.shape(states[0])), states[0].np_dtype
                stack = st.stacks[kind] = (arena.reserve(f"state.{kind}-stack", shape, dtype), layers)
                for s, row in zip(states, stack[0]):
                    buffers[s.layer] = row
                if not any(s.in_place for s in states):
                    stack = st.stacks[f"{kind} present"] = (arena.reserve(f"state.{kind}-present-stack", shape, dtype),
                                                            layers)
                    for s, row in zip(states, stack[0]):
                        st.present[s.past] = row
            for s in states:
                if s.layer not in buffers:
                    buffers[s.layer] = arena.reserve(f"state.{s.past}", st.shape(s), s.np_dtype)
                if not s.in_place and s.past not in st.present:
                    st.present[s.past] = arena.reserve(f"state.{s.present}", st.shape(s), s.np_dtype)
        st.stacked_layout = st.layout()
        return st

    def shape(self, s: StateTensor) -> tuple[int, ...]:
        """A state's shape at this batch (the description gives it at batch 1)."""
        return (self.batch, *s.shape[1:])

    def stacked(self, kind: str, layers: tuple[int, ...]):
        """The buffer [L, *shape] whose rows are `layers`' buffers of this kind ("conv", "recurrent", or either's
        own presents: "conv present"), in this order, or None: they were not allocated so, or a buffer has been
        replaced since."""
        stack, held = self.stacks.get(kind, (None, ()))
        return stack if held == layers and self.layout() == self.stacked_layout else None

    def fixed(self, key, build, *args):
        """What `build(*args)` makes from the buffers, cached under key until a buffer is replaced."""
        layout = self.layout()
        if self.io_cache.get("layout") != layout:
            self.io_cache = {"layout": layout}
        value = self.io_cache.get(key)
        if value is None:
            value = self.io_cache[key] = build(*args)
        return value

    def reset(self) -> None:
        self.lengths[...] = 0
        for a in self.recurrent_arrays():
            a[...] = 0
        for k, v in self.kv.values():
            k[...] = 0
            v[...] = 0

    def array(self, s: StateTensor) -> np.ndarray:
        return (self.conv if s.kind == "conv" else self.gdn)[s.layer]

    def carry(self) -> None:
        """After an in-place forward: the states written to buffers of their own become the committed ones."""
        for committed, present in self.carries():
            committed[...] = present

    def carries(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """What carry() copies, (committed, present) pairs: valid until a buffer is replaced."""
        return self.fixed("carries", self._carries)

    def _carries(self) -> list[tuple[np.ndarray, np.ndarray]]:
        pairs = []
        for kind in ("conv", "recurrent"):
            carried = [s for s in self.desc.target.states if s.kind == kind and not s.in_place]
            layers = tuple(s.layer for s in carried)
            committed, present = self.stacked(kind, layers), self.stacked(f"{kind} present", layers)
            if carried and committed is not None and present is not None:  # every layer's carry in one copy
                pairs.append((committed, present))
            else:
                pairs += [(self.array(s), self.present[s.past]) for s in carried]
        return pairs

    def recurrent_arrays(self) -> list[np.ndarray]:
        return [self.array(s) for s in self.desc.target.states]

    def recurrent(self) -> dict[str, np.ndarray]:
        """The conv and recurrent states by name, conv_state.{i} / gdn_state.{i} (what the lossless check compares)."""
        return {s.key: self.array(s) for s in self.desc.target.states}

    def snapshot(self, copy: bool = True, row: int | None = None) -> dict[str, np.ndarray]:
        """The committed state on the host: conv and recurrent states, and every attention layer's KV rows
        [0, length) (rows past the length are scratch a rollback left behind). copy=False: host arrays are
        views (compare them at once, before the next forward). row: that batch row only, as a batch of 1."""
        take = (lambda a: np.array(to_numpy(a))) if copy else to_numpy
        rows, length = slice(None), self.length
        if row is not None:
            rows, length = slice(row, row + 1), int(self.lengths[row])
        out = {name: take(a[rows]) for name, a in self.recurrent().items()}
        for layer, (k, v) in self.kv.items():
            out[f"kv.{layer}.key"] = take(k[rows, :, :length])
            out[f"kv.{layer}.value"] = take(v[rows, :, :length])
        return out


def target_io(desc: ModelDescription, st: TargetState, tokens: np.ndarray, recurrent_in_place: bool = True):
    """(feeds, outputs, bound) for a forward of `tokens` ([M], or [B, M] at batch B) at the state's current
    length (each row's at batch > 1).

    Lengths are static-shaped, as onnxruntime-genai arranges them for graph replay: the attention
    span is always the KV capacity (total_sequence_length, or the attention_mask's width), and the
    real lengths travel in tensors the graph re-reads on every replay (seqlens_k, the mask's ones).

    KV is always in place (one buffer bound as past and present). A conv or recurrent state goes in
    place where its kernel allows it, else to a buffer of its own (copy it with carry() after the
    run), unless recurrent_in_place=False, when every present state goes to an output of its own
    and the committed state is left untouched.
    """
    io = desc.target
    M = int(tokens.shape[-1])
    length = checked_length(desc, st, M)
    feeds, outputs, bound = fixed_io(desc, st, M, recurrent_in_place)
    length_feeds(io, length, M, desc.capacity, feeds)
    return with_token_ids(feeds, io.input_ids, tokens, M, st.batch), outputs, bound


def checked_length(desc: ModelDescription, st: TargetState, M: int):
    """The state's length (each row's, an array, at batch > 1) for a forward of M more tokens; refused (ValueError)
    when its longest row would pass the KV capacity."""
    if st.batch == 1:
        length = longest = st.length
    else:
        length, longest = st.lengths, int(st.lengths.max())
    if longest + M > desc.capacity:
        raise beyond_capacity(longest + M, desc.capacity)
    return length


def fixed_io(desc: ModelDescription, st: TargetState, M: int, recurrent_in_place: bool = True) -> tuple[dict, Mapping, tuple]:
    """target_io's (feeds, outputs, bound) for M tokens in a mode, made once while the state's buffers stay: outputs,
    bindings and the feeds' arrays depend only on these. Whoever runs them rewrites the token ids and the length
    feeds in place first (target_io does)."""
    key = (desc.target.path, desc.target.counts, M, recurrent_in_place)
    outputs, bound, feeds = st.fixed(key, _fixed_io, desc, st, M, recurrent_in_place)
    return feeds, outputs, bound


def _fixed_io(desc: ModelDescription, st: TargetState, M: int, recurrent_in_place: bool) -> tuple[Mapping, tuple, dict]:
    io, B = desc.target, st.batch
    outputs: dict[str, tuple[tuple[int, ...], Any]] = {
        io.logits: ((B, M, desc.vocab_size), io.logits_type),
        io.hidden: ((B, M, desc.hidden_size), io.hidden_type),
        **greedy_output_shapes(B, M, io.counts),
    }
    bound: list[tuple[str, Any, bool]] = []
    for kv in io.kv:
        k, v = st.kv[kv.layer]
        bound += [(kv.past_key, k, False), (kv.present_key, k, True)]
        bound += [(kv.past_value, v, False), (kv.present_value, v, True)]
    for s in io.states:
        live = st.array(s)
        bound.append((s.past, live, False))
        if not recurrent_in_place:
            outputs[s.present] = (st.shape(s), s.np_dtype)
        else:
            bound.append((s.present, live if s.in_place else st.present[s.past], True))
    outputs.update(select_output_shapes(desc, M, B))
    feeds = {io.input_ids: np.zeros((B, M), dtype=np.int64),  # rewritten per forward
             **length_feeds(io, st.length if st.batch == 1 else st.lengths, M, desc.capacity)}
    # outputs and bound immutable: the executor's replay check may take them by identity
    return OutputSpec(outputs), tuple(bound), feeds


def greedy_output_shapes(batch: int, M: int, counts: bool) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The greedy choice every graph outputs (mtplab.model.greedy_outputs): its tokens [B, M], and where it counts
    (GraphIO.counts) its kept drafts [B]."""
    tokens = {TOKENS: ((batch, M), np.dtype(np.int64))}
    return tokens | {ACCEPTED: ((batch,), np.dtype(np.int64))} if counts else tokens


def select_output_shapes(desc: ModelDescription, M: int, batch: int = 1) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The extra outputs the `select` and `per-position` commits read, with their shapes for a forward of M tokens
    (batch rows)."""
    io = desc.target
    shapes = {o.name: ((batch, *o.sized(M)[1:]), o.np_dtype) for roles in io.select_outputs.values()
              for o in roles.values()}
    if io.position_states:
        states = {s.layer: s for s in io.states if s.kind == "recurrent"}
        for layer, name in io.position_states.items():
            s = states[layer]
            shapes[name] = ((positions(M), batch, *s.shape[1:]), s.np_dtype)
    return shapes


def token_ids(tokens: Any, M: int, batch: int = 1) -> Any:
    """input_ids [B, M] int64 from Python ints, or from a host or device array (which stays where it is)."""
    if hasattr(tokens, "reshape"):
        return tokens.reshape(batch, M).astype(np.int64, copy=False)
    return np.asarray(tokens, dtype=np.int64).reshape(batch, M)


def with_token_ids(feeds: dict, name: str, tokens: Any, M: int, batch: int) -> dict:
    """`feeds` holding a forward's token ids [batch, M] under `name`: host ids (a numpy array, an int, a list or
    tuple) written into that feed's own buffer in place (a wrong count is refused by the reshape); a device array
    fed as it is, in a new dict (the cached one keeps its host buffer)."""
    ids = feeds[name]
    if type(tokens) is np.ndarray and tokens.shape == ids.shape:
        ids[...] = tokens
    elif isinstance(tokens, (int, np.integer)) and ids.size == 1:
        ids[...] = tokens
    elif isinstance(tokens, (np.ndarray, list, tuple, int, np.integer)):
        ids[...] = np.reshape(tokens, (batch, M))
    else:
        return {**feeds, name: token_ids(tokens, M, batch)}
    return feeds


class MtpIO(NamedTuple):
    """mtp_io's part for one M that depends only on the KV buffers: built once, its token ids and length feeds
    rewritten in place per forward."""

    outputs: Mapping
    bound: tuple
    kv: tuple
    feeds: dict
    hidden_type: Any


@dataclass
class MtpState:
    """The MTP head's own KV cache (B rows) and the length it holds."""

    kv: tuple[np.ndarray, np.ndarray]
    length: int = 0
    io_cache: dict[int, MtpIO] = field(default_factory=dict)  # mtp_io's fixed part, by M
    batch: int = 1

    @classmethod
    def allocate(cls, desc: ModelDescription, arena: Arena, batch: int = 1) -> MtpState:
        (kv,) = desc.mtp.kv
        shape = (batch, kv.heads, desc.capacity, kv.head_dim)
        return cls((arena.reserve("state.mtp_key", shape, kv.np_dtype), arena.reserve("state.mtp_value", shape, kv.np_dtype)),
                   batch=batch)


def mtp_io(desc: ModelDescription, st: MtpState, tokens: Any, hidden: np.ndarray, position):
    """(feeds, outputs, bound) for an MTP-head forward: M tokens + the target's hidden states from `position`
    (at batch B: tokens [B, M], hidden [B, M, H], position an int array [B], each row's own).

    Entry j of the head's KV pairs token j+1 with the target's hidden state j.
    """
    io, B = desc.mtp, st.batch
    M = (len(tokens) if isinstance(tokens, (list, tuple)) else int(getattr(tokens, "size", 1))) // B
    fixed = st.io_cache.get(M)
    if fixed is None or fixed.kv is not st.kv:  # built once per M for these KV buffers
        outputs = {io.logits: ((B, M, desc.vocab_size), io.logits_type),
                   io.hidden: ((B, M, desc.hidden_size), io.hidden_type), **greedy_output_shapes(B, M, io.counts)}
        (kv,) = io.kv
        k, v = st.kv
        bound = ((kv.past_key, k, False), (kv.present_key, k, True), (kv.past_value, v, False),
                 (kv.present_value, v, True))
        feeds = {io.input_ids: np.zeros((B, M), dtype=np.int64), io.hidden_input: None,
                 **length_feeds(io, position, M, desc.capacity)}
        fixed = st.io_cache[M] = MtpIO(OutputSpec(outputs), bound, st.kv, feeds, desc.target.hidden_type)
    length_feeds(io, position, M, desc.capacity, fixed.feeds)
    feeds = with_token_ids(fixed.feeds, io.input_ids, tokens, M, B)
    feeds[io.hidden_input] = hidden.astype(fixed.hidden_type, copy=False).reshape(B, M, desc.hidden_size)
    return feeds, fixed.outputs, fixed.bound

