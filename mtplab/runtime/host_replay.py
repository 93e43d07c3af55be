"""select's state update on the host, compiled: GatedDeltaNet's transitions replayed and the conv carry rebuilt.

The same arithmetic as the CUDA kernel (mtplab.runtime.cuda.REPLAY_KERNEL) and numpy's token-by-token form
(mtplab.model.graph.replay_transitions_xp): per state element, S = S * decay_t + delta_t * key_t for t < n, the
multiply and the add rounded separately (no fast-math, so no FMA contraction): bitwise equal to both, for float32
and float64 states. numba has no float16 arithmetic: those (and inputs of another dtype than the state's) take
numpy's forms, as before (mtplab.model.graph.replay_transitions, rebuild_conv).

Why compiled (numba): a speculative step commits once, between two forwards, and on a small model the state is a
few thousand floats. numpy's closed form (replay_transitions_closed) is a dozen calls of microseconds each, and
inside a step, after an onnxruntime run has evicted the interpreter's working set, each costs two to four times its
isolated time: 50 us per commit on tiny at k=3, an eighth of the step. One compiled call per layer and kind costs
a few microseconds, and on the larger presets' states it is still faster than the closed form, hot: 6x at one
token, 2x at four, even at eight (benchmarks/select_update.py).

A commit on a batch-1 host state takes every layer in one call (SelectLayers): the per-layer calls' wrappers, checks
and argument typing cost more than the arithmetic on tiny, and inside a step each Python call is slower again.

Compiled once per machine and cached beside this module (numba's cache=True), or in the user's cache folder;
where neither can be written (a read-only install, no writable home), compiled once per process.
"""

from __future__ import annotations

import operator
from operator import is_

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from mtplab.model import graph
from mtplab.runtime import held_meta
from mtplab.runtime.jit import compiled


