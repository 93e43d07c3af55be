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

Compiled once per machine and cached beside this module (numba's cache=True), or in the user's cache folder;
where neither can be written (a read-only install, no writable home), compiled once per process.
"""

from __future__ import annotations

import numba
import numpy as np

from mtplab.model import graph


def _compiled(fn):
    """fn compiled, its machine code cached on disk where numba finds a writable place, else per process."""
    try:
        return numba.njit(cache=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(fn)


@_compiled
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


@_compiled
def _rebuild(conv, conv_input, n):  # pragma: no cover - compiled
    width = conv.shape[1]
    for b in range(conv.shape[0]):
        if n >= width:
            conv[b, :, :] = conv_input[b, n - width : n, :]
        elif n > 0:
            for r in range(width - n):  # forward: row r + n is read before it is written
                conv[b, r, :] = conv[b, r + n, :]
            conv[b, width - n :, :] = conv_input[b, :n, :]


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