@compiled
def _replay(state, row, n, C, Hv, Hk, Dk, Dv):  # pragma: no cover - compiled
    rep = Hv // Hk
    keys, deltas = C * Hv, C * (Hv + Hk * Dk)
    for t in range(n):
        for h in range(Hv):
            decay = row[t * Hv + h]
            k0 = keys + (t * Hk + h // rep) * Dk
            key = row[k0 : k0 + Dk]
            for v in range(Dv):
                delta = row[deltas + (t * Hv + h) * Dv + v]
                s0 = (h * Dv + v) * Dk
                line = state[s0 : s0 + Dk]  # through slices the loop below vectorizes (indexed, it ran 4x slower)
                for j in range(Dk):
                    line[j] = line[j] * decay + delta * key[j]


@compiled
def _rebuild(conv, conv_input, n):  # pragma: no cover - compiled
    width = conv.shape[1]
    for b in range(conv.shape[0]):
        if n >= width:
            conv[b, :, :] = conv_input[b, n - width : n, :]
        elif n > 0:
            for r in range(width - n):  # forward: row r + n is read before it is written
                conv[b, r, :] = conv[b, r + n, :]
            conv[b, width - n :, :] = conv_input[b, :n, :]


@intrinsic
def _memory(typingctx, address):
    """An address (int64) as a void pointer, for numba.carray."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))

    return types.voidptr(address), codegen


@compiled
def _replay_layers(layers, n, C, Hv, Hk, Dk, Dv, dtype):  # pragma: no cover - compiled
    """Each row of layers: (state, transitions row, conv carry, conv inputs: their data addresses; carry rows,
    channels, input tokens, channels first), one batch row: _replay then _rebuild on views of that memory."""
    width = Hv + Hk * Dk + Hv * Dv
    for r in range(layers.shape[0]):
        state = numba.carray(_memory(layers[r, 0]), (Hv * Dv * Dk,), dtype)
        _replay(state, numba.carray(_memory(layers[r, 1]), (C * width,), dtype), n, C, Hv, Hk, Dk, Dv)
        W, channels, M = layers[r, 4], layers[r, 5], layers[r, 6]
        if layers[r, 7]:
            conv = numba.carray(_memory(layers[r, 2]), (1, channels, W), dtype)
            inputs = numba.carray(_memory(layers[r, 3]), (1, channels, M), dtype)
            _rebuild(conv.transpose(0, 2, 1), inputs.transpose(0, 2, 1), n)
        else:
            conv = numba.carray(_memory(layers[r, 2]), (1, W, channels), dtype)
            inputs = numba.carray(_memory(layers[r, 3]), (1, M, channels), dtype)
            _rebuild(conv, inputs, n)


COMPILED = (np.dtype(np.float32), np.dtype(np.float64))  # numba has no float16 arithmetic: numpy's forms run those


def replay_state(layout, state: np.ndarray, flat: np.ndarray, n: int) -> None:
    """Advance a GatedDeltaNet state [1, Hv, Dv, Dk] (V-major, C-contiguous) in place by the first n of its
    transitions row [1, C*width] (a TransitionLayout). The compiled loop indexes raw memory: sizes and n are checked
    first, as numpy's forms would refuse them."""
    if state.dtype not in COMPILED or flat.dtype != state.dtype:
        return graph.replay_transitions(layout, state, flat, n)
    C, Hv, Hk, Dk, Dv = layout.capacity, layout.value_heads, layout.key_heads, layout.key_dim, layout.value_dim
    if state.size != Hv * Dv * Dk or flat.size != C * layout.width or not 0 <= n <= C:
        raise ValueError(f"select's replay takes one state of {Hv}x{Dv}x{Dk}, its row of {C}x{layout.width} transitions "
                         f"and n in 0..{C}: got a state {list(state.shape)}, a row {list(flat.shape)} and n={n}")
    if not state.flags.c_contiguous:
        raise ValueError(f"a GatedDeltaNet state must be C-contiguous to be replayed in place, got strides {state.strides}")
    _replay(state.reshape(-1), flat.reshape(-1), n, C, Hv, Hk, Dk, Dv)


def rebuild_conv(conv_state: np.ndarray, conv_input: np.ndarray, n: int, channels_first: bool = False) -> None:
    """mtplab.model.graph.rebuild_conv compiled: the conv carry [B, k-1, C] set in place to its value after the
    first n of conv_input [B, M, C] ([B, C, k-1] and [B, C, M] when channels_first)."""
    if conv_state.dtype not in COMPILED or conv_input.dtype != conv_state.dtype:
        return graph.rebuild_conv(conv_state, conv_input, n, channels_first)
    if channels_first:
        conv_state, conv_input = conv_state.transpose(0, 2, 1), conv_input.transpose(0, 2, 1)
    if not 0 <= n <= conv_input.shape[1] or conv_input.shape[0] != conv_state.shape[0] or (
            conv_input.shape[2] != conv_state.shape[2]):
        raise ValueError(f"a conv carry rebuild takes n in 0..{conv_input.shape[1]} and inputs of its rows and channels: "
                         f"got n={n}, a carry {list(conv_state.shape)} and inputs {list(conv_input.shape)}")
    _rebuild(conv_state, conv_input, n)


class SelectLayers:
    """select's update of every layer of a batch-1 host state in one compiled call: replay_state and rebuild_conv
    for each layer, in order, the same arithmetic. Made for the arrays of one commit (the states and the verify's
    outputs) and taken while the next commits bring the very same arrays with the dtype, shape, contiguity and
    writeability they had, and their memory where it was (mtplab.runtime.held_meta's compiled reads: an array
    reshaped or given new memory in place is caught, and read again). A call answers whether it made the update;
    False, with nothing written: the caller updates layer by layer.

    layers: (layer, transitions output name, conv input output name, channels first) of each GatedDeltaNet layer."""

    def __init__(self, layout, layers: list[tuple[int, str, str, bool]]):
        self.layout, self.layers = layout, layers
        self.sizes = (layout.capacity, layout.value_heads, layout.key_heads, layout.key_dim, layout.value_dim)
        self.ids = [layer for layer, *_ in layers]
        self.states = _getter(self.ids)  # a tuple from a state's buffers by layer
        self.outputs = _getter([name for _, t, c, _ in layers for name in (t, c)])
        self.held: tuple = ()  # the arrays it was made for: the states, the carries, then the outputs by layer
        # where the compiled call takes them: their held_meta snapshot, data addresses and rows (else table None)
        self.table = self.data = self.rows = self.dtype = None
        self.most = -1  # the largest count those arrays take

    def __call__(self, st, ver: dict, n: int) -> bool:
        arrays = self.states(st.gdn) + self.states(st.conv) + self.outputs(ver)
        if len(arrays) != len(self.held) or not all(map(is_, arrays, self.held)):
            self._make(arrays)
        if self.table is None:  # arrays it does not take: refused at once until others come
            return False
        if not held_meta.in_place(self.table, self.data):  # changed in place since they were read: read them again
            self._make(arrays)
            if self.table is None or not held_meta.in_place(self.table, self.data):
                return False
        if not 0 <= n <= self.most:
            return False
        _replay_layers(self.rows, n, *self.sizes, self.dtype)
        return True

    def _make(self, arrays: tuple) -> None:
        """Holds these arrays, and where the compiled call takes them (plain numpy arrays of one float dtype,
        C-contiguous and writeable, batch 1, of the sizes the layout gives) their snapshot, addresses and rows."""
        self.held, self.table, self.most = arrays, None, -1
        L, lay, dtype = len(self.ids), self.layout, arrays[0].dtype
        if dtype not in COMPILED or not all(type(a) is np.ndarray and a.dtype == dtype and a.flags.c_contiguous
                                            and a.flags.writeable for a in arrays):
            return
        rows, most = [], lay.capacity
        for r, (*_, first) in enumerate(self.layers):
            state, carry, row, inputs = arrays[r], arrays[L + r], arrays[2 * L + 2 * r], arrays[2 * L + 2 * r + 1]
            rows.append([a.ctypes.data for a in (state, row, carry, inputs)])
            if first:
                carry, inputs = carry.transpose(0, 2, 1), inputs.transpose(0, 2, 1)
            if (state.size != lay.value_heads * lay.value_dim * lay.key_dim or row.size != lay.capacity * lay.width
                    or carry.ndim != 3 or inputs.ndim != 3 or carry.shape[0] != 1 or inputs.shape[0] != 1
                    or carry.shape[2] != inputs.shape[2]):
                return
            most = min(most, inputs.shape[1])
            rows[-1] += [carry.shape[1], carry.shape[2], inputs.shape[1], int(first)]
        table = held_meta.snapshot(list(arrays))
        if table is not None:
            self.table, self.most, self.dtype = table, most, dtype
            self.data = np.array([a.ctypes.data for a in arrays], dtype=np.int64)  # the addresses the rows hold
            self.rows = np.array(rows, dtype=np.int64)


def _getter(keys: list):
    """get(mapping): the values at keys, always a tuple (operator.itemgetter's one C call; one key gives a tuple too)."""
    if len(keys) == 1:
        key = keys[0]
        return lambda mapping: (mapping[key],)
    return operator.itemgetter(*keys)
